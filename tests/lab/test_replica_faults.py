"""Issue 34 item 3, faults during a replica rollout (docs/router.md, "Replica changes", "A failed replica").

One lab host, config ddtree-b15 as two replicas behind the real sglang-router 0.3.2 on port 31700
(tests/lab/configs/lab-faults-x2*.yml: replica i on 31701 + 2i, GPUs 6 and 7), deployed once for the file:

- a router that stays down: the plan waits ``sglang_replicas_router_wait_s`` for it and refuses the rollout with
  one line; no replica restarts (it used to read "no router" and roll every replica without taking it out);
- a replica stopped by hand while the canary is out of the router: the canary's same-window comparison with that
  replica cannot be made, so the canary is inconclusive, rolled back, and the rollout stops (it used to go on to
  "ROLLED OUT ... (never all down)");
- replica 1 fails its deploy after replica 0 switched: the rescue puts back the engine its step took out (replica
  1, on its old config) and nothing else, so the router lists exactly the config's two engines.
- the post-deploy watch (issue 36, docs/monitoring-watch.md): under paced load through the router, a canary whose
  acceptance collapses after its gates passed is seen by the watch and rolled back with 0 failed requests, replica 1
  untouched; with no traffic the watch ends inconclusive and the rollout keeps the canary and goes on.

Simulated engine: proves plumbing, not behaviour.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from test_cli import make, status_lines
from test_router import Load, api

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
LAB_CONFIGS = REPO / "tests" / "lab" / "configs"
HOST = "lab1"
ROUTER_PORT = 31700
ROUTER_UNIT = f"sglang-router-{ROUTER_PORT}.service"
X2, B32 = "lab-faults-x2", "lab-faults-x2-b32"   # ddtree-b15 and ddtree-b32, same layout
COLLAPSE, QUIET = "lab-watch-x2-collapse", "lab-watch-x2-quiet"  # ddtree-b32 there, watched (tests/lab/configs/)
STATE = "/var/lib/sglang-deploy"
DROP_IN = f"/etc/systemd/system/sglang-{B32}-r1.service.d"


@pytest.fixture(scope="module", autouse=True)
def leave_the_gpus_free(lab):
    """Lab C runs this file among others (tests/lab/run.sh): its replicas' GPUs 6-7 and the router go at the end
    (every config of this file starts with lab-faults- or lab-watch-)."""
    yield
    lab.remove_configs(HOST, "lab-faults-", ROUTER_PORT)
    lab.remove_configs(HOST, "lab-watch-")


def _deploy(lab, name: str, *extra: str, check: bool = True):
    return lab.ansible_playbook("playbooks/deploy.yml", "-e", f"config={LAB_CONFIGS / f'{name}.yml'}", *extra,
                                "--limit", HOST, check=check, timeout=900)


def _key(lab) -> str:
    return api.read_env_text(lab.ssh(HOST, f"cat {api.env_file(ROUTER_PORT)}").stdout)[api.CONTROL_KEY_VAR]


def _listed(lab, key: str) -> dict[str, bool]:
    """What the router lists: worker URL -> healthy."""
    req = urllib.request.Request(f"http://{lab.address(HOST)}:{ROUTER_PORT}/workers",
                                 headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return {w["url"].rstrip("/"): w["is_healthy"] for w in json.loads(resp.read())["workers"]}


def _url(lab, i: int) -> str:
    return f"http://{lab.address(HOST)}:{ROUTER_PORT + 1 + 2 * i}"


def _both(lab) -> dict[str, bool]:
    return {_url(lab, 0): True, _url(lab, 1): True}


def _since(lab, unit: str) -> str:
    return lab.ssh(HOST, f"systemctl show -p ActiveEnterTimestampMonotonic --value {unit}").stdout.strip()


def _budget(lab, i: int) -> int:
    """The DDTree budget the engine on replica i's port reports (an engine answers; a router or a stranger does not)."""
    return json.loads(lab.ssh(HOST, f"curl -sf {_url(lab, i)}/get_server_info").stdout)["speculative_ddtree_budget"]


def _wait_listed(lab, key: str, want: dict[str, bool], seconds: float = 90) -> dict[str, bool]:
    deadline = time.monotonic() + seconds
    listed: dict[str, bool] = {}
    while time.monotonic() < deadline:
        try:
            listed = _listed(lab, key)
        except OSError:
            listed = {}
        if listed == want:
            break
        time.sleep(0.5)
    return listed


NAME = {15: X2, 32: B32}  # the config of a replica, by the budget its engine reports


def _serving(lab, key: str) -> bool:
    """Both replica URLs healthy in the router, each an engine of one of this file's configs (by its budget, and its
    unit by that config's name: the watch's configs have budget 32 too, and the cases start from X2 or B32)."""
    try:
        return _listed(lab, key) == _both(lab) and all(
            _budget(lab, i) in NAME and lab.ssh(HOST, f"systemctl is-active sglang-{NAME[_budget(lab, i)]}-r{i}"
                                                ".service", check=False).stdout.strip() == "active" for i in (0, 1))
    except (OSError, AssertionError, ValueError, KeyError):
        return False


@pytest.fixture(scope="module")
def key(lab) -> str:
    """Two replicas in a running router (deployed as lab-faults-x2 unless an earlier run left them serving: the
    cases start from either config); the router's admin key."""
    lab.ssh(HOST, f"rm -rf {DROP_IN} && systemctl daemon-reload")
    if lab.ssh(HOST, f"test -s {api.env_file(ROUTER_PORT)}", check=False).returncode != 0 \
            or not _serving(lab, _key(lab)):
        _deploy(lab, X2)
    k = _key(lab)
    assert _wait_listed(lab, k, _both(lab)) == _both(lab)
    return k


def _ensure(lab, key: str) -> None:
    if not _serving(lab, key):
        _deploy(lab, X2)
        assert _wait_listed(lab, key, _both(lab)) == _both(lab)


def test_a_router_that_stays_down_refuses_the_rollout_and_no_replica_restarts(lab, key):
    """Issue 34: a router down as a rollout starts made it read "no router" and skip every take-out. The plan waits
    sglang_replicas_router_wait_s for it, then refuses with one line; the replicas are not touched."""
    _ensure(lab, key)
    now = [NAME[_budget(lab, i)] for i in (0, 1)]
    units = [f"sglang-{name}-r{i}.service" for i, name in enumerate(now)]
    before = {u: _since(lab, u) for u in units}
    lab.ssh(HOST, f"systemctl stop {ROUTER_UNIT}")
    try:
        t0 = time.monotonic()
        proc = _deploy(lab, X2 if now[0] == B32 else B32, "-e", "sglang_replicas_router_wait_s=10", check=False)
        took = time.monotonic() - t0
        assert proc.returncode != 0, proc.stdout[-3000:]
        line = [x for x in proc.stdout.splitlines() if "ROLLOUT REFUSED" in x]
        assert (f"ROLLOUT REFUSED on {HOST} before any change: router {ROUTER_UNIT} is inactive, not active and "
                f"answering http://{lab.address(HOST)}:{ROUTER_PORT}/health after 1") in proc.stdout, \
            line or proc.stdout[-3000:]
        assert (f"start it (systemctl reset-failed {ROUTER_UNIT}; systemctl start {ROUTER_UNIT}) and deploy again"
                in proc.stdout), line
        assert "ROLLED OUT" not in proc.stdout and "DEPLOYED on" not in proc.stdout, proc.stdout[-3000:]
        assert took >= 10, took
        assert {u: _since(lab, u) for u in units} == before
        assert lab.ssh(HOST, f"systemctl is-active {ROUTER_UNIT}", check=False).stdout.strip() != "active"
    finally:
        lab.ssh(HOST, f"systemctl reset-failed {ROUTER_UNIT}; systemctl start {ROUTER_UNIT}", check=False)
    # The router comes back with the workers its unit lists (the replicas never changed).
    assert _wait_listed(lab, key, _both(lab)) == _both(lab)


def test_a_replica_stopped_by_hand_while_the_canary_is_out_stops_the_rollout_as_inconclusive(lab, key):
    """Issue 34 (Found): replica 1 stopped by hand while the canary was out of the router; the canary's same-window
    bench of replica 1 said "not compared", and the run went on to "ROLLED OUT ... (never all down)". Now the canary
    is inconclusive without that comparison: it is rolled back and the rollout stops."""
    _ensure(lab, key)
    budgets = [_budget(lab, i) for i in (0, 1)]
    target = X2 if budgets[0] == 32 else B32  # a real change of the canary
    r1 = f"sglang-{NAME[budgets[1]]}-r1.service"
    router = f"http://{lab.address(HOST)}:{ROUTER_PORT}"
    out: dict = {}
    stopped_at = None
    with Load([router], {router: key}) as load:
        deploy = threading.Thread(target=lambda: out.update(proc=_deploy(lab, target, check=False)), daemon=True)
        deploy.start()
        try:
            # The canary leaves the router (take-out) before its switch; stop replica 1 right then, before its gates.
            while deploy.is_alive():
                try:
                    gone = _url(lab, 0) not in _listed(lab, key)
                except OSError:
                    gone = False
                if gone:
                    lab.ssh(HOST, f"systemctl stop {r1}")
                    stopped_at = load.now()
                    break
                time.sleep(0.2)
            deploy.join(900)
        finally:
            lab.ssh(HOST, f"systemctl start {r1}", check=False)
    proc = out["proc"]
    assert stopped_at is not None, "the canary never left the router while the rollout ran: " + proc.stdout[-3000:]
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert f"ROLLOUT STOPPED on {HOST} at {target}-r0 (the canary)" in proc.stdout, proc.stdout[-3000:]
    assert (f"the old replica in the same window ({_url(lab, 1)}): only ") in proc.stdout, proc.stdout[-3000:]
    assert "the canary's same-window comparison could not be made: inconclusive" in proc.stdout, proc.stdout[-3000:]
    assert "never all down" not in proc.stdout and "ROLLED OUT" not in proc.stdout, proc.stdout[-3000:]
    # The canary is back on its old config and in the router; replica 1 serves again (started by hand above).
    assert _wait_listed(lab, key, _both(lab)) == _both(lab)
    assert [_budget(lab, 0), _budget(lab, 1)] == budgets
    assert len(load.done) > 0


def test_the_rescue_puts_back_only_the_replica_its_step_took_out(lab, key):
    """Replica 1 never becomes healthy on the new config (a unit drop-in on the host keeps its engine loading), after
    replica 0 switched: replica 1 is rolled back, put back on its old config, and the router lists exactly the
    config's two engines (no stranger, none missing, nothing that is not an engine)."""
    _ensure(lab, key)
    if _budget(lab, 1) != 15:  # replica 1 must change (to ddtree-b32) for its deploy to start the engine
        _deploy(lab, X2)
    lab.ssh(HOST, f"mkdir -p {DROP_IN} && printf '[Service]\\nEnvironment=SGLANG_SIM_NEVER_HEALTHY=1\\n' "
                  f"> {DROP_IN}/lab-never-healthy.conf && systemctl daemon-reload")
    try:
        proc = _deploy(lab, B32, check=False)
    finally:
        lab.ssh(HOST, f"rm -rf {DROP_IN} && systemctl daemon-reload", check=False)
    assert proc.returncode != 0, proc.stdout[-3000:]
    stop = [x for x in proc.stdout.splitlines() if "ROLLOUT STOPPED" in x]
    assert f"ROLLOUT STOPPED on {HOST} at {B32}-r1: " in proc.stdout, proc.stdout[-3000:]
    assert "it was rolled back and put back into the router" in proc.stdout, stop
    assert f"done before it: {B32}-r0" in proc.stdout, stop
    assert "ROLLED OUT" not in proc.stdout, proc.stdout[-3000:]
    listed = _listed(lab, key)
    assert listed == _both(lab), listed
    # Each listed URL is an engine: replica 0 switched (budget 32), replica 1 back on its old config (15).
    assert [_budget(lab, 0), _budget(lab, 1)] == [32, 15]
    assert lab.ssh(HOST, f"systemctl is-active sglang-{X2}-r1.service", check=False).stdout.strip() == "active"


def _newest_record(lab, deploy_name: str) -> dict:
    path = lab.ssh(HOST, f"ls -1t {STATE}/{deploy_name}/records/*.json | head -1").stdout.strip()
    return json.loads(lab.ssh(HOST, f"cat {path}").stdout)


def _summary_row(stdout: str) -> str:
    lines = stdout.splitlines()
    at = max(i for i, x in enumerate(lines) if x.startswith("SUMMARY"))
    return next(x for x in lines[at + 1:] if x.strip().startswith(HOST))


def test_the_canary_watch_sees_a_collapse_under_live_traffic_and_rolls_it_back_with_no_failed_request(lab, key):
    """Issue 36: the gates pass on a 12-request burst; the collapse comes later, under live traffic. The canary's
    watch, in the router under paced load, sees the accept length fall below gates.min_accept_length for 2 intervals
    in a row and rolls it back (out of the router first): 0 failed requests, replica 1 never stopped, the record
    says rolled_back by the watch with the per-interval numbers, and the run's last lines say so."""
    _ensure(lab, key)
    budgets = [_budget(lab, i) for i in (0, 1)]
    r1 = f"sglang-{NAME[budgets[1]]}-r1.service"
    r1_since = _since(lab, r1)
    router = f"http://{lab.address(HOST)}:{ROUTER_PORT}"
    with Load([router], {router: key}) as load:
        proc = _deploy(lab, COLLAPSE, check=False)
    assert proc.returncode != 0, proc.stdout[-3000:]
    assert f"WATCH FAILED on {HOST} for {COLLAPSE}-r0: watch FAILED after " in proc.stdout, proc.stdout[-3000:]
    assert "2 consecutive failed interval(s) (failure_limit 2)" in proc.stdout, proc.stdout[-3000:]
    assert f"ROLLOUT STOPPED on {HOST} at {COLLAPSE}-r0 (the canary)" in proc.stdout, proc.stdout[-3000:]
    assert "it was rolled back and put back into the router" in proc.stdout, proc.stdout[-3000:]
    assert "watch FAILED, rolled back" in _summary_row(proc.stdout), proc.stdout[-2000:]
    failed = [d for d in load.done if not d[3]]
    assert len(load.done) > 50 and failed == [], failed[:5]
    record = _newest_record(lab, f"{COLLAPSE}-r0")
    assert record["outcome"] == "rolled_back" and record["rollback"]["cause"] == "watch", record["rollback"]
    watch = record["watch"]
    assert watch["result"] == "failed" and watch["thresholds"]["min_accept_length"] == 8.0, watch
    bad = [i for i in watch["intervals"] if i["verdict"] == "fail"]
    assert len(bad) >= 2 and all(i["accept_length"] is not None and i["accept_length"] < 8.0 for i in bad[-2:]), watch
    assert all(i["requests"] >= 3 for i in bad), watch
    # Before the collapse (100 requests; the gates take 60) the live accept length was above the minimum.
    assert any(i["verdict"] == "pass" and i["accept_length"] >= 8.0 for i in watch["intervals"]), watch
    # The canary serves its old config again, in the router; replica 1 was never stopped.
    assert _wait_listed(lab, key, _both(lab)) == _both(lab)
    assert [_budget(lab, i) for i in (0, 1)] == budgets
    assert _since(lab, r1) == r1_since


def test_with_no_traffic_the_watch_is_inconclusive_and_the_rollout_keeps_the_canary(lab, key):
    """Issue 36: no requests reach the canary during its window, so every interval is inconclusive: the canary is
    kept (never called "passed"), the other replica rolls (not watched again), and status shows inconclusive."""
    _ensure(lab, key)
    proc = _deploy(lab, QUIET, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"WATCH on {HOST}: watch INCONCLUSIVE over 12 s (3 interval(s) of 4 s)" in proc.stdout, proc.stdout[-3000:]
    assert "kept, not passed" in proc.stdout and "watch passed" not in proc.stdout, proc.stdout[-3000:]
    assert f"ROLLED OUT on {HOST}: {QUIET}" in proc.stdout and "canary watch INCONCLUSIVE" in proc.stdout, \
        proc.stdout[-3000:]
    assert "watch canary inconclusive" in _summary_row(proc.stdout), proc.stdout[-2000:]
    canary, other = _newest_record(lab, f"{QUIET}-r0"), _newest_record(lab, f"{QUIET}-r1")
    assert canary["outcome"] == "deployed" and canary["watch"]["result"] == "inconclusive", canary["watch"]
    assert [i["verdict"] for i in canary["watch"]["intervals"]] == ["inconclusive"] * 3
    assert other["outcome"] == "deployed" and other["watch"]["result"] == "canary inconclusive", other["watch"]
    # make status: the watch column of each replica's newest record (and the collapse case's, when it ran before).
    status = make(lab, "status", f"INVENTORY={lab.inventory}", f"LIMIT={HOST}")
    assert status.returncode == 0, (status.stdout + status.stderr)[-3000:]
    rows = {line.split()[0]: line for line in status_lines(status) if line.startswith("lab-watch-x2-")}
    assert " inconclusive " in rows[f"{QUIET}-r0"] and " canary inconclusive " in rows[f"{QUIET}-r1"], rows
    if f"{COLLAPSE}-r0" in rows:
        assert "rolled back by the post-deploy watch" in rows[f"{COLLAPSE}-r0"], rows
