#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
"""Read-only facts the NVIDIA preflight judges; changes nothing on the host."""

from __future__ import annotations

# Ansible module layout: the documentation strings come before the imports (ansible-test validate-modules).
# ruff: noqa: E402

DOCUMENTATION = r"""
module: nvidia_preflight_facts
short_description: Gather what the NVIDIA provisioning preflight checks, changing nothing
description:
  - Reads /etc/os-release, C(mokutil --sb-state) (and C(mokutil --test-key) for the module
    signing key), C(lspci -nn -d 10de:) (GPUs and NVSwitch chips) and the free space of a path.
options:
  os_release:
    description: Path of the os-release file.
    type: path
    default: /etc/os-release
  mok_key:
    description: Public key DKMS signs modules with; checked for enrolment when Secure Boot is on.
    type: path
    default: /var/lib/dkms/mok.pub
  disk_path:
    description: Path whose file system must hold the driver, CUDA and the models.
    type: path
    default: /
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
  - sgdeploy.host.attributes.read_only
"""

EXAMPLES = r"""
- name: Read the host's distribution, Secure Boot state, PCI devices and free disk
  sgdeploy.host.nvidia_preflight_facts:
    mok_key: /var/lib/dkms/mok.pub
    disk_path: /var/lib/sglang
  register: preflight

- name: Check the distribution is supported
  ansible.builtin.assert:
    that: preflight.distribution in ['ubuntu:22.04', 'ubuntu:24.04']
"""

RETURN = r"""
os_id: {description: ID from os-release, type: str, returned: always}
os_version_id: {description: VERSION_ID from os-release, type: str, returned: always}
distribution: {description: "ID:VERSION_ID", type: str, returned: always}
secure_boot: {description: "enabled, disabled, no-efi or unknown", type: str, returned: always}
secure_boot_output: {description: what was read, type: str, returned: always}
mok_key_enrolled:
  description: the DKMS key is enrolled (only meaningful when Secure Boot is on)
  type: bool
  returned: always
lspci_found: {description: lspci exists, type: bool, returned: always}
gpus: {description: "NVIDIA display-class PCI functions: slot, pci_id, description", type: list, returned: always}
gpu_count: {description: number of gpus, type: int, returned: always}
nvswitches:
  description: "NVIDIA NVSwitch chips on the PCI bus (class 0680): slot, pci_id, description; empty on PCIe-card hosts"
  type: list
  returned: always
nvswitch_count: {description: number of nvswitches, type: int, returned: always}
free_gb: {description: free space under disk_path in GB (10^9 bytes), type: float, returned: always}
"""


import os
import shutil
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sgdeploy.host.plugins.module_utils import nvidia_pci

EFI_SB_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"


def read_os_release(path):
    values = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if "=" in line and not line.startswith("#"):
                key, value = line.split("=", 1)
                values[key] = value.strip().strip("'\"")
    return values


def run(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def secure_boot_state(mok_key):
    if shutil.which("mokutil"):
        _rc, out = run(["mokutil", "--sb-state"])
        if "SecureBoot enabled" in out:
            state = "enabled"
        elif "SecureBoot disabled" in out:
            state = "disabled"
        elif "not supported" in out:
            state = "no-efi"
        else:
            state = "unknown"
        enrolled = False
        if state == "enabled" and os.path.exists(mok_key):
            _rc, key_out = run(["mokutil", "--test-key", mok_key])
            enrolled = "is already enrolled" in key_out
        return state, "mokutil --sb-state: " + out, enrolled
    if not os.path.isdir("/sys/firmware/efi"):
        return "no-efi", "no /sys/firmware/efi (legacy BIOS boot)", False
    try:
        with open(EFI_SB_VAR, "rb") as fh:
            data = fh.read()
        state = "enabled" if data[-1:] == b"\x01" else "disabled"
        return state, f"{EFI_SB_VAR} (mokutil not installed)", False
    except OSError as exc:
        return "unknown", f"mokutil not installed and {EFI_SB_VAR} unreadable: {exc}", False


def main():
    module = AnsibleModule(
        argument_spec={
            "os_release": {"type": "path", "default": "/etc/os-release"},
            "mok_key": {"type": "path", "default": "/var/lib/dkms/mok.pub"},
            "disk_path": {"type": "path", "default": "/"},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        osr = read_os_release(p["os_release"])
    except OSError as exc:
        module.fail_json(msg=f"cannot read {p['os_release']}: {exc}")
    sb_state, sb_out, enrolled = secure_boot_state(p["mok_key"])
    lspci_found, functions = nvidia_pci.read()
    gpus, switches = nvidia_pci.gpus(functions), nvidia_pci.nvswitches(functions)
    stat = os.statvfs(p["disk_path"])
    os_id = osr.get("ID", "")
    version_id = osr.get("VERSION_ID", "")
    module.exit_json(
        changed=False,
        os_id=os_id,
        os_version_id=version_id,
        distribution=f"{os_id}:{version_id}",
        secure_boot=sb_state,
        secure_boot_output=sb_out,
        mok_key_enrolled=enrolled,
        lspci_found=lspci_found,
        gpus=gpus,
        gpu_count=len(gpus),
        nvswitches=switches,
        nvswitch_count=len(switches),
        free_gb=round(stat.f_bavail * stat.f_frsize / 1e9, 1),
    )


if __name__ == "__main__":
    main()
