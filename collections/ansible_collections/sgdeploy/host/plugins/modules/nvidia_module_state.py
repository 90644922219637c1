#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
"""The NVIDIA kernel module installed for the running kernel versus the one loaded; read-only."""

from __future__ import annotations

# Ansible module layout: the documentation strings come before the imports (ansible-test validate-modules).
# ruff: noqa: E402

DOCUMENTATION = r"""
module: nvidia_module_state
short_description: Compare the installed NVIDIA kernel module with the loaded one
description:
  - Reads C(modinfo -F version nvidia) and C(modinfo -F license nvidia) for the running kernel,
    the loaded module's version file (C(/sys/module/nvidia/version) on real hosts) and whether a
    deferred reboot is recorded in the marker file. Changes nothing.
options:
  loaded_version_file:
    description: File holding the loaded module's version.
    type: path
    default: /sys/module/nvidia/version
  pending_marker:
    description: File that records a reboot deferred by an earlier run.
    type: path
    default: /run/nvidia-driver-reboot-pending
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
  - sgdeploy.host.attributes.read_only
"""

EXAMPLES = r"""
- name: Read the installed and the loaded kernel module
  sgdeploy.host.nvidia_module_state:
    loaded_version_file: /sys/module/nvidia/version
    pending_marker: /run/nvidia-driver-reboot-pending
  register: driver_module

- name: Check a kernel module was built for the running kernel
  ansible.builtin.assert:
    that: driver_module.installed_version | length > 0
"""

RETURN = r"""
installed_version:
  description: version of the nvidia module installed for the running kernel ("" when none)
  type: str
  returned: always
installed_license: {description: its license ("Dual MIT/GPL" for the open flavour), type: str, returned: always}
loaded_version: {description: version of the loaded module ("" when none is loaded), type: str, returned: always}
differs: {description: installed and loaded versions differ, type: bool, returned: always}
pending: {description: the marker of a deferred reboot exists, type: bool, returned: always}
"""


import os

from ansible.module_utils.basic import AnsibleModule


def modinfo(module, field):
    binary = module.get_bin_path("modinfo", required=True, opt_dirs=["/usr/sbin", "/sbin"])
    rc, out, _err = module.run_command([binary, "-F", field, "nvidia"])
    return out.strip() if rc == 0 else ""


def main():
    module = AnsibleModule(
        argument_spec={
            "loaded_version_file": {"type": "path", "default": "/sys/module/nvidia/version"},
            "pending_marker": {"type": "path", "default": "/run/nvidia-driver-reboot-pending"},
        },
        supports_check_mode=True,
    )
    try:
        with open(module.params["loaded_version_file"], encoding="utf-8") as fh:
            loaded = fh.read().strip()
    except FileNotFoundError:
        loaded = ""
    except OSError as exc:
        module.fail_json(msg=f"cannot read {module.params['loaded_version_file']}: {exc}")
    installed = modinfo(module, "version")
    module.exit_json(
        changed=False,
        installed_version=installed,
        installed_license=modinfo(module, "license"),
        loaded_version=loaded,
        differs=installed != loaded,
        pending=os.path.exists(module.params["pending_marker"]),
    )


if __name__ == "__main__":
    main()
