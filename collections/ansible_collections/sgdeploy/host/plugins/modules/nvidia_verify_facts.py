#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
"""What the NVIDIA verification judges: module flavour, loaded driver, GPUs, nvcc. Read-only."""

from __future__ import annotations

# Ansible module layout: the documentation strings come before the imports (ansible-test validate-modules).
# ruff: noqa: E402

DOCUMENTATION = r"""
module: nvidia_verify_facts
short_description: Read the NVIDIA module flavour, loaded driver, GPUs and nvcc release
description:
  - Runs C(modinfo -F license nvidia), C(modinfo -F version nvidia),
    C(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) and C(<cuda_home>/bin/nvcc --version),
    and reads the loaded module's version file. Changes nothing.
options:
  loaded_version_file:
    description: File holding the loaded module's version.
    type: path
    default: /sys/module/nvidia/version
  pending_marker:
    description: Marker of a reboot deferred by nvidia_driver.
    type: path
    default: /run/nvidia-driver-reboot-pending
  cuda_home:
    description: CUDA toolkit directory.
    type: path
    required: true
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
  - sgdeploy.host.attributes.read_only
"""

EXAMPLES = r"""
- name: Read the module flavour, the loaded driver, the GPUs and nvcc
  sgdeploy.host.nvidia_verify_facts:
    loaded_version_file: /sys/module/nvidia/version
    pending_marker: /run/nvidia-driver-reboot-pending
    cuda_home: /usr/local/cuda-13.0
  register: verify

- name: Check the kernel module is the open flavour
  ansible.builtin.assert:
    that: verify.module_license == 'Dual MIT/GPL'
"""

RETURN = r"""
module_license: {description: license of the installed nvidia module, type: str, returned: always}
module_version: {description: version of the installed nvidia module, type: str, returned: always}
loaded_version: {description: version of the loaded module ("" when none), type: str, returned: always}
reboot_pending: {description: a deferred reboot is recorded and the loaded module differs, type: bool, returned: always}
smi_rc: {description: nvidia-smi exit status (-1 when not installed), type: int, returned: always}
smi_output: {description: nvidia-smi output, type: str, returned: always}
gpu_names: {description: one name per GPU nvidia-smi lists, type: list, returned: always}
driver_versions: {description: driver version per GPU, type: list, returned: always}
nvcc_output: {description: nvcc --version output, type: str, returned: always}
nvcc_release: {description: '"MAJOR.MINOR" from nvcc ("" when not found)', type: str, returned: always}
"""


import os
import re

from ansible.module_utils.basic import AnsibleModule

NVCC_RELEASE = re.compile(r"release (\d+\.\d+)")


def main():
    module = AnsibleModule(
        argument_spec={
            "loaded_version_file": {"type": "path", "default": "/sys/module/nvidia/version"},
            "pending_marker": {"type": "path", "default": "/run/nvidia-driver-reboot-pending"},
            "cuda_home": {"type": "path", "required": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    modinfo = module.get_bin_path("modinfo", required=True, opt_dirs=["/usr/sbin", "/sbin"])
    facts = {}
    for field in ("license", "version"):
        rc, out, _err = module.run_command([modinfo, "-F", field, "nvidia"])
        facts[f"module_{field}"] = out.strip() if rc == 0 else ""
    try:
        with open(p["loaded_version_file"], encoding="utf-8") as fh:
            loaded = fh.read().strip()
    except FileNotFoundError:
        loaded = ""
    facts["loaded_version"] = loaded
    facts["reboot_pending"] = os.path.exists(p["pending_marker"]) and loaded != facts["module_version"]

    smi = module.get_bin_path("nvidia-smi")
    names, versions = [], []
    if smi:
        rc, out, err = module.run_command([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"])
        output = (out + err).strip()
        if rc == 0:
            for line in out.splitlines():
                if line.strip():
                    name, _sep, version = line.rpartition(",")
                    names.append(name.strip())
                    versions.append(version.strip())
    else:
        rc, output = -1, "nvidia-smi not found on PATH"
    facts.update(smi_rc=rc, smi_output=output, gpu_names=names, driver_versions=versions)

    nvcc = os.path.join(p["cuda_home"], "bin", "nvcc")
    if os.path.exists(nvcc):
        rc, out, err = module.run_command([nvcc, "--version"])
        output = (out + err).strip()
        match = NVCC_RELEASE.search(out) if rc == 0 else None
        facts.update(nvcc_output=output, nvcc_release=match.group(1) if match else "")
    else:
        facts.update(nvcc_output=f"{nvcc} does not exist", nvcc_release="")
    module.exit_json(changed=False, **facts)


if __name__ == "__main__":
    main()
