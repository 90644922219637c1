#!/usr/bin/env python3
"""The lab: real Debian 12 hosts (systemd + sshd) in systemd-nspawn containers on loopback addresses.

    lab.py up       build the root filesystem once, boot hosts lab1..labN, write the inventory
    lab.py down     stop every host, remove the hosts and the inventory (never the rootfs cache)
    lab.py status   one line per host; exit 0 if all are running, 1 otherwise

Environment (relative paths are relative to the repository root):
    LAB_HOSTS        number of hosts (default 2)
    LAB_NET          first three octets of the hosts' addresses, inside 127.0.0.0/8 (default 127.0.1)
    LAB_DIR          the lab's folder (default build/lab)
    LAB_INVENTORY    the inventory written by `up` (default inventory/lab.yml)
    LAB_GPU_COUNTS   GPUs per host, space-separated (default 8 for every host)
    LAB_CACHE        the shared rootfs cache folder (default build/lab-cache)
    LAB_MIRROR       Debian mirror for debootstrap (default http://deb.debian.org/debian)
    LAB_BOOT_TIMEOUT seconds to wait for a host to boot (default 240)

Exit codes: 0 success, 1 a host is not running / a step failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
# Everything the hosts need for Ansible (apt, systemd, become, unarchive) and the project's roles.
PACKAGES = [
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-venv", "python3-pip",
    "python3-apt", "iproute2", "procps", "kmod", "sudo", "ca-certificates", "curl", "apt-utils", "gnupg",
    "iputils-ping", "acl", "rsync", "unzip", "xz-utils", "patch", "less",
]
# Units that would reach outside 127.0.0.0/8 or touch the machine's shared network namespace.
MASKED_UNITS = [
    "apt-daily.timer", "apt-daily-upgrade.timer", "apt-daily.service", "apt-daily-upgrade.service",
    "systemd-networkd.service", "systemd-networkd.socket", "systemd-networkd-wait-online.service",
    "systemd-resolved.service", "systemd-timesyncd.service", "e2scrub_all.timer", "fstrim.timer",
]
GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
GPU_MEMORY_MIB = 97887
DEFAULT_GPU_COUNT = 8
REBOOT_STATUS = 133  # systemd-nspawn's exit status when the container asked for a reboot
SSH_OPTS = [
    "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
    "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5",
]
CACHE_FORMAT = 1


class LabError(Exception):
    """A failure with a one-line message for the user."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def log(message: str) -> None:
    print(f"lab: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- configuration


@dataclass
class Host:
    index: int
    name: str
    address: str
    gpu_count: int
    dir: Path

    @property
    def rootfs(self) -> Path:
        return self.dir / "rootfs"

    @property
    def machine(self) -> str:
        # Unique across labs on this machine (nspawn keeps per-machine-name state under /run).
        return f"{self.name}-{self.address.replace('.', '-')}"


@dataclass
class Lab:
    hosts_count: int
    net: str
    dir: Path
    inventory: Path
    cache: Path
    mirror: str
    boot_timeout: float
    hosts: list[Host] = field(default_factory=list)

    @property
    def key(self) -> Path:
        return self.dir / "ssh" / "id_ed25519"

    @property
    def apt_dir(self) -> Path:
        return self.dir / "apt"


def _path(env: dict[str, str], name: str, default: str) -> Path:
    value = env.get(name, "") or default
    path = Path(value)
    return (path if path.is_absolute() else REPO / path).resolve()


def _positive_int(env: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = env.get(name, "") or str(default)
    if not re.fullmatch(r"\d+", raw.strip()) or not low <= int(raw) <= high:
        raise LabError(f"{name}={raw!r} is not allowed: use a whole number from {low} to {high}", 2)
    return int(raw)


def load_config(env: dict[str, str] | None = None) -> Lab:
    env = dict(os.environ if env is None else env)
    count = _positive_int(env, "LAB_HOSTS", 2, 1, 50)
    net = (env.get("LAB_NET", "") or "127.0.1").strip()
    octets = net.split(".")
    if (len(octets) != 3 or not all(re.fullmatch(r"\d{1,3}", o) for o in octets)
            or octets[0] != "127" or not all(0 <= int(o) <= 255 for o in octets)):
        raise LabError(f"LAB_NET={net!r} is not allowed: use three octets inside 127.0.0.0/8, "
                       f"e.g. 127.0.1", 2)
    if net == "127.0.0":
        raise LabError("LAB_NET='127.0.0' is not allowed: 127.0.0.N collides with the machine's own "
                       "localhost services; use another, e.g. 127.0.1", 2)
    net = ".".join(str(int(o)) for o in octets)
    raw_counts = (env.get("LAB_GPU_COUNTS", "") or "").split()
    if len(raw_counts) > count:
        raise LabError(f"LAB_GPU_COUNTS={env['LAB_GPU_COUNTS']!r} is not allowed: "
                       f"at most LAB_HOSTS={count} numbers", 2)
    counts = []
    for raw in raw_counts:
        if not re.fullmatch(r"\d+", raw) or int(raw) > 64:
            raise LabError(f"LAB_GPU_COUNTS={env['LAB_GPU_COUNTS']!r} is not allowed: "
                           f"{raw!r} must be a whole number from 0 to 64", 2)
        counts.append(int(raw))
    counts += [DEFAULT_GPU_COUNT] * (count - len(counts))
    lab = Lab(
        hosts_count=count, net=net,
        dir=_path(env, "LAB_DIR", "build/lab"),
        inventory=_path(env, "LAB_INVENTORY", "inventory/lab.yml"),
        cache=_path(env, "LAB_CACHE", "build/lab-cache"),
        mirror=env.get("LAB_MIRROR", "") or "http://deb.debian.org/debian",
        boot_timeout=float(_positive_int(env, "LAB_BOOT_TIMEOUT", 240, 10, 3600)),
    )
    for i in range(1, count + 1):
        name = f"lab{i}"
        lab.hosts.append(Host(i, name, f"{net}.{i}", counts[i - 1], lab.dir / "hosts" / name))
    return lab


# ---------------------------------------------------------------- helpers


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=False, text=True, **kwargs)


def must(cmd: list[str], what: str, **kwargs) -> subprocess.CompletedProcess:
    proc = run(cmd, capture_output=True, **kwargs)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or ["no output"]
        raise LabError(f"{what} failed (exit {proc.returncode}): {tail[0]}")
    return proc


@contextmanager
def flock(path: Path, exclusive: bool = True):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_tools(need_debootstrap: bool) -> None:
    wanted = {"systemd-nspawn": "systemd-container", "ssh": "openssh-client", "ssh-keygen": "openssh-client",
              # the stand-in apt repository: dpkg-deb packs it, objcopy writes the fake module's .modinfo
              "dpkg-deb": "dpkg", "objcopy": "binutils"}
    if need_debootstrap:
        wanted["debootstrap"] = "debootstrap"
    missing = sorted({pkg for tool, pkg in wanted.items() if shutil.which(tool) is None})
    if not missing:
        return
    if os.geteuid() != 0:
        raise LabError(f"missing packages {' '.join(missing)} and not root: install them with apt-get", 1)
    log(f"installing {' '.join(missing)} with apt-get")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    lock_opt = ["-o", "DPkg::Lock::Timeout=600"]
    must(["apt-get", *lock_opt, "update", "-q"], "apt-get update", env=env)
    must(["apt-get", *lock_opt, "install", "-y", "-q", "--no-install-recommends", *missing],
         f"apt-get install {' '.join(missing)}", env=env)


def pid_alive(pid_file: Path, marker: str) -> int | None:
    """The pid in pid_file if that process is alive and its command line contains marker."""
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    state = stat.rsplit(")", 1)[1].split()[0]
    if state == "Z" or marker not in cmdline:
        return None
    return pid


def _pidns(pid: int | str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    kids.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return kids


def container_pidns(host_dir: Path) -> str | None:
    """The container's PID namespace: that of nspawn's child (its PID 1); remembered in host_dir/pidns."""
    saved = host_dir / "pidns"
    nspawn = pid_alive(host_dir / "nspawn.pid", str((host_dir / "rootfs").resolve()))
    if nspawn:
        ours = _pidns("self")
        for kid in _children(nspawn):
            ns = _pidns(kid)
            if ns and ns != ours:
                saved.write_text(ns + "\n")
                return ns
    try:
        ns = saved.read_text().strip()
    except OSError:
        return None
    return ns if ns and ns != _pidns("self") else None


def processes_in(pidns: str | None) -> list[int]:
    """Pids (as this machine sees them) of the processes in a container's PID namespace."""
    if not pidns:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _pidns(entry.name) == pidns:
            found.append(int(entry.name))
    return found


def container_init(pidns: str | None) -> int | None:
    """The container's PID 1 as this machine sees it."""
    for pid in processes_in(pidns):
        try:
            nspid = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                         if line.startswith("NSpid:"))
        except (OSError, StopIteration):
            continue
        if nspid.split()[-1] == "1":
            return pid
    return None


def ssh_cmd(lab: Lab, host: Host, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
    cmd = ["ssh", "-i", str(lab.key), *SSH_OPTS, f"root@{host.address}", command]
    try:
        return run(cmd, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 255, "", f"timed out after {timeout:.0f}s")


# ---------------------------------------------------------------- rootfs cache


def cache_stamp() -> dict:
    return {"format": CACHE_FORMAT, "suite": SUITE, "packages": PACKAGES, "masked": MASKED_UNITS}


def cache_ready(lab: Lab) -> bool:
    stamp = lab.cache / "rootfs" / ".lab-cache.json"
    try:
        return json.loads(stamp.read_text()) == cache_stamp()
    except (OSError, ValueError):
        return False


def build_cache(lab: Lab) -> None:
    """Debootstrap the shared root filesystem once (temp folder, then rename), under a lock."""
    lab.cache.mkdir(parents=True, exist_ok=True)
    with flock(lab.cache / ".lock"):
        if cache_ready(lab):
            return
        ensure_tools(need_debootstrap=True)
        for stale in lab.cache.glob("rootfs.tmp-*"):
            log(f"removing an interrupted build {stale}")
            shutil.rmtree(stale)
        old = lab.cache / "rootfs"
        if old.exists():
            log(f"the cache at {old} is from another package list; rebuilding it")
            shutil.rmtree(old)
        tmp = lab.cache / f"rootfs.tmp-{os.getpid()}"
        log(f"debootstrap {SUITE} into {tmp} (a few minutes, once)")
        start = time.monotonic()
        must(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(tmp),
              lab.mirror], "debootstrap")
        prepare_cache(tmp)
        (tmp / ".lab-cache.json").write_text(json.dumps(cache_stamp()))
        tmp.rename(old)
        log(f"rootfs cache ready at {old} after {time.monotonic() - start:.0f}s")


def prepare_cache(root: Path) -> None:
    """Host-independent settings: no per-host identity, nothing that leaves 127.0.0.0/8."""
    for key in (root / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc" / "machine-id").write_text("")
    dbus_id = root / "var" / "lib" / "dbus" / "machine-id"
    if dbus_id.exists() and not dbus_id.is_symlink():
        dbus_id.unlink()
    for unit in MASKED_UNITS:
        link = root / "etc" / "systemd" / "system" / unit
        if link.is_symlink() or link.exists():
            link.unlink()
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to("/dev/null")
    # apt inside a host reaches only the lab's own repository (a file: source added by the roles).
    sources = root / "etc" / "apt" / "sources.list"
    if sources.exists():
        sources.rename(root / "etc" / "apt" / "sources.list.lab-disabled")
        sources.write_text("# The lab's hosts use only the stand-in repository under /srv/lab-apt.\n")
    (root / "etc" / "apt" / "apt.conf.d" / "90lab").write_text(
        'APT::Install-Recommends "false";\nAPT::Periodic::Enable "0";\n')
    shutil.rmtree(root / "var" / "lib" / "apt" / "lists", ignore_errors=True)
    (root / "var" / "lib" / "apt" / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    must(["chroot", str(root), "apt-get", "clean"], "apt-get clean in the rootfs")


# ---------------------------------------------------------------- hosts


def ensure_key(lab: Lab) -> None:
    if lab.key.exists() and lab.key.with_suffix(".pub").exists():
        return
    lab.key.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(lab.key.parent, 0o700)
    for stale in (lab.key, lab.key.with_suffix(".pub")):
        stale.unlink(missing_ok=True)
    must(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sglang-lab", "-f", str(lab.key)],
         "ssh-keygen for the lab key")


def gpu_conf(host: Host) -> str:
    return (f"# Written by tests/lab/lab.py: what the stand-in hardware tools report.\n"
            f"GPU_COUNT={host.gpu_count}\n"
            f'GPU_NAME="{GPU_NAME}"\n'
            f"GPU_MEMORY_MIB={GPU_MEMORY_MIB}\n"
            f"MODULE_FLAVOUR=open\n"
            f"NVSWITCH_COUNT=0\n"
            f"SECURE_BOOT=off\n")


def create_host(lab: Lab, host: Host) -> None:
    """Copy the cached rootfs (if this host has none yet) and write its identity and settings."""
    ready = host.dir / ".ready"
    if not ready.exists():
        if host.dir.exists():
            remove_host_dir(host)
        host.dir.mkdir(parents=True)
        tmp = host.dir / "rootfs.tmp"
        with flock(lab.cache / ".lock", exclusive=False):
            must(["cp", "-a", "--reflink=auto", str(lab.cache / "rootfs"), str(tmp)],
                 f"copying the rootfs cache for {host.name}")
        (tmp / ".lab-cache.json").unlink(missing_ok=True)
        (tmp / "etc" / "machine-id").write_text(uuid.uuid4().hex + "\n")
        must(["ssh-keygen", "-A", "-f", str(tmp)], f"ssh host keys for {host.name}")
        tmp.rename(host.rootfs)
        ready.write_text("")
    configure_host(lab, host)


def write_if_changed(path: Path, data: bytes, mode: int | None = None) -> bool:
    if path.is_file() and path.read_bytes() == data and (mode is None or path.stat().st_mode & 0o7777 == mode):
        return False
    path.write_bytes(data)
    if mode is not None:
        path.chmod(mode)
    return True


def configure_host(lab: Lab, host: Host, hardware_only: bool = False) -> list[str]:
    """Write the host's settings into its rootfs; returns the paths (inside the host) that changed.

    hardware_only (a running host): only what stands in for hardware (/etc/lab-gpu.conf and the
    stand-in tools), so that a later `up` with other LAB_GPU_COUNTS or new stand-ins updates it.
    """
    root = host.rootfs
    changed = []
    files: list[tuple[str, bytes, int | None]] = [("/etc/lab-gpu.conf", gpu_conf(host).encode(), 0o644)]
    standin = REPO / "tests" / "lab" / "standin" / "hw"
    if standin.is_dir():
        for src in sorted(standin.iterdir()):
            if src.is_file() and not src.name.startswith("."):
                files.append((f"/usr/local/sbin/{src.name}", src.read_bytes(), 0o755))
    if not hardware_only:
        (root / "root" / ".ssh").mkdir(mode=0o700, exist_ok=True)
        files += [
            ("/etc/hostname", f"{host.name}\n".encode(), None),
            ("/etc/hosts", f"127.0.0.1\tlocalhost\n{host.address}\t{host.name}\n"
                           f"::1\tlocalhost ip6-localhost ip6-loopback\n".encode(), None),
            ("/root/.ssh/authorized_keys", lab.key.with_suffix(".pub").read_bytes(), 0o600),
            ("/etc/ssh/sshd_config.d/lab.conf",
             f"# Written by tests/lab/lab.py: this host's sshd listens on its own address only.\n"
             f"ListenAddress {host.address}\nUseDNS no\nPermitRootLogin prohibit-password\n".encode(), None),
        ]
        for mount_point in ("opt/sglang-sim", "srv/lab-apt", "usr/local/sbin"):
            (root / mount_point).mkdir(parents=True, exist_ok=True)
    for inside, data, mode in files:
        if write_if_changed(root / inside.lstrip("/"), data, mode):
            changed.append(inside)
    return changed


def nspawn_command(lab: Lab, host: Host) -> list[str]:
    return [
        "systemd-nspawn", "-D", str(host.rootfs), "--boot", "--register=no", "--keep-unit",
        "-M", host.machine, f"--hostname={host.name}",
        f"--bind-ro={REPO / 'tests' / 'sim'}:/opt/sglang-sim",
        f"--bind-ro={lab.apt_dir}:/srv/lab-apt",
    ]


def supervisor_marker(host_dir: Path) -> str:
    return f"_supervise {host_dir}"


def host_running(host: Host) -> bool:
    return (pid_alive(host.dir / "supervisor.pid", supervisor_marker(host.dir)) is not None
            and pid_alive(host.dir / "nspawn.pid", str(host.rootfs)) is not None)


def boot_host(lab: Lab, host: Host) -> None:
    (host.dir / "stop").unlink(missing_ok=True)
    console = open(host.dir / "console.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "_supervise", str(host.dir), "--",
         *nspawn_command(lab, host)],
        stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
        start_new_session=True, cwd="/",
    )
    console.close()
    (host.dir / "supervisor.pid").write_text(f"{proc.pid}\n")
    # Wait until the supervisor has started nspawn, so that `down` right after `up` finds it.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if pid_alive(host.dir / "nspawn.pid", str(host.rootfs)):
            return
        if proc.poll() is not None:
            raise LabError(f"{host.name}: systemd-nspawn exited at once (status {proc.returncode}); "
                           f"see {host.dir / 'console.log'}")
        time.sleep(0.1)
    raise LabError(f"{host.name}: systemd-nspawn did not start within 15s; see {host.dir / 'console.log'}")


def supervise(host_dir: Path, command: list[str]) -> int:
    """Run nspawn; start it again when the container rebooted (status 133); stop on SIGTERM."""
    stopping = False
    child: subprocess.Popen | None = None

    def on_signal(signum, _frame):
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    boots = 0
    while True:
        boots += 1
        print(f"lab-supervisor: boot {boots} at {time.strftime('%H:%M:%S')}", flush=True)
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
        (host_dir / "nspawn.pid").write_text(f"{child.pid}\n")
        status = child.wait()
        print(f"lab-supervisor: systemd-nspawn exited with status {status}", flush=True)
        if stopping or (host_dir / "stop").exists() or status != REBOOT_STATUS:
            return status
        time.sleep(0.5)


def wait_booted(lab: Lab, host: Host, deadline: float) -> str:
    """Wait for sshd and `systemctl is-system-running --wait`; returns the state line for the user."""
    last = "no answer"
    while time.monotonic() < deadline:
        if not host_running(host):
            raise LabError(f"{host.name}: the container stopped while booting; "
                           f"see {host.dir / 'console.log'}")
        left = max(5.0, deadline - time.monotonic())
        proc = ssh_cmd(lab, host, "systemctl is-system-running --wait", timeout=left)
        state = proc.stdout.strip()
        if state == "running":
            return "running"
        if state == "degraded":
            failed = ssh_cmd(lab, host, "systemctl list-units --failed --plain --no-legend").stdout.split()
            units = [w for w in failed if re.search(r"\.(service|socket|mount|timer|target|path)$", w)]
            return f"degraded (failed: {', '.join(units) or 'unknown'})"
        last = state or (proc.stderr.strip().splitlines() or ["no answer"])[-1]
        time.sleep(1)
    raise LabError(f"{host.name} ({host.address}) did not finish booting within {lab.boot_timeout:.0f}s "
                   f"(last answer: {last}); see {host.dir / 'console.log'}")


def check_address_free(host: Host) -> None:
    """Another lab or service must not already own this host's sshd address."""
    proc = run(["ss", "-Hltn", f"src {host.address}:22"], capture_output=True)
    if proc.returncode == 0 and proc.stdout.strip():
        raise LabError(f"{host.name}: {host.address}:22 is already in use by another process; "
                       f"choose another LAB_NET (e.g. LAB_NET=127.0.9)")


def _standin_apt():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import standin_apt

    return standin_apt


def write_inventory(lab: Lab) -> None:
    q = json.dumps  # a JSON string is a valid YAML double-quoted scalar
    standin_apt = _standin_apt()
    apt_vars = standin_apt.role_vars(standin_apt.fingerprint_of(lab.apt_dir))
    lines = [
        "# Generated by tests/lab/lab.py (make lab-up); do not edit: `lab.py down` removes it.",
        "all:",
        "  children:",
        "    gpu_hosts:",
        "      hosts:",
    ]
    for host in lab.hosts:
        lines += [
            f"        {host.name}:",
            f"          ansible_host: {q(host.address)}",
            "          ansible_user: root",
            f"          ansible_ssh_private_key_file: {q(str(lab.key))}",
            '          ansible_ssh_common_args: "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null'
            ' -o LogLevel=ERROR"',
            "          ansible_python_interpreter: /usr/bin/python3",
            f"          gpu_count: {host.gpu_count}",
            "          sglang_lab: true",
            f"          sglang_bind_address: {q(host.address)}",
            "          sglang_install_deps: false",
            "          sglang_launcher: /opt/sglang-sim/sglang_sim.py",
            "          # The stand-in NVIDIA apt repository, trusted by the fingerprint of the lab's own key.",
            *(f"          {name}: {q(value)}" for name, value in apt_vars.items()),
            "          # Where the stand-in module reports its version.",
            "          nvidia_driver_module_version_file: /run/lab-nvidia/module-version",
            "          # The stand-in of the Hugging Face hub that serves small stand-in models.",
            "          sglang_models_hf_endpoint: " + q("http://{}:{}".format(*hub_address(lab))),
        ]
    lab.inventory.parent.mkdir(parents=True, exist_ok=True)
    tmp = lab.inventory.with_name(lab.inventory.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(lab.inventory)


DEPLOYER = "deployer"
DEPLOYER_SUDO_LOG = "/var/log/sudo-deployer.log"


def deployer_inventory_path(lab: Lab) -> Path:
    return lab.inventory.with_name(f"{lab.inventory.stem}-{DEPLOYER}{lab.inventory.suffix}")


def add_deployer(lab: Lab) -> Path:
    """Opt in (tests that prove become): on every host a non-root ``deployer`` user with the lab's SSH key
    and passwordless sudo (logged to /var/log/sudo-deployer.log), and an inventory beside the lab's,
    ``<inventory>-deployer.yml``, that connects as it with ``ansible_become: true`` (inventory/example.yml's
    ``ansible_user: ubuntu`` shape). Idempotent; ``lab.py down`` removes the hosts and both inventories.
    Returns the inventory's path."""
    script = (
        f"set -e; id -u {DEPLOYER} >/dev/null 2>&1 || useradd -m -s /bin/bash {DEPLOYER}; "
        f"install -d -m 700 -o {DEPLOYER} -g {DEPLOYER} /home/{DEPLOYER}/.ssh; "
        f"install -m 600 -o {DEPLOYER} -g {DEPLOYER} /root/.ssh/authorized_keys /home/{DEPLOYER}/.ssh/authorized_keys; "
        f"printf '%s\\n' '{DEPLOYER} ALL=(ALL) NOPASSWD: ALL' 'Defaults:{DEPLOYER} logfile={DEPLOYER_SUDO_LOG}' "
        f"> /etc/sudoers.d/90-lab-{DEPLOYER}.tmp; chmod 440 /etc/sudoers.d/90-lab-{DEPLOYER}.tmp; "
        f"visudo -cqf /etc/sudoers.d/90-lab-{DEPLOYER}.tmp; "
        f"mv /etc/sudoers.d/90-lab-{DEPLOYER}.tmp /etc/sudoers.d/90-lab-{DEPLOYER}"
    )
    for host in lab.hosts:
        proc = ssh_cmd(lab, host, script, timeout=60)
        if proc.returncode != 0:
            raise LabError(f"{host.name}: adding the {DEPLOYER} user failed: {(proc.stderr or proc.stdout).strip()}")
    text = lab.inventory.read_text()
    root_user = "          ansible_user: root\n"
    if text.count(root_user) != len(lab.hosts):
        raise LabError(f"{lab.inventory}: expected one 'ansible_user: root' per host")
    path = deployer_inventory_path(lab)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text.replace(root_user, f"          ansible_user: {DEPLOYER}\n          ansible_become: true\n"))
    tmp.rename(path)
    return path


MONITORING = "monitoring"
# The real Debian packages the monitoring role installs in the lab (and, with them, whatever of their
# dependencies the lab's root filesystem lacks), downloaded once on the controller into $LAB_CACHE.
DEBIAN_PACKAGES = ["prometheus"]
DEBIAN_DIR = "debian"  # $LAB_DIR/apt/debian, seen by the hosts as /srv/lab-apt/debian


def monitoring_inventory_path(lab: Lab) -> Path:
    return lab.inventory.with_name(f"{lab.inventory.stem}-{MONITORING}{lab.inventory.suffix}")


def debian_debs(lab: Lab) -> list[Path]:
    """The real .deb files of DEBIAN_PACKAGES and the dependencies the lab's rootfs lacks, from the controller's
    apt (Debian 12's sources, as the rootfs), downloaded once into $LAB_CACHE/debian-debs (under the cache lock)."""
    folder = lab.cache / "debian-debs"
    stamp = folder / ".packages.json"
    with flock(lab.cache / ".lock"):
        try:
            if json.loads(stamp.read_text()) == DEBIAN_PACKAGES:
                return sorted(folder.glob("*.deb"))
        except (OSError, ValueError):
            pass
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        proc = run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
                    "--no-breaks", "--no-replaces", "--no-enhances", *DEBIAN_PACKAGES], capture_output=True, env=env)
        if proc.returncode != 0 or not proc.stdout.strip():
            must(["apt-get", "-o", "DPkg::Lock::Timeout=600", "update", "-q"], "apt-get update", env=env)
            proc = must(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
                         "--no-breaks", "--no-replaces", "--no-enhances", *DEBIAN_PACKAGES],
                        f"apt-cache depends {' '.join(DEBIAN_PACKAGES)}", env=env)
        closure = sorted({line.strip() for line in proc.stdout.splitlines()
                          if line.strip() and not line.startswith(" ") and "<" not in line})
        status = (lab.cache / "rootfs" / "var" / "lib" / "dpkg" / "status").read_text()
        installed = set(re.findall(r"^Package: (\S+)$", status, re.M))
        wanted = [p for p in closure if p not in installed]
        log(f"downloading {len(wanted)} Debian packages for the monitoring host into {folder} (once)")
        must(["apt-get", "download", "-q", *wanted], "apt-get download", cwd=folder, env=env)
        stamp.write_text(json.dumps(DEBIAN_PACKAGES))
        return sorted(folder.glob("*.deb"))


def build_debian_repo(lab: Lab) -> Path:
    """$LAB_DIR/apt/debian: a flat repository of debian_debs(), signed with the lab's apt key (lab-apt.asc beside
    it), which the hosts see read-only at /srv/lab-apt/debian."""
    standin_apt = _standin_apt()
    dest = lab.apt_dir / DEBIAN_DIR
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.iterdir():
        old.unlink()
    debs = []
    for deb in debian_debs(lab):
        shutil.copy2(deb, dest / deb.name)
        debs.append(dest / deb.name)
    packages = "\n".join(standin_apt.index_entry(deb, dest) for deb in debs)
    (dest / "Packages").write_text(packages)
    release = ["Origin: sgdeploy-lab", "Label: Debian packages for the lab's monitoring host", "Suite: lab",
               "Codename: lab", "Architectures: amd64 all", "SHA256:"]
    data = (dest / "Packages").read_bytes()
    release.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} Packages")
    (dest / "Release").write_text("\n".join(release) + "\n")
    standin_apt.sign(dest, standin_apt.default_gnupg_home(lab.apt_dir))
    (dest / "lab-apt.asc").write_bytes((dest / standin_apt.KEY_NAME).read_bytes())
    for path in dest.iterdir():
        path.chmod(0o644)
    return dest


def add_monitoring(lab: Lab, host: str = "lab1") -> Path:
    """Opt in (tests/lab/test_monitoring.py): an inventory beside the lab's, ``<inventory>-monitoring.yml``, with
    the group ``monitoring`` (``host``), whose apt reaches the real Debian prometheus package through the lab's
    repository (``$LAB_DIR/apt/debian``, built here). ``lab.py down`` removes it. Returns its path."""
    build_debian_repo(lab)
    text = lab.inventory.read_text()
    text += "\n".join([
        f"    {MONITORING}:",
        "      hosts:",
        f"        {host}:",
        "      vars:",
        "        # The real Debian package, from the lab's own signed repository (hosts have no Debian source).",
        f'        sglang_monitoring_apt_repo: "deb [signed-by=/srv/lab-apt/{DEBIAN_DIR}/lab-apt.asc] '
        f'file:/srv/lab-apt/{DEBIAN_DIR} ./"',
        "        sglang_monitoring_scrape_interval: 5s",
        "        sglang_monitoring_scrape_timeout: 4s",
        "        sglang_monitoring_sd_refresh_interval: 5s",
    ]) + "\n"
    path = monitoring_inventory_path(lab)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.rename(path)
    return path


def up(lab: Lab) -> int:
    if os.geteuid() != 0:
        raise LabError("lab.py up needs root (systemd-nspawn, debootstrap)", 1)
    start = time.monotonic()
    sim = REPO / "tests" / "sim"
    if not sim.is_dir():
        raise LabError(f"{sim} is missing: the hosts mount it at /opt/sglang-sim; restore it from git")
    ensure_tools(need_debootstrap=False)
    if not cache_ready(lab):
        build_cache(lab)
    lab.dir.mkdir(parents=True, exist_ok=True)
    lab.apt_dir.mkdir(parents=True, exist_ok=True)
    if not (lab.apt_dir / "InRelease").exists():
        # The stand-in NVIDIA apt repository the provisioning roles install from in the lab, signed
        # with the lab's own key (generated on the first build, kept in $LAB_DIR/apt-gnupg).
        _standin_apt().build(lab.apt_dir)
        log(f"built the stand-in apt repository in {lab.apt_dir}")
    ensure_key(lab)
    with flock(lab.dir / ".lock"):
        extra = sorted(p.name for p in (lab.dir / "hosts").glob("lab*")
                       if p.name not in {h.name for h in lab.hosts})
        if extra:
            log(f"hosts {', '.join(extra)} exist beyond LAB_HOSTS={lab.hosts_count}; "
                f"they are left as they are (`lab.py down` removes them)")
        started = []
        for host in lab.hosts:
            if host_running(host):
                for path in configure_host(lab, host, hardware_only=True):
                    log(f"{host.name}: updated {path}")
                continue
            if host.dir.exists():
                # Remains of a host whose supervisor or nspawn died: stop them; the rootfs is kept.
                leftovers = processes_in(container_pidns(host.dir))
                if leftovers or pid_alive(host.dir / "nspawn.pid", str(host.rootfs.resolve())):
                    log(f"{host.name}: stopping the remains of an earlier boot ({len(leftovers)} processes)")
                    stop_host(host.dir, timeout=30)
            check_address_free(host)
            create_host(lab, host)
            boot_host(lab, host)
            started.append(host)
        deadline = time.monotonic() + lab.boot_timeout
        states: dict[str, str] = {}
        errors: list[str] = []

        def wait(h: Host) -> None:
            try:
                states[h.name] = wait_booted(lab, h, deadline)
            except LabError as exc:
                errors.append(str(exc))

        threads = [threading.Thread(target=wait, args=(h,)) for h in lab.hosts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise LabError("; ".join(sorted(errors)))
        for host in lab.hosts:
            container_pidns(host.dir)  # remembered for `down`, should nspawn ever die first
        start_hub(lab)
        write_inventory(lab)
    for host in lab.hosts:
        note = "started" if host in started else "already running"
        print(f"{host.name}\t{host.address}\t{states[host.name]}\tgpus={host.gpu_count}\t{note}")
    log(f"up in {time.monotonic() - start:.1f}s; inventory {lab.inventory}")
    return 0


HUB_PORT = 8480


def hub_address(lab: Lab) -> tuple[str, int]:
    """Where the lab's stand-in of the Hugging Face hub listens (on the controller's loopback)."""
    return f"{lab.net}.254", HUB_PORT


def hub_running(lab: Lab) -> bool:
    host, port = hub_address(lab)
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def start_hub(lab: Lab) -> None:
    """Serve stand-in models for any ORG/NAME, so the models role's real download code runs."""
    if hub_running(lab):
        return
    host, port = hub_address(lab)
    log_file = open(lab.dir / "hub.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve().parent / "hub_standin.py"), "serve",
                             "--bind", host, "--port", str(port), "--synthesize"],
                            stdout=log_file, stderr=log_file, stdin=subprocess.DEVNULL, start_new_session=True)
    (lab.dir / "hub.pid").write_text(str(proc.pid))
    for _ in range(100):
        if hub_running(lab):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise LabError(f"the hub stand-in did not start on {host}:{port}; see {lab.dir / 'hub.log'}")


def stop_hub(lab: Lab) -> None:
    pid_file = lab.dir / "hub.pid"
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        pass
    pid_file.unlink(missing_ok=True)


def stop_host(host_dir: Path, timeout: float = 60) -> None:
    rootfs = (host_dir / "rootfs").resolve()
    pidns = container_pidns(host_dir)
    (host_dir / "stop").write_text("")
    sup = pid_alive(host_dir / "supervisor.pid", supervisor_marker(host_dir))
    nspawn = pid_alive(host_dir / "nspawn.pid", str(rootfs))
    # One SIGTERM reaches nspawn (through the supervisor, which then does not restart it): nspawn asks
    # the container's systemd to halt. A second SIGTERM would make nspawn kill the container at once.
    targets = [(sup, signal.SIGTERM)] if sup else [(nspawn, signal.SIGTERM)]
    if not nspawn:
        # nspawn died and left the container behind: ask its systemd to power off (what nspawn would do).
        targets.append((container_init(pidns), signal.SIGRTMIN + 4))
    for pid, sig in targets:
        if pid:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    start = time.monotonic()
    deadline = start + timeout
    while time.monotonic() < deadline:
        if not (pid_alive(host_dir / "supervisor.pid", supervisor_marker(host_dir))
                or pid_alive(host_dir / "nspawn.pid", str(rootfs)) or processes_in(pidns)):
            if nspawn or sup or pidns:
                log(f"{host_dir.name}: halted in {time.monotonic() - start:.1f}s")
            return
        time.sleep(0.2)
    log(f"{host_dir.name}: did not halt within {timeout:.0f}s; killing it")
    pids = ((host_dir / "supervisor.pid", supervisor_marker(host_dir)), (host_dir / "nspawn.pid", str(rootfs)))
    for pid_file, marker in pids:
        pid = pid_alive(pid_file, marker)
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for _ in range(50):
        left = processes_in(pidns)
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    raise LabError(f"{host_dir.name}: processes {left} inside {rootfs} survived SIGKILL")


def remove_host_dir(host: Host) -> None:
    target = str(host.dir.resolve())
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if line.split()[4] == target or line.split()[4].startswith(target + "/")]
    if mounts:
        raise LabError(f"{host.name}: {mounts[0]} is still mounted; unmount it before removing the host")
    must(["rm", "-rf", "--one-file-system", "--", target], f"removing {target}")


def down(lab: Lab) -> int:
    start = time.monotonic()
    hosts_dir = lab.dir / "hosts"
    with flock(lab.dir / ".lock") if lab.dir.exists() else _nullcontext():
        dirs = sorted(p for p in hosts_dir.iterdir() if p.is_dir()) if hosts_dir.is_dir() else []
        errors = []
        threads = []

        def stop(d: Path) -> None:
            try:
                stop_host(d)
            except LabError as exc:
                errors.append(str(exc))

        for d in dirs:
            threads.append(threading.Thread(target=stop, args=(d,)))
            threads[-1].start()
        for t in threads:
            t.join()
        if errors:
            raise LabError("; ".join(errors))
        removed = time.monotonic()
        for d in dirs:
            remove_host_dir(Host(0, d.name, "", 0, d))
        if dirs:
            log(f"removed {len(dirs)} host folders in {time.monotonic() - removed:.1f}s")
        if hosts_dir.exists():
            shutil.rmtree(hosts_dir)
        lab.inventory.unlink(missing_ok=True)
        deployer_inventory_path(lab).unlink(missing_ok=True)
        monitoring_inventory_path(lab).unlink(missing_ok=True)
        if lab.dir.exists():
            stop_hub(lab)
    names = ", ".join(d.name for d in dirs) or "no hosts"
    log(f"down in {time.monotonic() - start:.1f}s ({names}); the rootfs cache {lab.cache / 'rootfs'} is kept")
    return 0


@contextmanager
def _nullcontext():
    yield


def status(lab: Lab) -> int:
    ok = True
    for host in lab.hosts:
        if not host_running(host):
            print(f"{host.name}\t{host.address}\tstopped\t-")
            ok = False
            continue
        proc = ssh_cmd(lab, host, "systemctl is-system-running", timeout=15)
        state = proc.stdout.strip() or "unreachable"
        if state not in ("running", "degraded"):
            ok = False
        print(f"{host.name}\t{host.address}\trunning\t{state}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_supervise"]:
        return supervise(Path(argv[1]), argv[3:])
    parser = argparse.ArgumentParser(prog="lab.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down", "status"])
    args = parser.parse_args(argv)
    try:
        lab = load_config()
        return {"up": up, "down": down, "status": status}[args.action](lab)
    except LabError as exc:
        print(f"lab.py {args.action}: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print(f"lab.py {args.action}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
