"""Issue 34 item 3, "Replica changes are planned whole before anything changes" (docs/router.md, "Replica changes").

One lab host, config ddtree-b15 as replicas behind the real sglang-router 0.3.2 on port 31500
(tests/lab/configs/lab-scale-*.yml: replica i on 31501 + 2i, the router's metrics on 31499 whatever N):

- a rollout whose second replica asks for a GPU the host does not have, and one whose new third replica's
  NCCL port is held by a stray process, are refused with one line before replica 0 changes;
- 2 -> 3 replicas whose third never gets healthy: the rollout stops at it and the router lists the first two only;
- 2 -> 3 replicas and back 3 -> 2 under a bounded client load through the router: the third replica joins
  through the router's API; on the way down it leaves the router, is stopped, disabled and its unit and env
  file removed; the router never restarts (it did when its metrics port moved with N: CI saw 8 of 1 248
  requests refused) and the clients see no failed request.

Simulated engine: proves plumbing, not behaviour.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from test_router import Load

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
LAB_CONFIGS = REPO / "tests" / "lab" / "configs"
RESULTS = REPO / "build" / "lab-replica-changes-results.json"
HOST = "lab1"
ROUTER_PORT = 31500
ROUTER_UNIT = f"sglang-router-{ROUTER_PORT}.service"
SICK_DROP_IN = "/etc/systemd/system/sglang-lab-scale-x3-r2.service.d"


@pytest.fixture(scope="module", autouse=True)
def leave_the_gpus_free(lab):
    """Lab C runs this file among others (tests/lab/run.sh): its replicas' GPUs 5-7 and the router go at the end."""
    yield
    lab.remove_configs(HOST, "lab-scale-", ROUTER_PORT)


def _cfg(name: str) -> str:
    return f"config={LAB_CONFIGS / f'lab-scale-{name}.yml'}"


def _deploy(lab, name: str, check: bool = True):
    return lab.ansible_playbook("playbooks/deploy.yml", "-e", _cfg(name), "--limit", HOST, check=check, timeout=900)


def _since(lab, unit: str) -> str:
    return lab.ssh(HOST, f"systemctl show -p ActiveEnterTimestampMonotonic --value {unit}").stdout.strip()


def _listed(lab) -> dict[str, bool]:
    import urllib.request

    req = urllib.request.Request(f"http://{lab.address(HOST)}:{ROUTER_PORT}/workers",
                                 headers={"Authorization": f"Bearer {_router_key31500(lab)}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return {w["url"].rstrip("/"): w["is_healthy"] for w in json.loads(resp.read())["workers"]}


def _router_key31500(lab) -> str:
    from test_router import api

    return api.read_env_text(lab.ssh(HOST, f"cat {api.env_file(ROUTER_PORT)}").stdout)[api.CONTROL_KEY_VAR]


def _holder(lab, port: int) -> str:
    """The systemd unit of the process listening on the lab host's address and ``port`` ('' when none)."""
    out = lab.ssh(HOST, f"ss -ltnpH 'src {lab.address(HOST)} and sport = :{port}'", check=False).stdout
    pids = [p.split("=")[1] for p in out.replace(",", " ").replace(")", " ").split() if p.startswith("pid=")]
    if not pids:
        return ""
    return lab.ssh(HOST, f"grep -o '[^/]*\\.service' /proc/{pids[0]}/cgroup | tail -1", check=False).stdout.strip()


def _urls(lab, n: int) -> dict[str, bool]:
    return {f"http://{lab.address(HOST)}:{ROUTER_PORT + 1 + 2 * i}": True for i in range(n)}


def test_a_rollout_that_does_not_fit_is_refused_before_replica_0_changes(lab):
    _deploy(lab, "x2")
    assert _listed(lab) == _urls(lab, 2)
    r0 = "sglang-lab-scale-x2-r0.service"
    since = _since(lab, r0)

    # Replica 1 asks for GPU 9; the host has 8: refused up front, replica 0 untouched.
    proc = _deploy(lab, "x2-gpu9", check=False)
    assert proc.returncode != 0
    assert (f"ROLLOUT REFUSED on {HOST} before any change: config lab-scale-x2-gpu9: "
            "replica 1 (lab-scale-x2-gpu9-r1) would run on GPUs [9]: GPU index 9 does not exist on this host "
            "(gpu_count 8: indices 0-7)") in proc.stdout, \
        proc.stdout[-3000:]
    assert _since(lab, r0) == since
    assert lab.ssh(HOST, "test -e /etc/systemd/system/sglang-lab-scale-x2-gpu9-r0.service", check=False).returncode != 0

    # A stray process on what 3 replicas make replica 2's NCCL port (31506): refused up front.
    addr = lab.address(HOST)
    lab.ssh(HOST, f"setsid sh -c 'python3 -m http.server 31506 --bind {addr} >/dev/null 2>&1 </dev/null & "
                  "echo $! > /tmp/stray31506.pid'")
    try:
        for _ in range(20):
            if lab.ssh(HOST, f"ss -ltnH 'src {addr} and sport = :31506'", check=False).stdout.strip():
                break
            time.sleep(0.5)
        proc = _deploy(lab, "x3", check=False)
        assert proc.returncode != 0
        assert (f"ROLLOUT REFUSED on {HOST} before any change: config lab-scale-x3: port {addr}:31506 (replica 2's "
                "NCCL port) is already in use by python3 (pid") in proc.stdout, proc.stdout[-3000:]
        assert _since(lab, r0) == since
        # (an earlier x3 deploy may have left its unit file, replaced and stopped: it must not be running)
        x3_r0 = lab.ssh(HOST, "systemctl is-active sglang-lab-scale-x3-r0.service", check=False).stdout.strip()
        assert x3_r0 != "active"
        assert _listed(lab) == _urls(lab, 2)
    finally:
        lab.ssh(HOST, "kill $(cat /tmp/stray31506.pid) && rm -f /tmp/stray31506.pid", check=False)


def _x2_serving(lab) -> bool:
    try:
        return _listed(lab) == _urls(lab, 2)
    except (OSError, AssertionError):  # no router answering, or none deployed yet (no key file: ssh fails)
        return False


def test_scale_up_and_down_under_load_with_no_failed_request(lab):
    if not _x2_serving(lab):
        _deploy(lab, "x2")
    router = f"http://{lab.address(HOST)}:{ROUTER_PORT}"
    router_since = _since(lab, ROUTER_UNIT)
    phases = {}
    with Load([router], {router: _router_key31500(lab)}) as load:
        time.sleep(5)
        # Found (issue 34): a scale up whose third replica failed after the first two switched had the rescue put
        # that replica's URL (then the router's metrics port) into the router. The new replica never gets
        # healthy here (a drop-in on the host): the rollout stops at it and the router lists replicas 0 and 1 only.
        t = load.now()
        lab.ssh(HOST, f"mkdir -p {SICK_DROP_IN} && printf '[Service]\\nEnvironment=SGLANG_SIM_NEVER_HEALTHY=1\\n' "
                      f"> {SICK_DROP_IN}/lab-never-healthy.conf && systemctl daemon-reload")
        try:
            sick = _deploy(lab, "x3", check=False)
        finally:
            lab.ssh(HOST, f"rm -rf {SICK_DROP_IN} && systemctl daemon-reload", check=False)
        phases["up_2_to_3_third_never_healthy"] = load.window(t, load.now())
        assert sick.returncode != 0, sick.stdout[-3000:]
        assert f"ROLLOUT STOPPED on {HOST} at lab-scale-x3-r2: " in sick.stdout, sick.stdout[-3000:]
        assert "(it was not in the router: nothing put back)" in sick.stdout, sick.stdout[-3000:]
        assert "ROLLED OUT" not in sick.stdout, sick.stdout[-3000:]
        assert _listed(lab) == _urls(lab, 2)
        assert _holder(lab, 31505) == ""

        t = load.now()
        up = _deploy(lab, "x3", check=False)
        phases["up_2_to_3"] = load.window(t, load.now())
        assert up.returncode == 0, up.stdout[-3000:]
        assert _listed(lab) == _urls(lab, 3)
        assert _holder(lab, 31505) == "sglang-lab-scale-x3-r2.service"
        assert _holder(lab, 31499) == ROUTER_UNIT
        assert _since(lab, ROUTER_UNIT) == router_since, "the router restarted on a scale up"

        t = load.now()
        down = _deploy(lab, "x2", check=False)
        phases["down_3_to_2"] = load.window(t, load.now())
        assert down.returncode == 0, down.stdout[-3000:]
        assert f"RETIRED on {HOST}: lab-scale-x3-r2 (http://{lab.address(HOST)}:31505" in down.stdout, \
            down.stdout[-3000:]
        assert _listed(lab) == _urls(lab, 2)
        time.sleep(3)
    for unit_file in ("/etc/systemd/system/sglang-lab-scale-x3-r2.service", "/etc/sglang/lab-scale-x3-r2.env"):
        assert lab.ssh(HOST, f"test -e {unit_file}", check=False).returncode != 0, unit_file
    assert lab.ssh(HOST, "systemctl is-active sglang-lab-scale-x3-r2.service", check=False).stdout.strip() != "active"
    assert lab.ssh(HOST, "systemctl is-enabled sglang-lab-scale-x3-r2.service", check=False).returncode != 0
    assert _holder(lab, 31505) == ""
    assert _holder(lab, 31499) == ROUTER_UNIT
    assert _since(lab, ROUTER_UNIT) == router_since, "the router restarted on a scale down"
    failed = [d for d in load.done if not d[3]]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"requests": len(load.done), "failed": len(failed), "phases": phases,
                                   "first_failures": failed[:5]}, indent=2) + "\n")
    assert len(load.done) >= 100, len(load.done)
    assert not failed, f"{len(failed)} of {len(load.done)} requests failed, first: {failed[:3]}"


def test_a_router_that_is_restarting_is_waited_for_and_every_replica_leaves_it(lab):
    """The router down as a rollout starts (stopped, started again 30 s later: a stand-in for a crash and
    systemd's restart delay): the plan waits for it, and every replica is taken out of it and put back, with
    the measured "never all down"; it used to read "no router" and skip every take-out and put-back."""
    if not _x2_serving(lab):
        _deploy(lab, "x2")
    lab.ssh(HOST, f"systemctl stop {ROUTER_UNIT} && (setsid sh -c 'sleep 30; systemctl start {ROUTER_UNIT}' "
                  ">/dev/null 2>&1 </dev/null &)")
    proc = _deploy(lab, "x2", check=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    plan = [line for line in proc.stdout.splitlines() if "PLAN on" in line]
    assert f"s for the router {ROUTER_UNIT} to answer" in proc.stdout, plan
    for i in (0, 1):
        assert f"lab-scale-x2-r{i} deployed, out of the router " in proc.stdout, proc.stdout[-3000:]
    assert (f"ROLLED OUT on {HOST}: lab-scale-x2, 2 replica(s) one at a time behind http://{lab.address(HOST)}:"
            f"{ROUTER_PORT} (never all down: at least 1 healthy replica(s) in the router at each take-out") \
        in proc.stdout, proc.stdout[-3000:]
    assert _listed(lab) == _urls(lab, 2)


def test_a_stranger_worker_in_the_router_refuses_the_rollout_before_any_change(lab):
    """Found (issue 34): a worker added through the router's API stayed through a whole rolling deploy. Now the
    rollout's plan compares what the running router lists with its unit and the layout, and refuses, naming it."""
    from test_router import api

    if not _x2_serving(lab):
        _deploy(lab, "x2")
    addr = lab.address(HOST)
    router, stranger = f"http://{addr}:{ROUTER_PORT}", f"http://{addr}:31590"
    key = _router_key31500(lab)
    # A live engine nobody deployed: replica 1's command on other ports, as a transient unit.
    exec_start = lab.ssh(HOST, "systemctl cat sglang-lab-scale-x2-r1.service | sed -n 's/^ExecStart=//p'")
    exec_start = exec_start.stdout.strip()
    argv = exec_start.replace("--port 31503", "--port 31590").replace("--nccl-port 31504", "--nccl-port 31591")
    assert "--port 31590" in argv, exec_start
    lab.ssh(HOST, f"systemd-run --quiet --unit lab-stranger-31590 "
                  f"--property=EnvironmentFile=/etc/sglang/lab-scale-x2-r1.env {argv}")
    r0 = "sglang-lab-scale-x2-r0.service"
    try:
        for _ in range(120):
            if lab.ssh(HOST, f"curl -fsS -o /dev/null {stranger}/health", check=False).returncode == 0:
                break
            time.sleep(1)
        api.add(router, stranger, key=key)
        ok, _, detail = api.settle(router, [stranger], [], 60, key=key)
        assert ok, detail
        since = _since(lab, r0)
        proc = _deploy(lab, "x2", check=False)
        assert proc.returncode != 0
        assert (f"ROLLOUT REFUSED on {HOST} before any change: config lab-scale-x2: router {ROUTER_UNIT} routes to "
                f"{stranger}, which neither its unit nor this config names") in proc.stdout, proc.stdout[-3000:]
        assert _since(lab, r0) == since
    finally:
        listing = api.workers(router, key=key)
        if stranger in listing:
            api.remove(router, listing[stranger]["id"], key=key)
        lab.ssh(HOST, "systemctl stop lab-stranger-31590", check=False)
    ok, _, detail = api.settle(router, list(_urls(lab, 2)), [stranger], 60, key=key)
    assert ok, detail
