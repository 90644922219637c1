"""Issue 6: driver and CUDA provisioning (playbooks/provision.yml) against the lab hosts.

What is real here: ansible-playbook over SSH, the roles, apt (a file: repository), the apt pin,
dpkg holds, systemd, the reboot (the lab restarts nspawn), kmod's modinfo/depmod. What stands in:
the packages' contents (tests/lab/standin/pkgs), lspci/mokutil (tests/lab/standin/hw) and
/etc/lab-gpu.conf, which those read. See docs/provisioning.md.

The module resets its hosts to "fresh" first (driver and CUDA packages purged, the loaded-module
stand-in cleared), so it does not depend on what ran before it; it leaves them provisioned.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import standin_apt  # noqa: E402

pytestmark = pytest.mark.lab

PLAYBOOK = "playbooks/provision.yml"
# What the lab inventory sets for these roles (lab.py writes them; passed with -e as well, so
# that this module states what it relies on). The apt part is filled in by the `plab` fixture:
# the stand-in repository and the fingerprint of the lab's signing key.
LAB_VARS = {
    "nvidia_driver_module_version_file": "/run/lab-nvidia/module-version",
}
HELD = ["nvidia-open-580", "nvidia-dkms-580-open", "nvidia-utils-580", "libnvidia-compute-580",
        "nvidia-compute-utils-580", "cuda-toolkit-13-0", "cuda-nvcc-13-0"]
RESET = r"""
set -e
pkgs=$(dpkg-query -W -f '${Package}\n' 'nvidia-*' 'libnvidia-*' 'cuda-*' 'linux-headers-*' 2>/dev/null || true)
if [ -n "$pkgs" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -q --allow-change-held-packages $pkgs >/dev/null
fi
rm -f /etc/apt/sources.list.d/nvidia-cuda-mirror.list /etc/apt/sources.list.d/nvidia-cuda.list \
      /etc/apt/keyrings/nvidia-cuda.asc /etc/apt/preferences.d/nvidia-driver-branch.pref \
      /etc/modprobe.d/blacklist-nouveau.conf /etc/apt/apt.conf.d/51nvidia-unattended-upgrades-blacklist \
      /etc/profile.d/cuda-toolkit.sh /run/nvidia-driver-reboot-pending
rm -rf /run/lab-nvidia /var/lib/apt/lists/_srv_lab-apt_* /lib/modules/$(uname -r)/updates/dkms
[ -L /etc/os-release ] || ln -sf ../usr/lib/os-release /etc/os-release
"""


def set_conf(lab, host: str, **values: str) -> None:
    """Rewrite keys of /etc/lab-gpu.conf (what the stand-in hardware reports)."""
    script = "; ".join(
        f"sed -i '/^{key}=/d' /etc/lab-gpu.conf; echo '{key}={value}' >> /etc/lab-gpu.conf"
        for key, value in values.items()
    )
    lab.ssh(host, script)


def restore_conf(lab, host: str) -> None:
    set_conf(lab, host, GPU_COUNT="8", MODULE_FLAVOUR="open", SECURE_BOOT="off", NVSWITCH_COUNT="0")
    lab.ssh(host, "sed -i '/^DRIVER_GPU_COUNT=/d' /etc/lab-gpu.conf")


def provision(lab, *args: str, **extra):
    return lab.ansible_playbook(PLAYBOOK, *args, extra_vars={**LAB_VARS, **extra}, check=False)


def recap(proc) -> dict[str, dict[str, int]]:
    result = {}
    for name, counts in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", proc.stdout, re.M):
        result[name] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", counts)}
    return result


def output(proc) -> str:
    return proc.stdout + proc.stderr


def installed(lab, host: str, package: str) -> bool:
    proc = lab.ssh(host, f"dpkg-query -W -f '${{Status}}' {package}", check=False)
    return proc.returncode == 0 and proc.stdout.endswith(" installed")


def boot_id(lab, host: str) -> str:
    return lab.ssh(host, "cat /proc/sys/kernel/random/boot_id").stdout.strip()


@pytest.fixture(scope="module")
def plab(lab):
    """The lab with the stand-in repository built and every host reset to fresh."""
    if not (REPO / "ansible.cfg").exists():
        lab.env.setdefault("ANSIBLE_COLLECTIONS_PATH", str(REPO / "collections"))
    standin_apt.build(lab.config.apt_dir)
    LAB_VARS.update(standin_apt.role_vars(standin_apt.fingerprint_of(lab.config.apt_dir)))
    for host in lab.hosts:
        lab.ssh(host, RESET, timeout=300)
        restore_conf(lab, host)
    yield lab
    for host in lab.hosts:
        restore_conf(lab, host)


def assert_nothing_installed(lab) -> None:
    for host in lab.hosts:
        assert not installed(lab, host, "nvidia-open-580"), f"{host}: driver installed despite preflight failure"
        assert not installed(lab, host, "cuda-toolkit-13-0"), f"{host}: CUDA installed despite preflight failure"
        files = lab.ssh(host, "ls /etc/apt/sources.list.d/ /etc/modprobe.d/").stdout
        assert "nvidia-cuda-mirror.list" not in files and "blacklist-nouveau.conf" not in files, (
            f"{host}: preflight failure left changes: {files}")


PREFLIGHT_CASES = {
    "secure-boot": (
        {"SECURE_BOOT": "on"}, None, {},
        ["Secure Boot is enabled", "SecureBoot enabled", "not enrolled", "mokutil --import"],
    ),
    "fewer-pci-gpus": (
        {"GPU_COUNT": "4"}, None, {},
        ["'lspci -nn -d 10de:' shows 4 NVIDIA GPU(s)", "gpu_count is 8", "10de:2bb5"],
    ),
    "unsupported-distribution": (
        {}, 'ID=debian\nVERSION_ID="11"\nPRETTY_NAME="Debian GNU/Linux 11 (bullseye)"\n', {},
        ["Unsupported distribution", "ID=debian VERSION_ID=11", "ubuntu:22.04, ubuntu:24.04, debian:12"],
    ),
    "too-little-disk": (
        {}, None, {"nvidia_preflight_required_disk_gb": 1000000},
        ["GB free; needed 1000020.0 GB", "nvidia_preflight_required_disk_gb"],
    ),
    "cuda-too-old": (
        {}, None, {"cuda_toolkit_version": "12.6"},
        ["CUDA 12.6", "CUDA 12.8 or later", "compute_120"],
    ),
}


@pytest.mark.parametrize("case", list(PREFLIGHT_CASES))
def test_preflight_fails_before_any_change(plab, case):
    """A bad host state on lab2 stops the whole run in the preflight: no host changes at all."""
    conf, os_release, extra, expected = PREFLIGHT_CASES[case]
    try:
        if conf:
            set_conf(plab, "lab2", **conf)
        if os_release:
            # The preflight reads /etc/os-release itself; give lab2 another distribution's.
            plab.ssh("lab2", "rm /etc/os-release && cat > /etc/os-release", input=os_release)
        proc = provision(plab, **extra)
    finally:
        restore_conf(plab, "lab2")
        plab.ssh("lab2", "[ -L /etc/os-release ] || ln -sf ../usr/lib/os-release /etc/os-release")
    text = output(proc)
    assert proc.returncode != 0, f"{case}: the run passed:\n{text[-3000:]}"
    for needle in expected:
        assert needle in text, f"{case}: {needle!r} missing from the failure:\n{text[-3000:]}"
    assert "Install the driver and CUDA, one host at a time" not in text, "the install play started"
    assert_nothing_installed(plab)


def test_wrong_key_fingerprint_is_refused_before_any_change(plab):
    """The repository's key does not have the pinned fingerprint (a swapped key, or a wrong pin):
    the run stops in nvidia_apt_repo, naming both fingerprints, and no host has a changed file."""
    right = LAB_VARS["nvidia_apt_repo_key_fingerprint"]
    wrong = "EB693B3035CD5710E231E123A4B469963BF863CC"  # NVIDIA's: not the key the lab signs with
    before = {host: plab.ssh(host, "ls -la /etc/apt/sources.list.d /etc/apt/keyrings 2>&1; dpkg -l | md5sum").stdout
              for host in plab.hosts}
    proc = provision(plab, nvidia_apt_repo_key_fingerprint=wrong)
    text = output(proc)
    assert proc.returncode != 0, text[-3000:]
    assert (f"has fingerprint {right}, but nvidia_apt_repo_key_fingerprint pins {wrong}: refusing to trust it. "
            "Nothing was changed.") in text, text[-3000:]
    assert "Install the verified key" not in text, "the play went on past the check"
    for host in plab.hosts:
        after = plab.ssh(host, "ls -la /etc/apt/sources.list.d /etc/apt/keyrings 2>&1; dpkg -l | md5sum").stdout
        assert after == before[host], f"{host} changed:\n{before[host]}\n---\n{after}"
    assert_nothing_installed(plab)


def test_fresh_hosts_get_driver_cuda_holds_blacklist_and_persistenced(plab):
    boots = {host: boot_id(plab, host) for host in plab.hosts}
    proc = provision(plab)
    text = output(proc)
    assert proc.returncode == 0, text[-4000:]
    assert "initramfs NOT rebuilt: /usr/sbin/update-initramfs does not exist" in text
    fingerprint = LAB_VARS["nvidia_apt_repo_key_fingerprint"]
    assert text.count("matches nvidia_apt_repo_key_fingerprint") == len(plab.hosts), text[-4000:]
    for host in plab.hosts:
        assert recap(proc)[host]["failed"] == 0
        # The repository is trusted through the pinned key only: signed-by, never trusted=yes.
        sources = plab.ssh(host, "cat /etc/apt/sources.list.d/*.list").stdout
        assert "deb [signed-by=/etc/apt/keyrings/nvidia-cuda.asc] file:/srv/lab-apt ./" in sources, sources
        assert "trusted=yes" not in sources, sources
        shown = plab.ssh(host, "gpg --batch --homedir $(mktemp -d) --show-keys --with-colons "
                               "/etc/apt/keyrings/nvidia-cuda.asc").stdout
        assert f"fpr:::::::::{fingerprint}:" in shown, shown
        assert boot_id(plab, host) != boots[host], f"{host} was not rebooted for the new module"
        for package in HELD + ["linux-headers-" + plab.ssh(host, "uname -r").stdout.strip()]:
            assert installed(plab, host, package), f"{host}: {package} not installed"
        selections = plab.ssh(host, "dpkg --get-selections").stdout
        for package in HELD:
            assert re.search(rf"^{re.escape(package)}\s+hold$", selections, re.M), f"{host}: {package} not held"
        assert "blacklist nouveau" in plab.ssh(host, "modprobe --showconfig").stdout
        unattended = plab.ssh(host, "cat /etc/apt/apt.conf.d/51nvidia-unattended-upgrades-blacklist").stdout
        for pattern in ('"nvidia-.*";', '"libnvidia-.*";', '"cuda-.*";'):
            assert pattern in unattended
        pin = plab.ssh(host, "apt-cache policy nvidia-open-580").stdout
        assert "1001" in pin and "580.95.05-1" in pin, pin
        assert plab.ssh(host, "systemctl is-enabled nvidia-persistenced").stdout.strip() == "enabled"
        assert plab.ssh(host, "systemctl is-active nvidia-persistenced").stdout.strip() == "active"
        assert not installed(plab, host, "nvidia-fabricmanager-580")
        assert plab.ssh(host, "modinfo -F license nvidia").stdout.strip() == "Dual MIT/GPL"
        assert "release 13.0," in plab.ssh(host, "/usr/local/cuda-13.0/bin/nvcc --version").stdout
    assert text.count("verified: open module 580.95.05, 8 GPU(s)") == len(plab.hosts)


def test_second_run_changes_nothing(plab):
    boots = {host: boot_id(plab, host) for host in plab.hosts}
    proc = provision(plab)
    assert proc.returncode == 0, output(proc)[-4000:]
    for host in plab.hosts:
        counts = recap(proc)[host]
        assert counts["changed"] == 0 and counts["failed"] == 0, f"{host}: {counts}\n{proc.stdout[-4000:]}"
        assert boot_id(plab, host) == boots[host], f"{host} rebooted on an unchanged run"


def run_infra_nvidia(lab) -> subprocess.CompletedProcess:
    """`make verify`'s NVIDIA checks (testinfra over the lab inventory), as an operator runs them."""
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "tests/infra/test_nvidia.py",
           "-k", "fabric_manager", "--hosts=ansible://gpu_hosts", f"--ansible-inventory={lab.inventory}"]
    return subprocess.run(cmd, cwd=REPO, env=lab.ansible_env(), text=True, capture_output=True, timeout=600,
                          stdin=subprocess.DEVNULL)


def test_nvswitch_host_runs_fabric_manager_and_pcie_hosts_keep_it_absent(plab):
    """Issue 37 (HGX): lab2 turns into an NVSwitch system (4 chips of class 0680 on its PCI bus, what the
    stand-in lspci lists); provisioning installs fabric manager of the driver's version there, pinned and
    held, and has it running before the verify step; lab1 (PCIe cards) keeps it absent. Forced on a host
    without chips, fabric manager exits at start and the run fails naming why. Back to PCIe, it is removed."""
    set_conf(plab, "lab2", NVSWITCH_COUNT="4")
    try:
        proc = provision(plab)
        text = output(proc)
        assert proc.returncode == 0, text[-4000:]
        assert installed(plab, "lab2", "nvidia-fabricmanager-580")
        assert plab.ssh("lab2", "dpkg-query -W -f '${Version}' nvidia-fabricmanager-580").stdout == "580.95.05-1"
        assert re.search(r"^nvidia-fabricmanager-580\s+hold$", plab.ssh("lab2", "dpkg --get-selections").stdout, re.M)
        assert plab.ssh("lab2", "systemctl is-enabled nvidia-fabricmanager").stdout.strip() == "enabled"
        assert plab.ssh("lab2", "systemctl is-active nvidia-fabricmanager").stdout.strip() == "active"
        assert not installed(plab, "lab1", "nvidia-fabricmanager-580")
        assert "NVSwitch system: fabric manager nvidia-fabricmanager active" in text
        assert text.count("NVSwitch: fabric manager active") >= 1 and "no NVSwitch: fabric manager absent" in text
        verify = run_infra_nvidia(plab)
        assert verify.returncode == 0, (verify.stdout + verify.stderr)[-3000:]
        assert verify.stdout.count("PASSED") == len(plab.hosts), verify.stdout[-3000:]

        forced = provision(plab, "--limit", "lab1", nvidia_driver_nvswitch=True)
        forced_text = output(forced)
        assert forced.returncode != 0, forced_text[-3000:]
        assert "Fabric manager (nvidia-fabricmanager) on lab1 is" in forced_text, forced_text[-3000:]
        assert "NVSwitch devices not found" in forced_text, forced_text[-3000:]
    finally:
        set_conf(plab, "lab2", NVSWITCH_COUNT="0")
        back = provision(plab, "--limit", "lab1,lab2")
    assert back.returncode == 0, output(back)[-4000:]
    for host in ("lab1", "lab2"):
        assert not installed(plab, host, "nvidia-fabricmanager-580"), f"{host}: fabric manager left on PCIe cards"


def test_fewer_gpus_than_inventory_fails_verification(plab):
    """All 8 GPUs are on the PCI bus (preflight passes) but the driver brings up only 6."""
    set_conf(plab, "lab1", DRIVER_GPU_COUNT="6")
    try:
        proc = provision(plab, "--limit", "lab1")
    finally:
        restore_conf(plab, "lab1")
    text = output(proc)
    assert proc.returncode != 0, text[-3000:]
    assert "preflight passed" in text
    assert "GPU count: nvidia-smi lists 6 GPU(s)" in text and "expected 8 (gpu_count of lab1)" in text, text[-3000:]


def test_proprietary_module_flavour_fails_verification(plab):
    """The module built is the proprietary flavour (as when the wrong driver package went in)."""
    rebuild = ("DEBIAN_FRONTEND=noninteractive apt-get install -q -y --reinstall --allow-change-held-packages"
               " nvidia-dkms-580-open")
    set_conf(plab, "lab2", MODULE_FLAVOUR="proprietary")
    try:
        plab.ssh("lab2", rebuild)
        assert plab.ssh("lab2", "modinfo -F license nvidia").stdout.strip() == "NVIDIA"
        proc = provision(plab, "--limit", "lab2")
    finally:
        restore_conf(plab, "lab2")
        plab.ssh("lab2", rebuild)
    text = output(proc)
    assert proc.returncode != 0, text[-3000:]
    assert "'modinfo -F license nvidia' says 'NVIDIA'; expected 'Dual MIT/GPL'" in text, text[-3000:]


def test_driver_change_with_reboot_opt_out_then_reboot(plab):
    """Changing the driver version with nvidia_driver_reboot_allowed=false leaves a pending reboot
    that the next run (reboot allowed) performs although its packages no longer change."""
    loaded = plab.ssh("lab1", "cat /run/lab-nvidia/module-version", check=False).stdout.strip()
    if loaded != "580.95.05":  # run alone (-k): provision the default driver first
        assert provision(plab, "--limit", "lab1").returncode == 0
    boot = boot_id(plab, "lab1")
    proc = provision(plab, "--limit", "lab1", nvidia_driver_version="580.82.07", nvidia_driver_reboot_allowed=False)
    text = output(proc)
    assert proc.returncode == 0, text[-4000:]
    assert "REBOOT PENDING on lab1: NVIDIA module 580.82.07 is installed, 580.95.05 is loaded" in text
    assert "(reboot pending, GPUs not checked)" in text
    assert boot_id(plab, "lab1") == boot
    smi = plab.ssh("lab1", "nvidia-smi", check=False)
    assert smi.returncode == 18 and "Driver/library version mismatch" in smi.stdout

    proc = provision(plab, "--limit", "lab1", nvidia_driver_version="580.82.07")
    text = output(proc)
    assert proc.returncode == 0, text[-4000:]
    assert boot_id(plab, "lab1") != boot, "the pending reboot did not happen"
    assert "verified: open module 580.82.07, 8 GPU(s)" in text

    # An empty nvidia_driver_version never upgrades an installed driver: moving is explicit.
    proc = provision(plab, "--limit", "lab1", nvidia_driver_version="580.95.05")
    assert proc.returncode == 0, output(proc)[-4000:]
    assert "verified: open module 580.95.05, 8 GPU(s)" in output(proc)
