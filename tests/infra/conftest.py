"""Shared fixtures of the testinfra checks (`make verify`).

    pytest tests/infra --hosts=ansible://gpu_hosts,ansible://routers --ansible-inventory=INVENTORY [--config=NAME]

`--config NAME` (repeatable, or comma-separated) names the configs whose service is checked on every
host. Without it, each host is checked for every config that its deploy state says runs there
(`/var/lib/sglang-deploy/*/current.json`); a host where nothing is deployed skips the service checks
and says why. The driver checks (test_nvidia.py) do not use these fixtures.

A host without the NVIDIA driver package (never provisioned: `make deploy` alone does not provision)
does not run the driver checks, which would all fail: the run ends with one line naming those hosts
and `make provision`, and exits 1 (the driver was not verified). A fleet router's host (inventory group
routers, not gpu_hosts) runs only the router checks (test_router.py): no engine, no GPU there.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

STATE_ROOT = "/var/lib/sglang-deploy"
RELEASES = "/opt/sglang/releases"
ENV_DIR = "/etc/sglang"


def pytest_addoption(parser):
    group = parser.getgroup("sgdeploy", "sgdeploy verify")
    group.addoption("--config", action="append", dest="sglang_configs", default=[], metavar="NAME",
                    help="check the service of this config (repeatable or comma-separated); default: every "
                         f"config that {STATE_ROOT}/*/current.json says runs on the host")


def pytest_configure(config):
    # testinfra's ansible backend runs `ansible-inventory`: find it next to this interpreter (the project's
    # .venv) when it is not on PATH, so that `.venv/bin/python -m pytest tests/infra ...` works as is.
    bindir = str(Path(sys.executable).parent)
    if not shutil.which("ansible-inventory") and shutil.which("ansible-inventory", path=bindir):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


NOT_PROVISIONED = "_sgdeploy_not_provisioned"


def _unprovisioned(host) -> str | None:
    """Why the host has no driver to check (its driver package is not installed), or None. None too when
    the host cannot be asked: the checks then fail as they should, naming the problem."""
    try:
        hostvars = host.ansible.get_variables()
        branch = hostvars.get("nvidia_driver_branch", 580)
        packages = hostvars.get("nvidia_driver_packages") or [f"nvidia-open-{branch}"]
        package = str(packages[0])
        status = host.run(f"dpkg-query -W -f '${{Status}}' {package}")
    except Exception:  # noqa: BLE001 - unreachable or misconfigured: let the checks say it
        return None
    if status.rc == 0 and status.stdout.endswith(" installed"):
        return None
    return f"{package} is not installed"


def router_only(host) -> bool:
    """A host of the inventory group routers and not of gpu_hosts (a fleet router's host, docs/router.md): it runs no
    engine and has no GPU, so only the router checks (test_router.py) apply to it."""
    try:
        groups = host.ansible.get_variables().get("group_names", [])
    except Exception:  # noqa: BLE001 - unreachable or misconfigured: let the checks say it
        return False
    return "routers" in groups and "gpu_hosts" not in groups


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items):
    """Leave out the driver checks of hosts that were never provisioned (one line at the end says so), and the
    engine and driver checks of a fleet router's host (`make verify` checks the group routers too)."""
    checked: dict[str, str | None] = {}
    routers: dict[str, bool] = {}
    keep, dropped, not_here = [], [], []
    for item in items:
        host = getattr(item, "callspec", None) and item.callspec.params.get("_testinfra_host")
        if host is None or item.path.name not in ("test_nvidia.py", "test_service.py"):
            keep.append(item)
            continue
        name = host_name(host)
        if name not in routers:
            routers[name] = router_only(host)
        if routers[name]:
            not_here.append(item)
            continue
        if item.path.name != "test_nvidia.py":
            keep.append(item)
            continue
        if name not in checked:
            checked[name] = _unprovisioned(host)
        (dropped if checked[name] else keep).append(item)
    if dropped or not_here:
        items[:] = keep
        config.hook.pytest_deselected(items=dropped + not_here)
    if dropped:
        setattr(config, NOT_PROVISIONED, {n: why for n, why in checked.items() if why})


def pytest_sessionfinish(session, exitstatus):
    if getattr(session.config, NOT_PROVISIONED, None) and exitstatus in (0, 5):
        session.exitstatus = 1


def pytest_unconfigure(config):
    missing = getattr(config, NOT_PROVISIONED, None)
    if missing:
        hosts = sorted(missing)
        reasons = sorted(set(missing.values()))
        print(f"NOT PROVISIONED: {', '.join(hosts)} ({'; '.join(reasons)}): the driver checks were not run; "
              f"run `make provision` (with the same INVENTORY=), then `make verify` again", flush=True)


def wanted_configs(config) -> list[str]:
    names: list[str] = []
    for value in config.getoption("sglang_configs") or []:
        names += [n.strip() for n in value.split(",") if n.strip()]
    return list(dict.fromkeys(names))


@dataclass
class Deployment:
    """One config that the host's deploy state says runs there (its current.json)."""

    host_name: str
    config: str
    current: dict
    state_root: str = STATE_ROOT

    @property
    def unit(self) -> str:
        return self.current.get("unit_name") or f"sglang-{self.config}.service"

    @property
    def release(self) -> str:
        return self.current["release"]

    @property
    def release_dir(self) -> str:
        return self.current.get("release_dir") or f"{RELEASES}/{self.release}"

    @property
    def bind_address(self) -> str:
        return self.current["bind_address"]

    @property
    def port(self) -> int:
        return int(self.current["ports"][0])

    @property
    def state_dir(self) -> str:
        return f"{self.state_root}/{self.config}"

    @property
    def env_file(self) -> str:
        return self.current.get("env_file") or f"{ENV_DIR}/{self.config}.env"

    @property
    def service_user(self) -> str:
        return self.current.get("service_user") or "sglang"

    def __str__(self) -> str:
        return f"{self.host_name}: {self.config}"


def read_json(host, path: str) -> dict | None:
    """The JSON document at `path` on the host, or None when it is missing or not JSON."""
    f = host.file(path)
    if not f.exists:
        return None
    try:
        return json.loads(f.content_string)
    except ValueError:
        return None


def host_name(host) -> str:
    """The inventory name (`gpu-01`), not the pytest id (`ansible://gpu-01`)."""
    name = getattr(host.backend, "host", None)
    return name if isinstance(name, str) and name else host.backend.get_pytest_id()


@pytest.fixture(scope="module")
def hostvars(host) -> dict:
    return host.ansible.get_variables()


@pytest.fixture(scope="module")
def deployments(host, request) -> list[Deployment]:
    """The configs to check on this host; a failure when a --config named one that is not deployed."""
    name = host_name(host)
    # An unreachable host must fail, not look like a host where nothing is deployed.
    try:
        probe = host.run("echo sgdeploy-verify-reachable")
        reached = probe.stdout.strip() == "sgdeploy-verify-reachable"
        detail = (probe.stderr.strip().splitlines() or [f"exit status {probe.rc}"])[-1]
    except RuntimeError as exc:  # testinfra raises when ssh itself fails (exit 255)
        reached, detail = False, getattr(exc.args[0], "stderr", str(exc)).strip() if exc.args else str(exc)
    if not reached:
        pytest.fail(f"{name}: cannot run a command on the host: {detail}", pytrace=False)
    # The deploy role's state folder (inventory sglang_deploy_state_dir), as the deploy used it.
    root = str(host.ansible.get_variables().get("sglang_deploy_state_dir") or STATE_ROOT)
    wanted = wanted_configs(request.config)
    if wanted:
        out, missing = [], []
        for config in wanted:
            current = read_json(host, f"{root}/{config}/current.json")
            if current is None:
                missing.append(config)
            else:
                out.append(Deployment(name, config, current, root))
        if missing:
            pytest.fail(f"{name}: {', '.join(missing)} not deployed: no readable {root}/<config>/current.json "
                        "(never deployed green here, or replaced by another config; `make status` shows what runs)",
                        pytrace=False)
        return out
    listing = host.run(f"ls -1d {root}/*/current.json 2>/dev/null")
    out = []
    for path in sorted(listing.stdout.split()):
        current = read_json(host, path)
        if current is not None:
            out.append(Deployment(name, path.split("/")[-2], current, root))
    if not out:
        pytest.skip(f"{name}: nothing deployed (no {root}/*/current.json); service checks skipped")
    return out
