"""One engine over two lab hosts (serving.nnodes 2; docs/multinode.md; issue 37 deliver 2).

Real ansible-playbook over SSH to lab1 and lab2; the engine is the simulator (test equipment) honouring
--nnodes/--node-rank/--dist-init-addr: rank 0 (lab1) serves HTTP only once rank 1 (lab2) joined it on the
dist-init port, and exits 1 when rank 1 goes away. In order: a first start, a switch to another config over the
same GPUs, a deploy whose gate fails on rank 0 (both hosts roll back), and a deploy whose rank 1 is killed once rank
0 serves (the engine goes down, both hosts roll back). The configs use GPU 6 and ports 32000-32012 of both hosts,
away from the other lab tests'; at the end their units and files are removed from both hosts.
"""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
from test_deploy import LAB_CONFIGS, active_unit, newest_record, output_of

pytestmark = pytest.mark.lab

HOSTS = ("lab1", "lab2")
A, B, FAIL, KILL = "lab-2node-b15", "lab-2node-b32", "lab-2node-b32-accept-high", "lab-2node-b15-32010"
GROW = "lab-2node-grow"  # one-host/lab-2node-grow.yml on lab1, then lab-2node-grow.yml over lab1 and lab2
CONFIGS = (A, B, FAIL, KILL, GROW)


def unit(config: str) -> str:
    return f"sglang-{config}.service"


def deploy(lab, config: str, limit: str = "lab1,lab2", timeout: float = 900, extra: tuple[str, ...] = ()):
    """As `make deploy LIMIT=...` runs it (SERIAL 1, localhost beside the hosts): a batch is one engine's two ranks."""
    return lab.ansible_playbook("playbooks/deploy.yml", "-e", f"config={LAB_CONFIGS / config}.yml", "-e",
                                "deploy_serial=1", *extra, "--limit", f"{limit},localhost", check=False,
                                timeout=timeout)


def argv(lab, host: str, config: str) -> list[str]:
    pid = lab.ssh(host, f"systemctl show -p MainPID --value {unit(config)}").stdout.strip()
    return lab.ssh(host, f"tr '\\0' '\\n' < /proc/{pid}/cmdline").stdout.split("\n")


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def health(lab, port: int) -> int:
    out = lab.ssh("lab1", f"curl -s -o /dev/null -w '%{{http_code}}' http://{lab.address('lab1')}:{port}/health",
                  check=False).stdout.strip()
    return int(out or 0)


def listens(lab, host: str, port: int) -> bool:
    return f":{port} " in lab.ssh(host, "ss -Hltn", check=False).stdout


@pytest.fixture(scope="module", autouse=True)
def leave_hosts_as_found(lab):
    if not all(h in lab.hosts for h in HOSTS):
        pytest.skip("needs the lab's two hosts lab1 and lab2")
    yield
    for host in HOSTS:
        for c in CONFIGS:
            lab.ssh(host, f"systemctl disable --now {unit(c)} 2>/dev/null; rm -rf /etc/systemd/system/{unit(c)} "
                          f"/etc/sglang/{c}.env /var/lib/sglang-deploy/{c}; systemctl daemon-reload", check=False,
                    timeout=300)


def test_a_partial_engine_is_refused_before_any_change(lab):
    proc = deploy(lab, A, limit="lab1")
    out = output_of(proc)
    assert proc.returncode != 0
    assert ("config " + str(LAB_CONFIGS / A) + ".yml: serving.nnodes 2 needs that many hosts that switch together; "
            "lab1's engine (sglang_engine_group '') has lab1 (1)") in " ".join(out.split()), out[-3000:]
    for host in HOSTS:
        assert lab.ssh(host, f"test -e /etc/systemd/system/{unit(A)}", check=False).returncode != 0


def test_a_rank_refused_by_its_own_plan_stops_every_rank_before_any_change(lab):
    # Serving port 32000 taken on lab2 only: lab2's plan (after its lock) refuses; lab1 must not switch alone.
    lab.ssh("lab2", "systemd-run --unit sgdeploy-test-squat.service python3 -m http.server 32000 "
                    f"--bind {lab.address('lab2')}")
    try:
        deadline = time.monotonic() + 20
        while not listens(lab, "lab2", 32000) and time.monotonic() < deadline:
            time.sleep(0.3)
        proc = deploy(lab, A)
    finally:
        lab.ssh("lab2", "systemctl stop sgdeploy-test-squat.service", check=False)
    out = " ".join(output_of(proc).split())
    assert proc.returncode != 0
    assert f"DEPLOY REFUSED on lab2 before any change: config {A}: port {lab.address('lab2')}:32000 is already in use" \
        in out, out[-3000:]
    assert (f"ENGINE FAILED: lab2 (rank 1) (rank(s) of {A} with lab1) did not get past the plan; one rank failing "
            "fails the engine, so no rank changes") in out, out[-3000:]
    for host in HOSTS:
        assert lab.ssh(host, f"test -e /etc/systemd/system/{unit(A)}", check=False).returncode != 0


def test_a_first_start_runs_rank_0_on_lab1_and_rank_1_on_lab2(lab):
    started = time.monotonic()
    proc = deploy(lab, A)
    out = output_of(proc)
    assert proc.returncode == 0, out[-4000:]
    for host, rank in zip(HOSTS, ("0", "1"), strict=True):
        assert active_unit(lab, host, unit(A)) == "active"
        args = argv(lab, host, A)
        assert (flag(args, "--nnodes"), flag(args, "--node-rank")) == ("2", rank)
        assert flag(args, "--dist-init-addr") == f"{lab.address('lab1')}:32002"
        assert newest_record(lab, host, A)["outcome"] == "deployed"
    # Rank 0 serves HTTP and the dist-init port; rank 1 serves neither (it joined rank 0).
    assert health(lab, 32000) == 200 and listens(lab, "lab1", 32002)
    assert "dist-init: all 2 ranks joined" in lab.ssh("lab1", f"journalctl -u {unit(A)} --no-pager").stdout
    assert "dist-init: joined rank 0" in lab.ssh("lab2", f"journalctl -u {unit(A)} --no-pager").stdout
    # The gates ran on rank 0 only; rank 1's record says where.
    assert newest_record(lab, "lab1", A)["gates"]
    assert "gates: on rank 0, lab1" in newest_record(lab, "lab2", A)["message"]
    print(f"first start of two ranks: {time.monotonic() - started:.1f} s")


def lab_now(lab, host: str) -> str:
    return lab.ssh(host, "date +%s").stdout.strip()


def rank_1_stop_log(lab, config: str, since: str) -> str:
    return lab.ssh("lab2", f"journalctl -u {unit(config)} --since @{since} --no-pager -o cat").stdout


def test_a_switch_moves_both_ranks_to_the_new_config(lab):
    since = lab_now(lab, "lab2")
    started = time.monotonic()
    proc = deploy(lab, B)
    out = output_of(proc)
    assert proc.returncode == 0, out[-4000:]
    # Rank 0 stopped first (it drains); rank 1, which ignores SIGTERM as SGLang 0.5.23 does, ended with rank 0's clean
    # stop and was never sent a SIGTERM while rank 0 still served (its stop timeout never ran under rank 0's drain).
    log = rank_1_stop_log(lab, A, since)
    assert "dist-init: rank 0 stopped cleanly; exiting" in log, log[-2000:]
    assert "SIGTERM received on node_rank 1" not in log, log[-2000:]
    assert "Result=success" in lab.ssh("lab2", f"systemctl show -p Result {unit(A)}").stdout
    print(f"switch of two ranks: {time.monotonic() - started:.1f} s (stop_timeout_s 600)")
    for host in HOSTS:
        assert active_unit(lab, host, unit(B)) == "active"
        assert active_unit(lab, host, unit(A)) in ("inactive", "unknown")
        assert newest_record(lab, host, B)["outcome"] == "deployed"
    assert flag(argv(lab, "lab2", B), "--speculative-ddtree-budget") == "32"
    assert health(lab, 32000) == 200


def test_a_gate_failing_on_rank_0_rolls_both_ranks_back(lab):
    before = {h: lab.ssh(h, f"systemctl show -p MainPID --value {unit(B)}").stdout.strip() for h in HOSTS}
    proc = deploy(lab, FAIL)
    out = output_of(proc)
    assert proc.returncode != 0
    assert "GATE FAILED on lab1" in out and "DEPLOY FAILED on lab1" in out and "DEPLOY FAILED on lab2" in out, \
        out[-4000:]
    assert "ENGINE FAILED: lab1 (rank 0)" in out  # lab2 did not commit alone
    for host in HOSTS:
        assert active_unit(lab, host, unit(B)) == "active" and active_unit(lab, host, unit(FAIL)) != "active"
        assert newest_record(lab, host, FAIL)["outcome"] == "rolled_back"
        now = lab.ssh(host, f"systemctl show -p MainPID --value {unit(B)}").stdout.strip()
        assert now != before[host]  # restarted by the rollback
    assert health(lab, 32000) == 200


def test_a_killed_rank_takes_the_engine_down_and_both_ranks_roll_back(lab):
    killed = {}

    def kill_rank_1_once_rank_0_serves():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and health(lab, 32010) != 200:
            time.sleep(0.3)
        killed["at"] = time.monotonic()
        lab.ssh("lab2", f"systemctl kill -s SIGKILL {unit(KILL)}", check=False)

    thread = threading.Thread(target=kill_rank_1_once_rank_0_serves, daemon=True)
    thread.start()
    proc = deploy(lab, KILL)
    thread.join(10)
    out = output_of(proc)
    assert "at" in killed, out[-4000:]
    assert proc.returncode != 0, out[-4000:]
    journal = lab.ssh("lab1", f"journalctl -u {unit(KILL)} --no-pager").stdout
    assert "ERROR: rank 1 left the engine" in journal
    assert "DEPLOY FAILED on lab1" in out and "DEPLOY FAILED on lab2" in out, out[-4000:]
    for host in HOSTS:
        assert active_unit(lab, host, unit(B)) == "active" and active_unit(lab, host, unit(KILL)) != "active"
        record = newest_record(lab, host, KILL)
        assert record["outcome"] == "rolled_back", json.dumps(record)[:2000]
    assert health(lab, 32000) == 200


def main_pids(lab, config: str) -> dict[str, str]:
    return {h: lab.ssh(h, f"systemctl show -p MainPID --value {unit(config)}").stdout.strip() for h in HOSTS}


def test_a_change_to_rank_0_alone_restarts_every_rank(lab):
    # A hand edit of rank 0's unit (drift, lab1 only): lab1's plan changes, lab2's does not; NCCL ranks cannot rejoin
    # a running engine, so lab2 must restart with it.
    before = main_pids(lab, B)
    lab.ssh("lab1", f"echo '# edited by hand' >> /etc/systemd/system/{unit(B)}")
    proc = deploy(lab, B)
    out = output_of(proc)
    assert proc.returncode == 0, out[-4000:]
    flat = " ".join(out.split())
    assert "drift corrected" in flat and "restarted with its engine (lab1 changed;" in flat, out[-4000:]
    after = main_pids(lab, B)
    for host in HOSTS:
        assert active_unit(lab, host, unit(B)) == "active"
        assert after[host] != before[host], f"{host}: {unit(B)} was not restarted (pid {before[host]})"
    assert "restarted with its engine (lab1 changed" in newest_record(lab, "lab2", B)["message"]
    assert health(lab, 32000) == 200


def test_a_rollback_leaving_out_a_rank_is_refused_and_make_rollback_takes_both_back(lab):
    before = main_pids(lab, B)
    proc = lab.ansible_playbook("playbooks/rollback.yml", "-e", f"config={B}", "--limit", "lab1", check=False)
    out = " ".join(output_of(proc).split())
    assert proc.returncode != 0
    assert (f"ROLLBACK REFUSED on lab1 before any change: config {B}: its engine spans 2 hosts that go back together; "
            "lab1's engine (sglang_engine_group '') has lab1 (1)") in out, out[-3000:]
    assert main_pids(lab, B) == before  # nothing was stopped
    # `make rollback CONFIG=... LIMIT=lab1,lab2` (SERIAL 1: one engine, both ranks in one batch).
    since = lab_now(lab, "lab2")
    proc = lab.ansible_playbook("playbooks/rollback.yml", "-e", f"config={B}", "-e", "rollback_serial=1",
                                "--limit", "lab1,lab2,localhost", check=False, timeout=900)
    out = output_of(proc)
    assert proc.returncode == 0, out[-4000:]
    flat = " ".join(out.split())
    for host in HOSTS:
        assert f"{host}: {B} rolled back to {A}" in flat, out[-4000:]
        assert active_unit(lab, host, unit(A)) == "active" and active_unit(lab, host, unit(B)) != "active"
        assert newest_record(lab, host, B)["outcome"] == "rolled_back"
    assert "smoke gate passed" in newest_record(lab, "lab1", B)["message"]
    assert "smoke gate: on rank 0, lab1" in newest_record(lab, "lab2", B)["message"]
    # Rank 1 of B stopped after rank 0 of B (no SIGTERM it would ignore).
    log = rank_1_stop_log(lab, B, since)
    assert "dist-init: rank 0 stopped cleanly; exiting" in log, log[-2000:]
    assert "SIGTERM received on node_rank 1" not in log, log[-2000:]
    # Rank 0 serves A (budget 15) with rank 1 of A joined.
    assert flag(argv(lab, "lab1", A), "--speculative-ddtree-budget") == "15"
    assert (flag(argv(lab, "lab2", A), "--node-rank")) == "1"
    assert health(lab, 32000) == 200
    # make status: the engine is one row, its hosts rank 0 first (not a row per rank).
    status = output_of(lab.ansible_playbook("playbooks/status.yml", "--limit", "lab1,lab2,localhost", check=False))
    assert re.search(rf"lab1,lab2 +{A} +serving ", status), status[-3000:]
    assert not re.search(rf"\"lab[12] +{A} ", status), status[-3000:]


def test_a_deploy_on_one_host_of_the_engine_is_refused_before_any_change(lab):
    # one-host/lab-2node-grow takes GPU 6 of A over whole on one host: on lab2 alone it would stop rank 1 while rank 0
    # serves (SGLang's rank ignores the SIGTERM, rank 0's process group breaks), on lab1 alone rank 0 and leave rank 1.
    started = time.monotonic()
    before = main_pids(lab, A)
    for host, rank, other in (("lab2", 1, "lab1"), ("lab1", 0, "lab2")):
        proc = deploy(lab, "one-host/" + GROW, limit=host, extra=("-e", f"replaces={A}"))
        out = " ".join(output_of(proc).split())
        assert proc.returncode != 0, out[-3000:]
        assert (f"DEPLOY REFUSED on {host} before any change: deploying {GROW} would stop {A} (active, {unit(A)}: "
                "GPU 6 overlaps") in out, out[-3000:]
        assert (f"here, rank {rank} of an engine over hosts lab1,lab2 whose other host {other} is not in the run; "
                "its ranks stop only together, rank 0 first") in out, out[-3000:]
        assert ("include every host of the engine in the run, in one batch (e.g. LIMIT=lab1,lab2 SERIAL=2 "
                f"REPLACES={A}), or roll the engine off first (systemctl disable --now {unit(A)} on lab1, then on "
                "lab2)") in out
        # Before any change: the engine serves, neither rank was restarted, nothing of the one-host deploy is there.
        assert main_pids(lab, A) == before and health(lab, 32000) == 200
        assert lab.ssh(host, f"test -e /etc/systemd/system/{unit(GROW)}", check=False).returncode != 0
    print(f"two refused one-host deploys: {time.monotonic() - started:.1f} s")


def test_one_host_deploys_over_every_host_of_the_engine_go_back_together_when_rank_0s_host_fails(lab, tmp_path):
    # one-host/lab-2node-grow with REPLACES=A on lab1 and lab2 in one batch (SERIAL=2): each host displaces its rank of
    # A. lab1's acceptance gate fails (the simulator's SGLANG_SIM_ACCEPT_OVERRIDE=1.0 in lab1's env file only, through
    # a second inventory): lab2, whose own gate passed, must not commit its one-host config while lab1 restarts rank 0
    # of A; both go back and A serves again over both hosts (docs/multinode.md).
    started = time.monotonic()
    fault = tmp_path / "lab1-accept-fault.yml"
    fault.write_text(json.dumps({"all": {"hosts": {"lab1": {"sglang_secret_env": {
        "SGLANG_SIM_ACCEPT_OVERRIDE": "1.0"}}}}}))
    extra = ("-i", str(fault), "-e", f"replaces={A}", "-e", "deploy_serial=2")
    before = main_pids(lab, A)
    plan = deploy(lab, "one-host/" + GROW, extra=("--check", *extra))  # make plan: the checks after the plan pass
    assert plan.returncode == 0, output_of(plan)[-4000:]
    assert f"PLAN on lab2: {GROW} replaces {A}" in " ".join(output_of(plan).split()), output_of(plan)[-4000:]
    assert main_pids(lab, A) == before
    proc = deploy(lab, "one-host/" + GROW, extra=extra)
    out = " ".join(output_of(proc).split())
    assert proc.returncode != 0, out[-4000:]
    assert "GATE FAILED on lab1" in out and "DEPLOY FAILED on lab1" in out, out[-4000:]
    assert (f"ENGINE FAILED: lab1 (rank 0 of {A}) did not get past the gates; the hosts of an engine switch and go "
            f"back together, and this deploy of {GROW} on lab2 displaces {A} (rank 1 of the engine over lab1,lab2), so "
            f"every host goes back: lab2 restarts its rank of {A}") in out, out[-4000:]
    assert f"DEPLOY FAILED on lab2: {GROW}" in out and f"Rolled back to {unit(A)}, healthy" in out, out[-4000:]
    # The engine over both hosts serves again; neither host committed the one-host config.
    for host in HOSTS:
        assert active_unit(lab, host, unit(A)) == "active"
        assert active_unit(lab, host, unit(GROW)) in ("inactive", "unknown", "failed")
        assert newest_record(lab, host, GROW)["outcome"] == "rolled_back"
        current = lab.ssh(host, f"test -e /var/lib/sglang-deploy/{GROW}/current.json", check=False)
        assert current.returncode != 0, host
    assert flag(argv(lab, "lab2", A), "--node-rank") == "1"
    assert health(lab, 32000) == 200
    print(f"one-host deploys over the engine, rank 0's gate failing, both back: {time.monotonic() - started:.1f} s")


def test_make_rollback_takes_an_engine_grown_from_one_host_back_and_removes_its_other_rank(lab):
    # lab-2node-grow ran on lab1 alone, then over lab1 and lab2 (lab2 has no previous deploy of it): make rollback takes
    # lab1 back to its one-host deploy and stops and removes lab2's rank (docs/multinode.md).
    for host in HOSTS:  # A is done with: rank 0 first
        lab.ssh(host, f"systemctl disable --now {unit(A)}", check=False, timeout=120)
    started = time.monotonic()
    proc = deploy(lab, "one-host/" + GROW, limit="lab1")
    assert proc.returncode == 0, output_of(proc)[-4000:]
    proc = deploy(lab, GROW)
    assert proc.returncode == 0, output_of(proc)[-4000:]
    assert flag(argv(lab, "lab2", GROW), "--node-rank") == "1"
    proc = lab.ansible_playbook("playbooks/rollback.yml", "-e", f"config={GROW}", "-e", "rollback_serial=1",
                                "--limit", "lab1,lab2,localhost", check=False, timeout=900)
    out = output_of(proc)
    assert proc.returncode == 0, out[-4000:]
    flat = " ".join(out.split())
    assert f"lab1: {GROW} rolled back to {GROW}" in flat, out[-4000:]
    assert (f"lab2: {GROW} rank 1 of the engine over lab1,lab2 stopped and removed: no previous deploy of {GROW} here "
            "(it ran on lab1)") in flat, out[-4000:]
    # lab1 serves the one-host deploy again (no rank flags); lab2 keeps nothing of the config but its previous.json.
    assert active_unit(lab, "lab1", unit(GROW)) == "active" and "--nnodes" not in argv(lab, "lab1", GROW)
    assert health(lab, 32010) == 200
    assert active_unit(lab, "lab2", unit(GROW)) in ("inactive", "unknown")
    gone = lab.ssh("lab2", f"ls /etc/systemd/system/{unit(GROW)} /etc/sglang/{GROW}.env "
                           f"/var/lib/sglang-deploy/{GROW}/current.json", check=False)
    assert gone.stdout.strip() == "", gone.stdout
    assert json.loads(lab.ssh("lab2", f"cat /var/lib/sglang-deploy/{GROW}/previous.json").stdout)["node_rank"] == 1
    for host in HOSTS:
        assert newest_record(lab, host, GROW)["outcome"] == "rolled_back"
    print(f"one host, two hosts, rollback to one host: {time.monotonic() - started:.1f} s")
