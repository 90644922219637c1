"""The fleet router (issue 37 deliver 1): 3 GPU hosts + 2 router hosts, each sglang-router in front of all engines.

The file brings the lab to 5 hosts (LAB_HOSTS=5; the conftest's lab is left as it was at the end) and writes an
inventory with lab1-lab3 in gpu_hosts and lab4 and lab5 in the group routers (a router pair). `playbooks/deploy.yml`
then runs `playbooks/fleet_deploy.yml`: the pinned sglang-router on lab4 and on lab5 (port 31300), each with the
engine of every GPU host as its workers; the canary (lab1) alone, out of both fleet routers, gated also against the
old engines through the first fleet router in the same window, back into both; then the others max_unavailable at a
time. tests/lab/test_router.py's paced clients (its `Load`: concurrency 8, one request a second each, alternating
between the two routers) go through the fleet routers during (a) a switch
b15 -> b32 with max_unavailable 2, (b) a canary with the simulator's acceptance fault (rolled back, put back, the
rollout stops; lab2 and lab3 untouched), (c) `make rollback` with max_unavailable 2 (playbooks/rollback.yml), and
must see no failed request. Once a second the load reads how many engines each fleet router lists healthy: the
capacity dip of each phase, printed and written to build/lab-fleet-results.json. The phases follow each other
without pauses (no separate baseline window), each on what the one before left. Then serving.replicas 2 behind the
routers (port 31400; its switch at max_unavailable 50%; make verify's router checks after it), a change of that
replica count refused before any change, `make rollback` of the replicas through both routers under the load, and a
watched canary (31300) whose acceptance collapses under the load: watched while back in both routers,
rolled back, 0 failed requests. Simulated engine: proves plumbing, not GPU behaviour.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import time
import urllib.request
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
from test_router import CONCURRENCY, PACE_S, Load  # noqa: E402  (paced clients, capacity read once a second)

PORT = 31300          # the engines' port on each GPU host and the fleet router's on the router host
GPU_HOSTS = ("lab1", "lab2", "lab3")
ROUTER_HOSTS = ("lab4", "lab5")
ROUTER_HOST = ROUTER_HOSTS[0]   # the first router: the canary's same-window gate reads the old engines through it


def _cfg(name: str) -> str:
    return f"config={LAB_CONFIGS / f'{name}.yml'}"


@pytest.fixture(scope="module")
def fleet(lab):
    """The lab at 5 hosts, and a handle whose inventory has gpu_hosts lab1-lab3 and routers lab4 and lab5."""
    env = {**lab.env, "LAB_HOSTS": str(max(5, lab.config.hosts_count))}
    proc = dataclasses.replace(lab, env=env).lab_py("up")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    big = labmod.load_config(env)
    inv = yaml.safe_load(big.inventory.read_text())
    hosts = inv["all"]["children"]["gpu_hosts"]["hosts"]
    fleet_inv = {"all": {"children": {
        "gpu_hosts": {"hosts": {h: hosts[h] for h in GPU_HOSTS}},
        "routers": {"hosts": {h: hosts[h] for h in ROUTER_HOSTS}}}}}
    path = big.inventory.with_name("inventory-fleet.yml")
    path.write_text(yaml.safe_dump(fleet_inv, sort_keys=False))
    handle = dataclasses.replace(lab, config=big, inventory=path, hosts=list(GPU_HOSTS))
    yield handle
    # The conftest's lab keeps its own inventory (lab.py up with 5 hosts rewrote it); lab3 to lab5 keep running
    # until `lab.py down`, which removes them.
    labmod.write_inventory(lab.config)


def _router_url(fleet, host: str = ROUTER_HOST) -> str:
    return f"http://{fleet.address(host)}:{PORT}"


def _engine_url(fleet, host: str) -> str:
    return f"http://{fleet.address(host)}:{PORT}"


def _router_key(fleet, host: str = ROUTER_HOST) -> str:
    text = fleet.ssh(host, f"cat {api.env_file(PORT)}").stdout
    return api.read_env_text(text)[api.CONTROL_KEY_VAR]


def _listed(fleet, keys: dict[str, str]) -> dict[str, dict[str, bool]]:
    """Each fleet router's workers (URL -> healthy), by router host."""
    out = {}
    for host, key in keys.items():
        req = urllib.request.Request(_router_url(fleet, host) + "/workers", headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            out[host] = {w["url"]: w["is_healthy"] for w in json.loads(resp.read())["workers"]}
    return out


def _budget(fleet, host: str) -> int:
    out = fleet.ssh(host, f"curl -sf {_engine_url(fleet, host)}/get_server_info").stdout
    return json.loads(out)["speculative_ddtree_budget"]


def _active_since(fleet, host: str, unit: str) -> str:
    return fleet.ssh(host, f"systemctl show -p ActiveEnterTimestampMonotonic --value {unit}").stdout.strip()


def _phase(load: Load, t_from: float, t_to: float) -> dict:
    """test_router's window of the clients and the routers, in engines: the fewest each router listed healthy, and
    the first router's seconds at each count and engine-seconds lost (the second router's are the same shape)."""
    out = load.window(t_from, t_to)
    out["min_engines_in_router"] = out.pop("min_replicas_in_router")
    with load.lock:
        cap = [c for c in load.capacity if t_from <= c[0] < t_to]
        failures = [d[4] for d in load.done if t_from <= d[0] < t_to and not d[3]]
    first = [c[2] for c in cap if c[1] == load.routers[0]]
    return {**out, "first_failures": failures[:3],
            "min_engines_in_each_router": {u.split("//")[1]: min((c[2] for c in cap if c[1] == u), default=None)
                                           for u in load.routers},
            "seconds_at_engines_in_router": {n: first.count(n) for n in sorted(set(first))},
            "engine_seconds_lost": sum(len(GPU_HOSTS) - n for n in first if n >= 0)}


def _timed(fleet, load: Load, playbook: str, *args: str) -> tuple[dict, object]:
    start = load.now()
    proc = fleet.ansible_playbook(playbook, *args, check=False, timeout=1200)
    return {"playbook": playbook, "args": list(args[1::2]), "rc": proc.returncode,
            **_phase(load, start, load.now())}, proc


def _engine_order(stdout: str, prefix: str) -> list[str]:
    """The GPU hosts (with a replica's deploy name) in the order of their lines that start with ``prefix`` in the
    playbook's output (each a debug task's "msg")."""
    return re.findall(r'"msg": "' + re.escape(prefix) + r'(lab\d(?: [\w-]+-r\d)?)[ :]', stdout)


def _sample_after(load: Load, t: float, timeout: float = 10.0) -> None:
    """Until the load's sampler has read every router once after load time ``t`` (it reads them once a second: a
    playbook that ends within a second of its last router change would otherwise leave that change unread)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with load.lock:
            if {c[1] for c in load.capacity if c[0] > t} >= set(load.routers):
                return
        time.sleep(0.2)


def test_a_fleet_that_does_not_fit_is_refused_before_any_change(fleet):
    proc = fleet.ansible_playbook("playbooks/deploy.yml", "-e", _cfg("lab-fleet-b15"), "-e", "fleet_max_unavailable=3",
                                  check=False, timeout=600)
    assert proc.returncode != 0
    assert ("FLEET REFUSED before any change: max_unavailable '3' is not allowed: use a whole number from 1 to 2, "
            "or a percentage") in proc.stdout, proc.stdout[-3000:]
    for host in GPU_HOSTS:
        assert fleet.ssh(host, "test -e /etc/systemd/system/sglang-lab-fleet-b15.service", check=False).returncode != 0
    for host in ROUTER_HOSTS:
        assert fleet.ssh(host, f"test -e /etc/systemd/system/sglang-router-{PORT}.service", check=False).returncode != 0


def test_fleet_switch_failed_canary_and_rollback_with_no_failed_request(fleet):
    steps: dict[str, float] = {}
    started = time.monotonic()
    first = fleet.ansible_playbook("playbooks/deploy.yml", "-e", _cfg("lab-fleet-b15"), "-e", "fleet_max_unavailable=2",
                                   timeout=1200)
    steps["first_deploy"] = round(time.monotonic() - started, 1)
    assert "FLEET PLAN: 3 engine(s) of lab-fleet-b15 behind 2 fleet routers, on lab4" in first.stdout, \
        first.stdout[-3000:]
    for host in ROUTER_HOSTS:
        assert f"FLEET ROUTER on {host}: {_router_url(fleet, host)} in front of 3 engine(s)" in first.stdout, \
            first.stdout[-3000:]
    keys = {host: _router_key(fleet, host) for host in ROUTER_HOSTS}
    engines = {_engine_url(fleet, h): True for h in GPU_HOSTS}
    every = {host: engines for host in ROUTER_HOSTS}   # every router lists every engine, healthy
    assert _listed(fleet, keys) == every
    # Each router runs as its dedicated user on its host and binds that host's address only; no engine runs there.
    for host in ROUTER_HOSTS:
        user = fleet.ssh(host, f"systemctl show -p User --value sglang-router-{PORT}.service").stdout.strip()
        assert user == "sglang-router"
        pid = fleet.ssh(host, f"systemctl show -p MainPID --value sglang-router-{PORT}.service").stdout.strip()
        listen = fleet.ssh(host, f"ss -Hltnp | grep 'pid={pid},'").stdout.split("\n")
        assert sorted(line.split()[3] for line in listen if line) == [f"{fleet.address(host)}:{p}"
                                                                     for p in (PORT - 1, PORT)], listen
        assert "sglang-lab-fleet" not in fleet.ssh(host, "systemctl list-units --all 'sglang-*'").stdout

    phases: dict[str, dict] = {}
    router_since = {h: _active_since(fleet, h, f"sglang-router-{PORT}.service") for h in ROUTER_HOSTS}
    routers = {_router_url(fleet, h): keys[h] for h in ROUTER_HOSTS}
    with Load(list(routers), routers, full=len(GPU_HOSTS)) as load:
        # (a) b15 -> b32: the canary lab1 alone, then lab2 and lab3 together (max_unavailable 2).
        phases["a_switch_b15_to_b32"], proc = _timed(fleet, load, "playbooks/deploy.yml", "-e", _cfg("lab-fleet-b32"),
                                                     "-e", "fleet_max_unavailable=2")
        assert proc.returncode == 0, proc.stdout[-4000:]
        assert "FLEET PLAN: 3 engine(s) of lab-fleet-b32 behind 2 fleet routers, on lab4" in proc.stdout
        assert "the canary (lab1) first, then 2 at a time" in proc.stdout
        assert (f"FLEET ENGINE on lab1 (the canary): lab-fleet-b32 deployed at {_engine_url(fleet, 'lab1')}, out of "
                "the 2 fleet routers") in proc.stdout, proc.stdout[-4000:]
        # The plan's order: the canary's step ran (and ended) before any other engine's (before the fix of step.yml a
        # later step ran first whenever lab1's result of the step loop came back last).
        order = _engine_order(proc.stdout, "FLEET ENGINE on ")
        assert order[0] == "lab1" and sorted(order[1:]) == ["lab2", "lab3"], proc.stdout[-4000:]
        for host in GPU_HOSTS:
            assert _budget(fleet, host) == 32
        # The canary was benched beside the old engines through the fleet router, in the same window.
        path = fleet.ssh("lab1", "ls -1 /var/lib/sglang-deploy/lab-fleet-b32/records/*.json | sort | tail -1").stdout
        record = json.loads(fleet.ssh("lab1", f"cat {path.strip()}").stdout)
        assert record["same_window"]["url"] == _router_url(fleet), record.get("same_window")
        assert record["same_window"]["bench"]["completed"] > 0
        assert _listed(fleet, keys) == every

        # (b) a canary with the acceptance fault: rolled back on lab1, put back; lab2 and lab3 untouched.
        since = {h: _active_since(fleet, h, "sglang-lab-fleet-b32.service") for h in ("lab2", "lab3")}
        phases["b_failed_canary"], proc = _timed(fleet, load, "playbooks/deploy.yml",
                                                 "-e", _cfg("lab-fleet-b32-accept-fault"))
        assert proc.returncode != 0
        assert "FLEET ROLLOUT STOPPED on lab1 (the canary)" in proc.stdout, proc.stdout[-4000:]
        assert "it was rolled back and put back into the 2 fleet routers" in proc.stdout, proc.stdout[-4000:]
        assert f"below the old replica in the same window ({_router_url(fleet)})" in proc.stdout, proc.stdout[-4000:]
        assert _budget(fleet, "lab1") == 32
        for host in ("lab2", "lab3"):
            assert _active_since(fleet, host, "sglang-lab-fleet-b32.service") == since[host]
        assert _listed(fleet, keys) == every

        # (c) make rollback MAX_UNAVAILABLE=2: lab1 and lab2 out, back to b15, back in; then lab3.
        phases["c_rollback"], proc = _timed(fleet, load, "playbooks/rollback.yml", "-e", _cfg("lab-fleet-b32"),
                                            "-e", "fleet_max_unavailable=2")
        assert proc.returncode == 0, proc.stdout[-4000:]
        for host in GPU_HOSTS:
            assert f"FLEET ENGINE ROLLED BACK on {host}: {_engine_url(fleet, host)}, out of the 2 fleet routers" \
                in proc.stdout, proc.stdout[-4000:]
            assert _budget(fleet, host) == 15
        # lab1 and lab2 (the first step, together) before lab3.
        assert sorted(_engine_order(proc.stdout, "FLEET ENGINE ROLLED BACK on ")[:2]) == ["lab1", "lab2"], \
            proc.stdout[-4000:]
        assert _listed(fleet, keys) == every

    failed = [d for d in load.done if not d[3]]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"requests": len(load.done), "failed": len(failed), "concurrency": CONCURRENCY,
                                   "pace_s": PACE_S, "engines": len(GPU_HOSTS), "phases": phases,
                                   "routers": list(routers), "steps": steps, "capacity": load.capacity},
                                  indent=1) + "\n")
    for name, phase in phases.items():
        print(f"{name}: {phase['seconds']} s, {phase['requests']} requests, {phase['failed']} failed, p50 "
              f"{phase['latency_p50_s']} s, p95 {phase['latency_p95_s']} s, engines in the fleet router (healthy): "
              f"min {phase['min_engines_in_each_router']}, seconds at each count (lab4) "
              f"{phase['seconds_at_engines_in_router']}, "
              f"engine-seconds lost {phase['engine_seconds_lost']}")
    assert not failed, f"{len(failed)} of {len(load.done)} requests failed, first: {failed[:3]}"
    for name, phase in phases.items():
        assert phase["requests"] >= 30 and phase["failed"] == 0, (name, phase)
    # The dip, in both routers (an engine leaves every router): two engines out at once in the switch's and the
    # rollback's batch of two, one during the canary; never none.
    for name, fewest in (("a_switch_b15_to_b32", 1), ("b_failed_canary", 2), ("c_rollback", 1)):
        assert set(phases[name]["min_engines_in_each_router"].values()) == {fewest}, (name, phases[name])
    # No fleet router restarted through all of it.
    assert {h: _active_since(fleet, h, f"sglang-router-{PORT}.service") for h in ROUTER_HOSTS} == router_since
    # make status names each fleet router and its engines.
    started = time.monotonic()
    status = fleet.ansible_playbook("playbooks/status.yml", timeout=600)
    steps["status"] = round(time.monotonic() - started, 1)
    for host in ROUTER_HOSTS:
        assert (f"{host} fleet router: sglang-router-{PORT}.service active on {fleet.address(host)}:{PORT}: "
                "3 of 3 replica(s) healthy in the router") in status.stdout, status.stdout[-3000:]
    # make verify's testinfra run on the group routers (the Makefile runs gpu_hosts and routers in one run): on the
    # router host only the router checks run (user, hardening, the pinned wheel, listeners, every engine healthy, and
    # the engine of every GPU host listed); the engine and driver checks are left out there.
    started = time.monotonic()
    verify = _verify_routers(fleet, fleet.inventory)
    steps["verify_routers"] = round(time.monotonic() - started, 1)
    print(f"steps outside the load phases: {steps}")
    assert verify.returncode == 0 and "10 passed" in verify.stdout and "failed" not in verify.stdout, \
        verify.stdout[-3000:] + verify.stderr[-2000:]
    # A GPU host whose engine the fleet router does not list fails it, named (an inventory with one more GPU host).
    inv = yaml.safe_load(fleet.inventory.read_text())
    inv["all"]["children"]["gpu_hosts"]["hosts"]["lab9"] = {"ansible_host": "127.0.42.99",
                                                             "sglang_bind_address": "127.0.42.99"}
    bigger = fleet.inventory.with_name("inventory-fleet-lab9.yml")
    bigger.write_text(yaml.safe_dump(inv, sort_keys=False))
    verify = _verify_routers(fleet, bigger, "tests/infra/test_router.py", "-k", "every_gpu_host")
    assert verify.returncode != 0 and "2 failed" in verify.stdout, verify.stdout[-3000:]
    assert (f"sglang-router-{PORT}.service: lists no engine of lab9 (expected http://127.0.42.99:{PORT}): that "
            "engine gets no traffic through this fleet router") in verify.stdout, verify.stdout[-3000:]


def _verify_routers(fleet, inventory: Path, *args: str) -> subprocess.CompletedProcess:
    """make verify's testinfra run on the group routers (by default every file of tests/infra, as make verify)."""
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs",
                           *(args or ["tests/infra"]), "--hosts=ansible://routers", f"--ansible-inventory={inventory}"],
                          cwd=REPO,
                          env=fleet.ansible_env(), text=True, capture_output=True, timeout=600,
                          stdin=subprocess.DEVNULL)


R_PORT = 31400        # serving.replicas 2 behind the fleet routers: replicas on 31401 and 31403 of each GPU host
R_REPLICA_PORTS = (R_PORT + 1, R_PORT + 3)


def _r_listed(fleet) -> dict[str, dict[str, bool]]:
    """Each fleet router's (port 31400) workers (URL -> healthy), by router host."""
    out = {}
    for host in ROUTER_HOSTS:
        key = api.read_env_text(fleet.ssh(host, f"cat {api.env_file(R_PORT)}").stdout)[api.CONTROL_KEY_VAR]
        req = urllib.request.Request(f"http://{fleet.address(host)}:{R_PORT}/workers",
                                     headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            out[host] = {w["url"]: w["is_healthy"] for w in json.loads(resp.read())["workers"]}
    return out


def test_fleet_replicas_each_a_worker_of_every_router_switch_with_no_failed_request(fleet):
    """serving.replicas 2 on each GPU host behind the router pair: six engines, each a worker of both fleet routers (no
    per-host router); a switch r2-b15 -> r2-b32 with max_unavailable 50% (3 replicas) under the paced load: the canary
    (lab1's replica 0) alone, then three replicas at a time; no failed request, never more than three out."""
    started = time.monotonic()
    first = fleet.ansible_playbook("playbooks/deploy.yml", "-e", _cfg("lab-fleet-r2-b15"),
                                   "-e", "fleet_max_unavailable=5", timeout=1200)
    first_s = round(time.monotonic() - started, 1)
    assert ("FLEET PLAN: 6 engine(s) (2 replica(s) on each of 3 GPU host(s)) of lab-fleet-r2-b15 behind 2 fleet "
            "routers, on lab4") in first.stdout, first.stdout[-3000:]
    engines = {f"http://{fleet.address(h)}:{p}": True for h in GPU_HOSTS for p in R_REPLICA_PORTS}
    every = {host: engines for host in ROUTER_HOSTS}
    assert _r_listed(fleet) == every
    for host in GPU_HOSTS:   # the replicas run; no router on a GPU host, its serving.port free
        units = fleet.ssh(host, "systemctl list-units --no-legend --state=active 'sglang-*r2*' "
                                f"'sglang-router-{R_PORT}*'").stdout
        assert sorted(line.split()[0] for line in units.splitlines() if line.strip()) == [
            "sglang-lab-fleet-r2-b15-r0.service", "sglang-lab-fleet-r2-b15-r1.service"], units
        listen = fleet.ssh(host, f"ss -Hltn 'sport = :{R_PORT}'").stdout.split("\n")   # the lab's hosts share one net
        assert f"{fleet.address(host)}:{R_PORT}" not in [line.split()[3] for line in listen if line.strip()], listen

    routers = {f"http://{fleet.address(h)}:{R_PORT}":
               api.read_env_text(fleet.ssh(h, f"cat {api.env_file(R_PORT)}").stdout)[api.CONTROL_KEY_VAR]
               for h in ROUTER_HOSTS}
    with Load(list(routers), routers, full=len(engines)) as load:
        # MAX_UNAVAILABLE=50% of the 6 replicas: 3 at a time (sgdeploy.fleet.batch_size), as the plan line says.
        phase, proc = _timed(fleet, load, "playbooks/deploy.yml", "-e", _cfg("lab-fleet-r2-b32"),
                             "-e", "fleet_max_unavailable=50%")
    first_counts = phase.pop("seconds_at_engines_in_router")
    phase.update(seconds_at_engines_in_router=first_counts,
                 engine_seconds_lost=sum(n_s * (len(engines) - n) for n, n_s in first_counts.items() if n >= 0))
    print(f"first deploy of 6 replicas (max_unavailable 5): {first_s} s; switch (max_unavailable 50%: 3): "
          f"{phase['seconds']} s, {phase['requests']} requests, {phase['failed']} failed, "
          f"p50 {phase['latency_p50_s']} s, p95 {phase['latency_p95_s']} s, "
          f"fewest engines healthy in each router {phase['min_engines_in_each_router']}, "
          f"seconds at each count (lab4) {phase['seconds_at_engines_in_router']}")
    if RESULTS.exists():
        results = json.loads(RESULTS.read_text())
        results["replicas"] = {"first_deploy_s": first_s, "switch": phase}
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert ("FLEET PLAN: 6 engine(s) (2 replica(s) on each of 3 GPU host(s)) of lab-fleet-r2-b32 behind 2 fleet "
            "routers") in proc.stdout and "the canary (lab1 lab-fleet-r2-b32-r0) first, then 3 at a time" \
        in proc.stdout, proc.stdout[-4000:]
    assert ("FLEET ENGINE on lab1 lab-fleet-r2-b32-r0 (the canary): lab-fleet-r2-b32 deployed at "
            f"http://{fleet.address('lab1')}:{R_PORT + 1}, out of the 2 fleet routers") in proc.stdout, \
        proc.stdout[-4000:]
    for host in GPU_HOSTS:
        for i, port in enumerate(R_REPLICA_PORTS):
            assert f"FLEET ENGINE on {host} lab-fleet-r2-b32-r{i}" in proc.stdout, proc.stdout[-4000:]
            out = fleet.ssh(host, f"curl -sf http://{fleet.address(host)}:{port}/get_server_info").stdout
            assert json.loads(out)["speculative_ddtree_budget"] == 32, (host, port)
    assert _engine_order(proc.stdout, "FLEET ENGINE on ")[0] == "lab1 lab-fleet-r2-b32-r0", proc.stdout[-4000:]
    assert _r_listed(fleet) == every
    assert phase["requests"] >= 30 and phase["failed"] == 0, phase
    # max_unavailable counts replicas: the canary alone (5 of 6 left), then three at a time (3 left), never fewer.
    assert set(phase["min_engines_in_each_router"].values()) == {3}, phase
    # make verify's router checks (as on the group routers): each fleet router lists every replica of every GPU host
    # that the hosts' deploy state says runs behind its port (31300: one engine each; 31400: two replicas each).
    started = time.monotonic()
    verify = _verify_routers(fleet, fleet.inventory)
    print(f"make verify on the group routers after the replicas switch: {round(time.monotonic() - started, 1)} s")
    assert verify.returncode == 0 and "10 passed" in verify.stdout and "failed" not in verify.stdout, \
        verify.stdout[-3000:] + verify.stderr[-2000:]


def test_a_change_of_the_replica_count_behind_the_fleet_router_is_refused_before_any_change(fleet):
    """2 replicas on each GPU host behind the routers' 31400 (the case above), a config with 1: the fleet role does not
    retire surplus replicas, so the deploy is refused in one line naming the config, both counts and what to do; no
    replica restarted, both routers unchanged."""
    since = {(h, i): _active_since(fleet, h, f"sglang-lab-fleet-r2-b32-r{i}.service")
             for h in GPU_HOSTS for i in (0, 1)}
    before = _r_listed(fleet)
    proc = fleet.ansible_playbook("playbooks/deploy.yml", "-e", _cfg("lab-fleet-r1-b15"), check=False, timeout=600)
    assert proc.returncode != 0
    assert (f"FLEET REFUSED before any change: config lab-fleet-r1-b15: serving.replicas 1 behind the fleet router "
            f"http://{fleet.address(ROUTER_HOST)}:{R_PORT} (on {ROUTER_HOST}), which fronts 2 engine(s) on each GPU "
            "host now: a change of the replica count behind the fleet router is not supported (the surplus engines "
            f"would not be retired): keep serving.replicas at 2 for port {R_PORT}") in proc.stdout, proc.stdout[-3000:]
    assert "FLEET ENGINE" not in proc.stdout and "PLAN on" not in proc.stdout, proc.stdout[-3000:]
    for host in GPU_HOSTS:
        assert fleet.ssh(host, "test -e /etc/systemd/system/sglang-lab-fleet-r1-b15-r0.service",
                         check=False).returncode != 0
    assert {k: _active_since(fleet, k[0], f"sglang-lab-fleet-r2-b32-r{k[1]}.service") for k in since} == since
    assert _r_listed(fleet) == before


def test_make_rollback_of_replicas_behind_the_fleet_routers_with_no_failed_request(fleet):
    """make rollback MAX_UNAVAILABLE=3 on what the replicas case left (lab-fleet-r2-b32, 2 replicas on each GPU host
    behind both routers' 31400) under the paced load through both routers: every replica's own previous deploy
    (lab-fleet-r2-b15-r<i>), 3 at a time (every host's replica 0, then every host's replica 1), each out of both fleet
    routers and back in; no failed request, never fewer than 3 healthy in either router."""
    every = {host: {f"http://{fleet.address(h)}:{p}": True for h in GPU_HOSTS for p in R_REPLICA_PORTS}
             for host in ROUTER_HOSTS}
    assert _r_listed(fleet) == every
    routers = {f"http://{fleet.address(h)}:{R_PORT}":
               api.read_env_text(fleet.ssh(h, f"cat {api.env_file(R_PORT)}").stdout)[api.CONTROL_KEY_VAR]
               for h in ROUTER_HOSTS}
    with Load(list(routers), routers, full=len(GPU_HOSTS) * len(R_REPLICA_PORTS)) as load:
        phase, proc = _timed(fleet, load, "playbooks/rollback.yml", "-e", _cfg("lab-fleet-r2-b32"),
                             "-e", "fleet_max_unavailable=3")
    print(f"rollback of 6 replicas (max_unavailable 3): {phase['seconds']} s, {phase['requests']} requests, "
          f"{phase['failed']} failed, p50 {phase['latency_p50_s']} s, p95 {phase['latency_p95_s']} s, fewest engines "
          f"healthy in each router {phase['min_engines_in_each_router']}")
    if RESULTS.exists():
        results = json.loads(RESULTS.read_text())
        results["replicas"] = {**results.get("replicas", {}), "rollback": phase}
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    assert proc.returncode == 0, proc.stdout[-4000:]
    for host in GPU_HOSTS:
        for i, port in enumerate(R_REPLICA_PORTS):
            assert (f"FLEET ENGINE ROLLED BACK on {host} lab-fleet-r2-b32-r{i}: http://{fleet.address(host)}:{port}, "
                    "out of the 2 fleet routers") in proc.stdout, proc.stdout[-4000:]
            out = fleet.ssh(host, f"curl -sf http://{fleet.address(host)}:{port}/get_server_info").stdout
            assert json.loads(out)["speculative_ddtree_budget"] == 15, (host, port)
            active = fleet.ssh(host, f"systemctl is-active sglang-lab-fleet-r2-b15-r{i}.service", check=False)
            assert active.stdout.strip() == "active", (host, i, active.stdout)
    # Every host's replica 0 (one step) before any replica 1.
    order = _engine_order(proc.stdout, "FLEET ENGINE ROLLED BACK on ")
    assert sorted(order[:3]) == [f"{h} lab-fleet-r2-b32-r0" for h in GPU_HOSTS], order
    assert _r_listed(fleet) == every
    assert phase["requests"] >= 30 and phase["failed"] == 0, phase
    assert set(phase["min_engines_in_each_router"].values()) == {3}, phase


WATCH_COLLAPSE = "lab-fleet-b32-watch-collapse"   # lab-fleet-b32, watched; acceptance collapses after 100 requests


def _runs(counts: list[int]) -> list[int]:
    """A router's healthy-engine counts, once a second, with repeats (and failed reads, -1) dropped."""
    out: list[int] = []
    for n in counts:
        if n >= 0 and (not out or out[-1] != n):
            out.append(n)
    return out


def test_the_fleet_canary_watch_sees_a_collapse_through_the_fleet_routers_and_rolls_it_back(fleet):
    """The canary's post-deploy watch through the fleet routers (docs/monitoring-watch.md): on what the first case left
    (lab-fleet-b15 on 31300 of lab1-lab3, both routers), lab-fleet-b32 watched, whose acceptance collapses after 100
    requests (simulator). Under the paced load through both routers: the canary (lab1) leaves both for its gates, comes
    back into both for its watch (the only way live traffic reaches it), the watch fails on the collapse, the canary
    leaves both again, is rolled back to b15 and put back; 0 failed requests, lab2 and lab3 never restarted."""
    keys = {host: _router_key(fleet, host) for host in ROUTER_HOSTS}
    every = {host: {_engine_url(fleet, h): True for h in GPU_HOSTS} for host in ROUTER_HOSTS}
    assert _listed(fleet, keys) == every
    since = {h: _active_since(fleet, h, "sglang-lab-fleet-b15.service") for h in ("lab2", "lab3")}
    routers = {_router_url(fleet, h): keys[h] for h in ROUTER_HOSTS}
    with Load(list(routers), routers, full=len(GPU_HOSTS)) as load:
        phase, proc = _timed(fleet, load, "playbooks/deploy.yml", "-e", _cfg(WATCH_COLLAPSE))
        _sample_after(load, load.now())
        with load.lock:
            counts = {u: [c[2] for c in load.capacity if c[1] == u] for u in routers}
    runs = {u.split("//")[1]: _runs(c) for u, c in counts.items()}
    print(f"watch through the fleet routers: {phase['seconds']} s, {phase['requests']} requests, {phase['failed']} "
          f"failed, p50 {phase['latency_p50_s']} s, p95 {phase['latency_p95_s']} s, engines healthy in each router "
          f"(runs) {runs}")
    if RESULTS.exists():
        results = json.loads(RESULTS.read_text())
        results["watch"] = {**phase, "runs": runs}
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    assert proc.returncode != 0, proc.stdout[-4000:]
    assert "FLEET ROLLOUT STOPPED on lab1 (the canary)" in proc.stdout and "WATCH FAILED" in proc.stdout, \
        proc.stdout[-4000:]
    assert "2 consecutive failed interval(s) (failure_limit 2)" in proc.stdout, proc.stdout[-4000:]
    assert "it was rolled back and put back into the 2 fleet routers" in proc.stdout, proc.stdout[-4000:]
    # Watched while back in every router, out of every router again before the rollback: each router went 3 -> 2 (out
    # for the gates) -> 3 (the watch) -> 2 (out for the rollback) -> 3, never lower.
    for router, seq in runs.items():
        assert seq == [3, 2, 3, 2, 3], (router, seq)
    path = fleet.ssh("lab1", f"ls -1 /var/lib/sglang-deploy/{WATCH_COLLAPSE}/records/*.json | sort | tail -1").stdout
    record = json.loads(fleet.ssh("lab1", f"cat {path.strip()}").stdout)
    assert record["outcome"] == "rolled_back" and record["rollback"]["cause"] == "watch", record.get("rollback")
    watch = record["watch"]
    bad = [i for i in watch["intervals"] if i["verdict"] == "fail"]
    assert watch["result"] == "failed" and len(bad) >= 2, watch
    # The traffic that judged it came through the fleet routers (nothing else sends to the canary during its watch).
    assert all(i["requests"] >= 3 for i in bad), watch
    assert any(i["verdict"] == "pass" for i in watch["intervals"]), watch
    assert _budget(fleet, "lab1") == 15
    for host in ("lab2", "lab3"):
        assert _active_since(fleet, host, "sglang-lab-fleet-b15.service") == since[host]
    assert _listed(fleet, keys) == every
    assert phase["failed"] == 0 and phase["requests"] >= 30, phase
