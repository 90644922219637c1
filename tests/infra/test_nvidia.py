"""testinfra: NVIDIA driver and CUDA as provisioned by playbooks/provision.yml.

    pytest tests/infra/test_nvidia.py --hosts=ansible://gpu_hosts --ansible-inventory=INVENTORY

Runs against real hosts and the lab alike: the expected values come from each host's inventory
variables (gpu_count, nvidia_driver_branch, cuda_toolkit_version, nvidia_driver_module_version_file),
falling back to the roles' defaults.
"""

from __future__ import annotations

import pytest

DEFAULT_BRANCH = 580
DEFAULT_CUDA = "13.0"


@pytest.fixture
def hostvars(host):
    return host.ansible.get_variables()


@pytest.fixture
def branch(hostvars):
    return int(hostvars.get("nvidia_driver_branch", DEFAULT_BRANCH))


@pytest.fixture
def cuda(hostvars):
    return str(hostvars.get("cuda_toolkit_version", DEFAULT_CUDA))


def test_driver_and_cuda_packages_installed_and_held(host, branch, cuda):
    for name in (f"nvidia-open-{branch}", f"cuda-toolkit-{cuda.replace('.', '-')}"):
        status = host.run(f"dpkg-query -W -f '${{Status}}' {name}")
        assert status.rc == 0 and status.stdout.endswith(" installed"), f"{name}: {status.stdout or status.stderr}"
        assert status.stdout.startswith("hold "), f"{name} is not held: {status.stdout}"


def nvswitch_system(host, hostvars) -> tuple[bool, str]:
    """Whether the host is an NVSwitch system, as the driver role decides it (nvidia_driver_nvswitch: auto
    reads lspci: NVIDIA functions of class 0680 are NVSwitch chips)."""
    setting = str(hostvars.get("nvidia_driver_nvswitch", "auto")).lower()
    if setting != "auto":
        return setting in ("true", "yes", "1", "on"), f"nvidia_driver_nvswitch={setting}"
    listing = host.run("lspci -nn -d 10de:").stdout
    chips = [line for line in listing.splitlines() if "[0680]" in line]
    return bool(chips), f"lspci lists {len(chips)} NVSwitch chip(s)"


def test_fabric_manager_runs_on_nvswitch_systems_and_is_absent_on_pcie_cards(host, hostvars, branch):
    has_switch, why = nvswitch_system(host, hostvars)
    package = host.package(f"nvidia-fabricmanager-{branch}")
    if not has_switch:
        assert not package.is_installed, (
            f"fabric manager {package.version} installed on a host without NVSwitch ({why})")
        return
    assert package.is_installed, f"fabric manager not installed on an NVSwitch system ({why})"
    service = host.service("nvidia-fabricmanager")
    assert service.is_enabled and service.is_running, f"nvidia-fabricmanager not enabled and running ({why})"
    version_file = hostvars.get("nvidia_driver_module_version_file", "/sys/module/nvidia/version")
    loaded = host.file(version_file).content_string.strip()
    assert package.version.startswith(loaded), f"fabric manager {package.version}, loaded driver {loaded!r}"


def test_unattended_upgrades_leave_nvidia_alone(host):
    conf = host.run("apt-config dump Unattended-Upgrade::Package-Blacklist").stdout
    for pattern in ("nvidia-.*", "libnvidia-.*", "cuda-.*"):
        assert f'"{pattern}"' in conf, f"{pattern} missing from Unattended-Upgrade::Package-Blacklist:\n{conf}"


def test_nouveau_blacklisted(host):
    config = host.run("modprobe --showconfig").stdout
    assert "blacklist nouveau" in config.splitlines()


def test_persistenced_enabled_and_running(host):
    service = host.service("nvidia-persistenced")
    assert service.is_enabled
    assert service.is_running


def test_open_kernel_module(host):
    license_ = host.run("modinfo -F license nvidia")
    assert license_.rc == 0, license_.stderr
    assert license_.stdout.strip() == "Dual MIT/GPL", f"module flavour: license {license_.stdout.strip()!r}"


def test_loaded_module_is_installed_one(host, hostvars, branch):
    version_file = hostvars.get("nvidia_driver_module_version_file", "/sys/module/nvidia/version")
    loaded = host.file(version_file).content_string.strip()
    installed = host.run("modinfo -F version nvidia").stdout.strip()
    assert loaded == installed, f"loaded {loaded!r}, installed {installed!r}: reboot pending?"
    assert loaded.split(".")[0] == str(branch)


def test_gpu_count_and_driver_branch(host, hostvars, branch):
    smi = host.run("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader")
    assert smi.rc == 0, smi.stdout + smi.stderr
    rows = [line.rsplit(",", 1) for line in smi.stdout.splitlines() if line.strip()]
    expected = int(hostvars["gpu_count"])
    assert len(rows) == expected, f"nvidia-smi lists {len(rows)} GPUs, gpu_count {expected}"
    assert {v.strip().split(".")[0] for _n, v in rows} == {str(branch)}


def test_nvcc_is_pinned_release(host, hostvars, cuda):
    home = hostvars.get("cuda_toolkit_home", f"/usr/local/cuda-{cuda}")
    nvcc = host.run(f"{home}/bin/nvcc --version")
    assert nvcc.rc == 0, nvcc.stderr
    assert f"release {cuda}," in nvcc.stdout, nvcc.stdout
