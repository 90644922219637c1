"""The fleet router (issue 37 deliver 1): 3 GPU hosts + 1 router host, one sglang-router in front of all engines.

The file brings the lab to 4 hosts (LAB_HOSTS=4; the conftest's lab is left as it was at the end) and writes an
inventory with lab1-lab3 in gpu_hosts and lab4 in the group routers. `playbooks/deploy.yml` then runs
`playbooks/fleet_deploy.yml`: the pinned sglang-router on lab4 (port 31300) with the engine of every GPU host as
its workers; the canary (lab1) alone, out of the fleet router, gated also against the old engines through the fleet
router in the same window, back in; then the others max_unavailable at a time. Paced clients (concurrency 6, one
request a second each) go through the fleet router during (a) a switch b15 -> b32 with max_unavailable 2, (b) a
canary with the simulator's acceptance fault (rolled back, put back, the rollout stops; lab2 and lab3 untouched),
(c) `make rollback` (playbooks/rollback.yml), and must see no failed request. Once a second the test reads how
many engines the fleet router lists healthy: the capacity dip of each phase, printed and written to
build/lab-fleet-results.json. Simulated engine: proves plumbing, not GPU behaviour.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
LAB_CONFIGS = REPO / "tests" / "lab" / "configs"
RESULTS = REPO / "build" / "lab-fleet-results.json"
sys.path.insert(0, str(REPO / "collections"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import lab as labmod  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_router_api as api  # noqa: E402

PORT = 31300          # the engines' port on each GPU host and the fleet router's on the router host
GPU_HOSTS = ("lab1", "lab2", "lab3")
ROUTER_HOST = "lab4"
CONCURRENCY = 6
PACE_S = 1.0
MAX_SECONDS = 1500


def _cfg(name: str) -> str:
    return f"config={LAB_CONFIGS / f'{name}.yml'}"


@pytest.fixture(scope="module")
def fleet(lab):
    """The lab at 4 hosts, and a handle whose inventory has gpu_hosts lab1-lab3 and routers lab4."""
    env = {**lab.env, "LAB_HOSTS": str(max(4, lab.config.hosts_count))}
    proc = dataclasses.replace(lab, env=env).lab_py("up")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    big = labmod.load_config(env)
    inv = yaml.safe_load(big.inventory.read_text())
    hosts = inv["all"]["children"]["gpu_hosts"]["hosts"]
    fleet_inv = {"all": {"children": {
        "gpu_hosts": {"hosts": {h: hosts[h] for h in GPU_HOSTS}},
        "routers": {"hosts": {ROUTER_HOST: hosts[ROUTER_HOST]}}}}}
    path = big.inventory.with_name("inventory-fleet.yml")
    path.write_text(yaml.safe_dump(fleet_inv, sort_keys=False))
    handle = dataclasses.replace(lab, config=big, inventory=path, hosts=list(GPU_HOSTS))
    yield handle
    # The conftest's lab keeps its own inventory (lab.py up with 4 hosts rewrote it); lab3 and lab4 keep running
    # until `lab.py down`, which removes them.
    labmod.write_inventory(lab.config)


def _router_url(fleet) -> str:
    return f"http://{fleet.address(ROUTER_HOST)}:{PORT}"


def _engine_url(fleet, host: str) -> str:
    return f"http://{fleet.address(host)}:{PORT}"


def _router_key(fleet) -> str:
    text = fleet.ssh(ROUTER_HOST, f"cat {api.env_file(PORT)}").stdout
    return api.read_env_text(text)[api.CONTROL_KEY_VAR]


def _listed(fleet, key: str) -> dict[str, bool]:
    req = urllib.request.Request(_router_url(fleet) + "/workers", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return {w["url"]: w["is_healthy"] for w in json.loads(resp.read())["workers"]}


def _budget(fleet, host: str) -> int:
    out = fleet.ssh(host, f"curl -sf {_engine_url(fleet, host)}/get_server_info").stdout
    return json.loads(out)["speculative_ddtree_budget"]


def _active_since(fleet, host: str, unit: str) -> str:
    return fleet.ssh(host, f"systemctl show -p ActiveEnterTimestampMonotonic --value {unit}").stdout.strip()


class Load:
    """Paced clients through the fleet router, and once a second the number of engines it lists healthy."""

    def __init__(self, url: str, key: str):
        self.url, self.key = url, key
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.done: list[tuple[float, float, bool, str]] = []   # (end, latency, ok, detail)
        self.capacity: list[tuple[float, int]] = []           # (time, healthy engines listed)
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _client(self, worker: int) -> None:
        body = json.dumps({"text": f"Write one sentence about the sea ({worker}).",
                           "sampling_params": {"temperature": 0, "max_new_tokens": 24}}).encode()
        while not self.stop.is_set() and self.now() < MAX_SECONDS:
            req = urllib.request.Request(self.url + "/generate", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            sent = time.monotonic()
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:
                    ok, detail = resp.status == 200 and bool(json.loads(resp.read()).get("text")), str(resp.status)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                ok, detail = False, f"{type(exc).__name__}: {exc}"
            took = time.monotonic() - sent
            with self.lock:
                self.done.append((self.now(), took, ok, detail))
            self.stop.wait(max(0.0, PACE_S - took))

    def _sampler(self) -> None:
        while not self.stop.wait(1.0) and self.now() < MAX_SECONDS:
            try:
                req = urllib.request.Request(self.url + "/workers", headers={"Authorization": f"Bearer {self.key}"})
                with urllib.request.urlopen(req, timeout=5) as resp:
                    healthy = sum(1 for w in json.loads(resp.read())["workers"] if w["is_healthy"])
            except (urllib.error.URLError, OSError, ValueError):
                healthy = -1
            with self.lock:
                self.capacity.append((self.now(), healthy))

    def __enter__(self) -> Load:
        self.pool = ThreadPoolExecutor(CONCURRENCY + 1)
        self.futures = [self.pool.submit(self._client, w) for w in range(CONCURRENCY)]
        self.futures.append(self.pool.submit(self._sampler))
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for f in self.futures:
            f.result()
        self.pool.shutdown()

    def window(self, t_from: float, t_to: float) -> dict:
        with self.lock:
            done = [d for d in self.done if t_from <= d[0] < t_to]
            cap = [c for c in self.capacity if t_from <= c[0] < t_to]
        lat = sorted(d[1] for d in done if d[2])

        def pct(q: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(q * len(lat)))], 3) if lat else None

        seconds_at = {n: sum(1 for c in cap if c[1] == n) for n in sorted({c[1] for c in cap})}
        return {"seconds": round(t_to - t_from, 1), "requests": len(done), "failed": sum(1 for d in done if not d[2]),
                "first_failures": [d[3] for d in done if not d[2]][:3],
                "latency_p50_s": pct(0.5), "latency_p95_s": pct(0.95),
                "min_engines_in_router": min((c[1] for c in cap), default=None),
                "seconds_at_engines_in_router": seconds_at,
                "engine_seconds_lost": sum((len(GPU_HOSTS) - c[1]) for c in cap if c[1] >= 0)}


def _timed(fleet, load: Load, playbook: str, *args: str) -> tuple[dict, object]:
    start = load.now()
    proc = fleet.ansible_playbook(playbook, *args, check=False, timeout=1200)
    return {"playbook": playbook, "args": list(args[1::2]), "rc": proc.returncode,
            **load.window(start, load.now())}, proc


def test_a_fleet_that_does_not_fit_is_refused_before_any_change(fleet):
    proc = fleet.ansible_playbook("playbooks/deploy.yml", "-e", _cfg("lab-fleet-b15"), "-e", "fleet_max_unavailable=3",
                                  check=False, timeout=600)
    assert proc.returncode != 0
    assert ("FLEET REFUSED before any change: max_unavailable '3' is not allowed: use a whole number from 1 to 2, "
            "or a percentage") in proc.stdout, proc.stdout[-3000:]
    for host in GPU_HOSTS:
        assert fleet.ssh(host, "test -e /etc/systemd/system/sglang-lab-fleet-b15.service", check=False).returncode != 0
    assert fleet.ssh(ROUTER_HOST, f"test -e /etc/systemd/system/sglang-router-{PORT}.service",
                     check=False).returncode != 0


def test_fleet_switch_failed_canary_and_rollback_with_no_failed_request(fleet):
    first = fleet.ansible_playbook("playbooks/deploy.yml", "-e", _cfg("lab-fleet-b15"), "-e", "fleet_max_unavailable=2",
                                   timeout=1200)
    assert f"FLEET ROUTER on {ROUTER_HOST}: {_router_url(fleet)} in front of 3 engine(s)" in first.stdout, \
        first.stdout[-3000:]
    key = _router_key(fleet)
    engines = {_engine_url(fleet, h): True for h in GPU_HOSTS}
    assert _listed(fleet, key) == engines
    # The router runs as its dedicated user on lab4 and binds lab4's address only; no engine runs there.
    user = fleet.ssh(ROUTER_HOST, f"systemctl show -p User --value sglang-router-{PORT}.service").stdout.strip()
    assert user == "sglang-router"
    pid = fleet.ssh(ROUTER_HOST, f"systemctl show -p MainPID --value sglang-router-{PORT}.service").stdout.strip()
    listen = fleet.ssh(ROUTER_HOST, f"ss -Hltnp | grep 'pid={pid},'").stdout.split("\n")
    assert sorted(line.split()[3] for line in listen if line) == [f"{fleet.address(ROUTER_HOST)}:{p}"
                                                                 for p in (PORT - 1, PORT)], listen
    assert "sglang-lab-fleet" not in fleet.ssh(ROUTER_HOST, "systemctl list-units --all 'sglang-*'").stdout

    phases: dict[str, dict] = {}
    router_since = _active_since(fleet, ROUTER_HOST, f"sglang-router-{PORT}.service")
    with Load(_router_url(fleet), key) as load:
        time.sleep(15)
        phases["baseline"] = load.window(0, load.now())

        # (a) b15 -> b32: the canary lab1 alone, then lab2 and lab3 together (max_unavailable 2).
        phases["a_switch_b15_to_b32"], proc = _timed(fleet, load, "playbooks/deploy.yml", "-e", _cfg("lab-fleet-b32"),
                                                     "-e", "fleet_max_unavailable=2")
        assert proc.returncode == 0, proc.stdout[-4000:]
        assert "FLEET PLAN: 3 engine(s) of lab-fleet-b32 behind the fleet router on lab4" in proc.stdout
        assert "the canary (lab1) first, then 2 at a time" in proc.stdout
        assert "FLEET ENGINE on lab1 (the canary): lab-fleet-b32 deployed" in proc.stdout, proc.stdout[-4000:]
        for host in GPU_HOSTS:
            assert _budget(fleet, host) == 32
        # The canary was benched beside the old engines through the fleet router, in the same window.
        path = fleet.ssh("lab1", "ls -1 /var/lib/sglang-deploy/lab-fleet-b32/records/*.json | sort | tail -1").stdout
        record = json.loads(fleet.ssh("lab1", f"cat {path.strip()}").stdout)
        assert record["same_window"]["url"] == _router_url(fleet), record.get("same_window")
        assert record["same_window"]["bench"]["completed"] > 0
        assert _listed(fleet, key) == engines

        # (b) a canary with the acceptance fault: rolled back on lab1, put back; lab2 and lab3 untouched.
        since = {h: _active_since(fleet, h, "sglang-lab-fleet-b32.service") for h in ("lab2", "lab3")}
        phases["b_failed_canary"], proc = _timed(fleet, load, "playbooks/deploy.yml",
                                                 "-e", _cfg("lab-fleet-b32-accept-fault"))
        assert proc.returncode != 0
        assert "FLEET ROLLOUT STOPPED on lab1 (the canary)" in proc.stdout, proc.stdout[-4000:]
        assert "put back into the fleet router" in proc.stdout
        assert f"below the old replica in the same window ({_router_url(fleet)})" in proc.stdout, proc.stdout[-4000:]
        assert _budget(fleet, "lab1") == 32
        for host in ("lab2", "lab3"):
            assert _active_since(fleet, host, "sglang-lab-fleet-b32.service") == since[host]
        assert _listed(fleet, key) == engines

        # (c) make rollback: each engine out, back to b15, back in, one at a time.
        phases["c_rollback"], proc = _timed(fleet, load, "playbooks/rollback.yml", "-e", _cfg("lab-fleet-b32"))
        assert proc.returncode == 0, proc.stdout[-4000:]
        for host in GPU_HOSTS:
            assert f"FLEET ENGINE ROLLED BACK on {host}: {_engine_url(fleet, host)}, out of the fleet router" \
                in proc.stdout, proc.stdout[-4000:]
            assert _budget(fleet, host) == 15
        assert _listed(fleet, key) == engines
        time.sleep(5)

    failed = [d for d in load.done if not d[2]]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"requests": len(load.done), "failed": len(failed), "concurrency": CONCURRENCY,
                                   "pace_s": PACE_S, "engines": len(GPU_HOSTS), "phases": phases,
                                   "capacity": load.capacity}, indent=1) + "\n")
    for name, phase in phases.items():
        print(f"{name}: {phase['seconds']} s, {phase['requests']} requests, {phase['failed']} failed, p50 "
              f"{phase['latency_p50_s']} s, p95 {phase['latency_p95_s']} s, engines in the fleet router (healthy): "
              f"min {phase['min_engines_in_router']}, seconds at each count {phase['seconds_at_engines_in_router']}, "
              f"engine-seconds lost {phase['engine_seconds_lost']}")
    assert not failed, f"{len(failed)} of {len(load.done)} requests failed, first: {failed[:3]}"
    for name, phase in phases.items():
        assert phase["requests"] >= 30 and phase["failed"] == 0, (name, phase)
    # The dip: two engines out at once in the switch's batch, one during the canary and the rollback; never none.
    assert phases["a_switch_b15_to_b32"]["min_engines_in_router"] == 1, phases["a_switch_b15_to_b32"]
    assert phases["b_failed_canary"]["min_engines_in_router"] == 2, phases["b_failed_canary"]
    assert phases["c_rollback"]["min_engines_in_router"] == 2, phases["c_rollback"]
    # The fleet router never restarted through all of it.
    assert _active_since(fleet, ROUTER_HOST, f"sglang-router-{PORT}.service") == router_since
    # make status names the fleet router and its engines.
    status = fleet.ansible_playbook("playbooks/status.yml", timeout=600)
    assert (f"{ROUTER_HOST} fleet router: sglang-router-{PORT}.service active on {fleet.address(ROUTER_HOST)}:{PORT}: "
            "3 of 3 replica(s) healthy in the router") in status.stdout, status.stdout[-3000:]
    # testinfra's router checks (user, hardening, the pinned wheel, listeners, every engine healthy) hold on the
    # router host as on a GPU host's router.
    verify = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                             "tests/infra/test_router.py", "--hosts=ansible://routers",
                             f"--ansible-inventory={fleet.inventory}"], cwd=REPO, env=fleet.ansible_env(), text=True,
                            capture_output=True, timeout=600, stdin=subprocess.DEVNULL)
    assert verify.returncode == 0 and "4 passed" in verify.stdout, verify.stdout[-3000:] + verify.stderr[-2000:]
