"""Fixtures shared by every lab test: the `lab` session fixture and its ssh/ansible helpers.

The lab is chosen by the same environment variables as `tests/lab/lab.py` (LAB_HOSTS, LAB_NET, LAB_DIR,
LAB_INVENTORY, LAB_GPU_COUNTS). The fixture runs `lab.py up` (quick when the hosts already run) and
leaves the hosts running at the end: `make lab-down` (or `lab.py down` with the same environment)
takes them down.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
LAB_PY = HERE / "lab.py"
BIN = Path(sys.executable).parent

sys.path.insert(0, str(HERE))
import lab as labmod  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "lab: needs the lab hosts (make lab-up)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.lab)


def _tail(proc: subprocess.CompletedProcess, lines: int = 40) -> str:
    text = ((proc.stdout or "") + "\n" + (proc.stderr or "")).strip().splitlines()
    return "\n".join(text[-lines:])


@dataclass
class LabHandle:
    """A running lab: its inventory, hosts and helpers that reach them for real (ssh, ansible)."""

    config: labmod.Lab
    inventory: Path
    hosts: list[str]
    key: Path
    env: dict[str, str] = field(default_factory=dict, repr=False)

    def host(self, name: str) -> labmod.Host:
        for h in self.config.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no lab host {name!r}; hosts are {self.hosts}")

    def address(self, name: str) -> str:
        return self.host(name).address

    def lab_py(self, action: str, check: bool = False, timeout: float = 900) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, str(LAB_PY), action], env=self.env, text=True,
                              capture_output=True, timeout=timeout, cwd=REPO)
        if check and proc.returncode != 0:
            raise AssertionError(f"lab.py {action} exited {proc.returncode}:\n{_tail(proc)}")
        return proc

    def ssh(self, name: str, command: str, check: bool = True, timeout: float = 120,
            input: str | None = None) -> subprocess.CompletedProcess:
        cmd = ["ssh", "-i", str(self.key), *labmod.SSH_OPTS, f"root@{self.address(name)}", command]
        proc = subprocess.run(cmd, text=True, capture_output=True, timeout=timeout,
                              input=input, stdin=None if input is not None else subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise AssertionError(f"ssh {name} {command!r} exited {proc.returncode}:\n{_tail(proc)}")
        return proc

    def remove_configs(self, name: str, prefix: str, router_port: int | None = None) -> list[str]:
        """Stop and remove, on host ``name``, every deploy whose config starts with ``prefix`` (replicas too) and
        the router on ``router_port``: a file that shares a lab with others leaves its GPUs and ports free for the
        next file. The host's unit, env and state folders are listed first; exactly the entries of those configs
        (units and their drop-ins, env files, state folders) and of that router (unit, env file) are removed.
        Returns the paths removed."""
        dirs = {"units": "/etc/systemd/system", "env": "/etc/sglang", "state": "/var/lib/sglang-deploy"}
        listing = self.ssh(name, "; ".join(f"echo '== {key}'; ls -1A {path} 2>/dev/null" for key, path in dirs.items()),
                           timeout=120).stdout
        found: dict[str, list[str]] = {}
        key = None
        for line in listing.splitlines():
            if line.startswith("== "):
                key = line[3:]
                found[key] = []
            elif key and line:
                found[key].append(line)
        router_unit = f"sglang-router-{router_port}.service" if router_port else None
        router_env = f"router-{router_port}.env" if router_port else None
        units = [e for e in found.get("units", []) if (e.startswith(f"sglang-{prefix}") and e.endswith(".service"))
                 or e == router_unit]
        drop_ins = [e for e in found.get("units", []) if e.startswith(f"sglang-{prefix}") and e.endswith(".service.d")]
        paths = [f"{dirs['units']}/{e}" for e in units + drop_ins]
        paths += [f"{dirs['env']}/{e}" for e in found.get("env", []) if e.startswith(prefix) or e == router_env]
        paths += [f"{dirs['state']}/{e}" for e in found.get("state", []) if e.startswith(prefix)]
        if not paths:
            return []
        steps = [f"systemctl disable --now {' '.join(shlex.quote(u) for u in units)}"] if units else []
        steps += [f"rm -rf -- {' '.join(shlex.quote(p) for p in paths)}", "systemctl daemon-reload"]
        self.ssh(name, " && ".join(steps), timeout=300)
        return paths

    def ansible_env(self) -> dict[str, str]:
        env = dict(self.env)
        env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
        env.setdefault("ANSIBLE_NOCOLOR", "1")
        env.pop("ANSIBLE_FORCE_COLOR", None)
        env.setdefault("ANSIBLE_HOST_KEY_CHECKING", "False")
        cfg = REPO / "ansible.cfg"
        if cfg.exists():
            env["ANSIBLE_CONFIG"] = str(cfg)
        return env

    def ansible_playbook(self, playbook: str | os.PathLike, *args: str, extra_vars: dict | None = None,
                         check: bool = True, timeout: float = 1800) -> subprocess.CompletedProcess:
        path = Path(playbook)
        path = path if path.is_absolute() else REPO / path
        cmd = [str(BIN / "ansible-playbook"), "-i", str(self.inventory), str(path), *args]
        if extra_vars:
            cmd += ["-e", json.dumps(extra_vars)]
        proc = subprocess.run(cmd, env=self.ansible_env(), text=True, capture_output=True, cwd=REPO,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise AssertionError(f"ansible-playbook {path.name} exited {proc.returncode}:\n{_tail(proc)}")
        return proc

    def ansible(self, pattern: str, module: str, args: str = "", *extra: str, check: bool = True,
                timeout: float = 600) -> subprocess.CompletedProcess:
        cmd = [str(BIN / "ansible"), "-i", str(self.inventory), pattern, "-m", module]
        if args:
            cmd += ["-a", args]
        cmd += list(extra)
        proc = subprocess.run(cmd, env=self.ansible_env(), text=True, capture_output=True, cwd=REPO,
                              timeout=timeout, stdin=subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise AssertionError(f"ansible {pattern} -m {module} exited {proc.returncode}:\n{_tail(proc)}")
        return proc


@pytest.fixture(scope="session")
def lab() -> LabHandle:
    if os.geteuid() != 0:
        pytest.fail("the lab needs root (systemd-nspawn); run the lab tests as root", pytrace=False)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    try:
        config = labmod.load_config(env)
    except labmod.LabError as exc:
        pytest.fail(f"bad lab environment: {exc}", pytrace=False)
    handle = LabHandle(config=config, inventory=config.inventory, hosts=[h.name for h in config.hosts],
                       key=config.key, env=env)
    proc = handle.lab_py("up")
    if proc.returncode != 0:
        pytest.fail(f"lab.py up exited {proc.returncode}:\n{_tail(proc)}", pytrace=False)
    return handle
