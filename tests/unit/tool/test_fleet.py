"""The fleet router's plan (sgdeploy.fleet, issue 37 deliver 1): each GPU host's engine URL, the router, the batch
size; and the fleets it refuses in one line before any host is touched (docs/router.md, "The fleet router")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sgdeploy import fleet, spec

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
LAB = REPO / "tests" / "lab" / "configs"
H = fleet.Host
LAB_ENGINES = [H(f"lab{i}", f"127.0.42.1{i}", f"127.0.42.1{i}") for i in (1, 2, 3)]
LAB_ROUTER = [H("lab4", "127.0.42.14", "127.0.42.14")]


def _cfg(name: str) -> spec.Config:
    return spec.load(str(LAB / f"{name}.yml"))


def test_the_lab_fleet_plan():
    got = fleet.plan(_cfg("lab-fleet-b15"), LAB_ENGINES, LAB_ROUTER, "2")
    assert got["workers"] == ["http://127.0.42.11:31300", "http://127.0.42.12:31300", "http://127.0.42.13:31300"]
    assert [e["host"] for e in got["engines"]] == ["lab1", "lab2", "lab3"]
    assert got["router"] == {"host": "lab4", "bind_address": "127.0.42.14", "port": 31300, "metrics_port": 31299,
                             "unit_name": "sglang-router-31300.service", "url": "http://127.0.42.14:31300"}
    assert got["max_unavailable"] == 2
    assert got["line"].endswith("the canary (lab1) first, then 2 at a time")


def test_two_router_hosts_each_list_every_engine():
    """A router pair (issue 37, more than one router host): each router runs on its own address with every engine as
    its workers; the first is the one the canary's same-window gate reads (any of them serves the old engines)."""
    pair = LAB_ROUTER + [H("lab5", "127.0.42.15", "127.0.42.15")]
    got = fleet.plan(_cfg("lab-fleet-b15"), LAB_ENGINES, pair, "2")
    assert [r["host"] for r in got["routers"]] == ["lab4", "lab5"]
    assert [r["url"] for r in got["routers"]] == ["http://127.0.42.14:31300", "http://127.0.42.15:31300"]
    assert got["router"] == got["routers"][0]
    assert got["routers"][1]["unit_name"] == "sglang-router-31300.service"
    assert got["workers"] == ["http://127.0.42.11:31300", "http://127.0.42.12:31300", "http://127.0.42.13:31300"]
    assert got["line"] == ("3 engine(s) of lab-fleet-b15 behind 2 fleet routers, on lab4 (http://127.0.42.14:31300) "
                           "and lab5 (http://127.0.42.15:31300): the canary (lab1) first, then 2 at a time")
    one = fleet.plan(_cfg("lab-fleet-b15"), LAB_ENGINES, LAB_ROUTER, "2")
    assert one["line"].startswith("3 engine(s) of lab-fleet-b15 behind the fleet router on lab4 (http://127.0.42.14:31300)")


def test_replicas_behind_the_fleet_router_are_each_a_worker_of_every_router():
    """serving.replicas 2 on each of 3 GPU hosts: six engines, every one a worker of the fleet router (no per-host
    router; port 31400 stays free on the GPU hosts); max_unavailable counts replicas; the canary is one replica."""
    got = fleet.plan(_cfg("lab-fleet-r2-b15"), LAB_ENGINES, LAB_ROUTER, "3")
    assert got["workers"] == [f"http://127.0.42.1{h}:{p}" for h in (1, 2, 3) for p in (31401, 31403)]
    assert [(e["host"], e["deploy"], e["replica"]) for e in got["engines"]] == [
        (f"lab{h}", f"lab-fleet-r2-b15-r{i}", i) for h in (1, 2, 3) for i in (0, 1)]
    assert got["router"]["url"] == "http://127.0.42.14:31400" and got["router"]["metrics_port"] == 31399
    assert got["max_unavailable"] == 3 and got["replicas_per_host"] == 2
    # The canary alone, then every host's replica 0, then every host's replica 1, three at a time.
    assert [[(e["host"], e["replica"]) for e in b] for b in got["batches"]] == [
        [("lab1", 0)], [("lab2", 0), ("lab3", 0), ("lab1", 1)], [("lab2", 1), ("lab3", 1)]]
    # One engine per host per step: each batch here is one step (its engines on different hosts, rolled together).
    assert [(s["batch"], {h: e["replica"] for h, e in s["engines"].items()}) for s in got["steps"]] == [
        (0, {"lab1": 0}), (1, {"lab2": 0, "lab3": 0, "lab1": 1}), (2, {"lab2": 1, "lab3": 1})]
    assert got["line"] == ("6 engine(s) (2 replica(s) on each of 3 GPU host(s)) of lab-fleet-r2-b15 behind the fleet "
                           "router on lab4 (http://127.0.42.14:31400): the canary (lab1 lab-fleet-r2-b15-r0) first, "
                           "then 3 at a time")


@pytest.mark.parametrize("text,want", [("5", 5), ("50%", 3), ("100%", 5), ("1", 1)])
def test_max_unavailable_counts_replicas(text, want):
    """Six replicas (3 hosts x 2): at most 5 out at once after the canary; 6 is refused, naming the replicas' count."""
    got = fleet.plan(_cfg("lab-fleet-r2-b15"), LAB_ENGINES, LAB_ROUTER, text)
    assert got["max_unavailable"] == want
    assert sum(len(b) for b in got["batches"]) == 6 and len(got["batches"][0]) == 1
    assert all(len(b) <= want for b in got["batches"])
    for step in got["steps"]:  # never two engines of one host in one step, and a step never spans two batches
        assert len(step["engines"]) == len({e["host"] for e in step["engines"].values()})
    with pytest.raises(fleet.FleetError, match=r"^max_unavailable '6' is not allowed: use a whole number from 1 to 5,"
                                               r".*of the 6 engine\(s\)"):
        fleet.plan(_cfg("lab-fleet-r2-b15"), LAB_ENGINES, LAB_ROUTER, "6")


def test_a_host_with_two_engines_in_one_batch_rolls_them_one_after_the_other():
    """Two GPU hosts x 2 replicas, max_unavailable 3: the batch after the canary holds both of lab2's replicas, which
    go in two steps (one at a time on lab2), lab1's replica 1 beside the first."""
    got = fleet.plan(_cfg("lab-fleet-r2-b15"), LAB_ENGINES[:2], LAB_ROUTER, "3")
    assert [[(e["host"], e["replica"]) for e in b] for b in got["batches"]] == [
        [("lab1", 0)], [("lab2", 0), ("lab1", 1), ("lab2", 1)]]
    assert [(s["batch"], {h: e["replica"] for h, e in s["engines"].items()}) for s in got["steps"]] == [
        (0, {"lab1": 0}), (1, {"lab2": 0, "lab1": 1}), (1, {"lab2": 1})]


def test_one_engine_per_host_batches_as_the_hosts():
    got = fleet.plan(_cfg("lab-fleet-b15"), LAB_ENGINES, LAB_ROUTER, "2")
    assert [[e["host"] for e in b] for b in got["batches"]] == [["lab1"], ["lab2", "lab3"]]
    assert [e["replica"] for e in got["engines"]] == [None] * 3
    assert [e["deploy"] for e in got["engines"]] == ["lab-fleet-b15"] * 3


def test_no_router_host_is_refused():
    with pytest.raises(fleet.FleetError, match=r"^inventory group routers has no host"):
        fleet.plan(_cfg("lab-fleet-b15"), LAB_ENGINES, [])


def test_engines_on_every_address_are_reached_where_ansible_reaches_them():
    engines = [H("gpu1", "10.0.0.11", "0.0.0.0"), H("gpu2", "10.0.0.12", "0.0.0.0")]
    cfg = _cfg("lab-engine-key")  # names serving.api_key_secret: a non-loopback bind is allowed
    got = fleet.plan(cfg, engines, [H("r", "10.0.0.2", "10.0.0.2")])
    assert got["workers"] == [f"http://10.0.0.11:{cfg.serving.port}", f"http://10.0.0.12:{cfg.serving.port}"]
    assert got["max_unavailable"] == 1


@pytest.mark.parametrize("text,engines,want", [("", 3, 1), ("1", 3, 1), ("2", 3, 2), ("10%", 64, 6),
                                                ("50%", 3, 1), ("100%", 8, 7), ("1%", 3, 1), ("1", 1, 1)])
def test_max_unavailable(text, engines, want):
    assert fleet.batch_size(text, engines) == want


@pytest.mark.parametrize("text", ["0", "3", "-1", "x", "2.5", "0%", "101%", "1 %"])
def test_a_bad_max_unavailable_is_refused(text):
    with pytest.raises(fleet.FleetError, match=r"^max_unavailable '.*' is not allowed: use a whole number from 1 to 2"):
        fleet.batch_size(text, 3)


@pytest.mark.parametrize("engines,routers,config,match", [
    ([H("g1", "10.0.0.11"), H("g2", "10.0.0.12")], [H("r", "10.0.0.2", "10.0.0.2")], "lab-fleet-b15",
     r"^host g1: the engine of lab-fleet-b15 binds 127\.0\.0\.1 \(loopback\), which the fleet router on r "
     r"\(10\.0\.0\.2\) cannot reach: set serving\.host or the host's sglang_bind_address"),
    ([H("g1", "127.0.0.1"), H("g2", "127.0.0.1")], [H("r", "127.0.0.1")], "lab-fleet-b15",
     r"^hosts g1 and g2: both engines of lab-fleet-b15 would be http://127\.0\.0\.1:31300"),
    (LAB_ENGINES, [LAB_ENGINES[0]], "lab-fleet-b15", r"^host lab1 is in both gpu_hosts and routers"),
    (LAB_ENGINES, LAB_ROUTER + [LAB_ENGINES[1]], "lab-fleet-b15", r"^host lab2 is in both gpu_hosts and routers"),
    (LAB_ENGINES, LAB_ROUTER + [H("lab5", "127.0.42.15", "127.0.42.14")], "lab-fleet-b15",
     r"^hosts lab4 and lab5: both fleet routers of lab-fleet-b15 would be http://127\.0\.42\.14:31300"),
    ([H("g1", "127.0.0.11"), H("g2", "127.0.0.12")], [H("r1", "127.0.0.1"), H("r2", "10.0.0.3", "10.0.0.3")],
     "lab-fleet-b15",
     r"^host g1: the engine of lab-fleet-b15 binds 127\.0\.0\.1 \(loopback\), which the fleet router on r2 "
     r"\(10\.0\.0\.3\) cannot reach"),
    ([], LAB_ROUTER, "lab-fleet-b15", r"^inventory group gpu_hosts has no host"),
])
def test_a_fleet_that_does_not_fit_is_refused(engines, routers, config, match):
    with pytest.raises(fleet.FleetError, match=match):
        fleet.plan(_cfg(config), engines, routers)


def test_the_deploy_refuses_an_unreachable_fleet_before_any_host_is_touched(tmp_path):
    """make deploy with a routers group whose router is on another machine and engines on loopback: one line, exit
    non-zero, and no task runs on a GPU host (they are unreachable addresses: any connection would fail otherwise)."""
    inv = tmp_path / "inventory.yml"
    unreachable = {"ansible_host": "192.0.2.1", "ansible_connection": "ssh", "gpu_count": 8}
    inv.write_text(yaml.safe_dump({"all": {"children": {
        "gpu_hosts": {"hosts": {"gpu1": dict(unreachable), "gpu2": dict(unreachable, ansible_host="192.0.2.2")}},
        "routers": {"hosts": {"router1": {"ansible_host": "192.0.2.3", "ansible_connection": "local",
                                          "ansible_python_interpreter": sys.executable}}}}}}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), "playbooks/deploy.yml", "-e",
                           f"config={LAB / 'lab-fleet-b15.yml'}"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300, check=False, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0
    assert ("FLEET REFUSED before any change: host gpu1: the engine of lab-fleet-b15 binds 127.0.0.1 (loopback), which "
            "the fleet router on router1 (192.0.2.3) cannot reach") in proc.stdout, proc.stdout[-3000:]
    assert not re.search(r"^gpu[12]\s+:", proc.stdout, re.M) and "UNREACHABLE" not in proc.stdout, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr


def _play(tmp_path, routers: dict, *extra: str, gpu_net: str = "192.0.2") -> subprocess.CompletedProcess:
    """playbooks/deploy.yml over GPU hosts nothing may connect to (ssh to addresses nobody answers) and local router
    hosts (name -> address, also their sglang_bind_address)."""
    inv = tmp_path / "inventory.yml"
    gpus = {f"gpu{i}": {"ansible_host": f"{gpu_net}.{i}", "sglang_bind_address": f"{gpu_net}.{i}",
                        "ansible_connection": "ssh", "gpu_count": 8} for i in (1, 2)}
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inv.write_text(yaml.safe_dump({"all": {"children": {
        "gpu_hosts": {"hosts": gpus},
        "routers": {"hosts": {name: {"ansible_host": addr, "sglang_bind_address": addr, **local}
                              for name, addr in routers.items()}}}}}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), "playbooks/deploy.yml", "-e",
                           f"config={LAB / 'lab-fleet-b15.yml'}", *extra], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300, check=False, stdin=subprocess.DEVNULL)


def test_a_router_pair_is_refused_in_one_line_before_any_host_is_touched(tmp_path):
    """Two router hosts: the plan is made once, so a fleet that does not fit is one FLEET REFUSED line, not one a
    router host (before: two router hosts were themselves refused)."""
    proc = _play(tmp_path, {"router1": "192.0.2.3", "router2": "192.0.2.4"}, "-e", "fleet_max_unavailable=5")
    assert proc.returncode != 0
    refused = [line for line in proc.stdout.splitlines() if line.startswith("fatal:") and "FLEET REFUSED" in line]
    assert len(refused) == 1 and refused[0].startswith("fatal: [router1]"), proc.stdout[-3000:]
    assert "FLEET REFUSED before any change: max_unavailable '5' is not allowed: use a whole number from 1 to 1" \
        in refused[0], refused
    assert not re.search(r"^gpu[12]\s+:", proc.stdout, re.M) and "UNREACHABLE" not in proc.stdout, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr


def test_a_limit_without_every_router_host_is_refused_before_any_change(tmp_path):
    """LIMIT names the GPU hosts and one router of a pair: the engines' play stops on its first task (an assert,
    which connects to nothing), naming the router host that did not plan."""
    proc = _play(tmp_path, {"router1": "127.0.0.3", "router2": "127.0.0.4"}, "--limit", "gpu1,gpu2,router1",
                 gpu_net="127.0.0")
    assert proc.returncode != 0
    assert ("FLEET REFUSED before any change: the fleet router's host router2 did not plan the fleet (it is not in "
            "LIMIT): name it too, e.g. LIMIT=gpu1,router1,router2") in proc.stdout, proc.stdout[-3000:]
    assert "FLEET PLAN: 2 engine(s) of lab-fleet-b15 behind 2 fleet routers" in proc.stdout, proc.stdout[-3000:]
    assert "UNREACHABLE" not in proc.stdout and "Traceback" not in proc.stdout + proc.stderr


def test_a_rollback_goes_max_unavailable_at_a_time_from_the_first_replica():
    got = fleet.plan(_cfg("lab-fleet-r2-b15"), LAB_ENGINES, LAB_ROUTER, "3")
    assert [(s["batch"], {h: e["replica"] for h, e in s["engines"].items()}) for s in got["rollback_steps"]] == [
        (0, {"lab1": 0, "lab2": 0, "lab3": 0}), (1, {"lab1": 1, "lab2": 1, "lab3": 1})]
    one = fleet.plan(_cfg("lab-fleet-b15"), LAB_ENGINES, LAB_ROUTER, "2")
    assert [sorted(s["engines"]) for s in one["rollback_steps"]] == [["lab1", "lab2"], ["lab3"]]


def _installed(workers: list[str], port: int = 31400) -> str:
    """A fleet router unit's text (role sglang_router) with these workers."""
    return (f"[Service]\nExecStart=/opt/sglang-router/0.3.2/venv/bin/python launch.py --host 127.0.42.14 --port {port} "
            f"--worker-urls {' '.join(workers)}\n")


R2 = [f"http://127.0.42.1{h}:{p}" for h in (1, 2, 3) for p in (31401, 31403)]


@pytest.mark.parametrize(("config", "workers", "want"), [
    # 2 replicas on each host now, the config asks for 1 (a scale down: replica 1 would keep running).
    ("lab-fleet-r1-b15", R2, "config lab-fleet-r1-b15: serving.replicas 1 behind the fleet router "
     "http://127.0.42.14:31400 (on lab4), which fronts 2 engine(s) on each GPU host now: a change of the replica count "
     "behind the fleet router is not supported (the surplus engines would not be retired): keep serving.replicas at 2 "
     "for port 31400 (sgdeploy does not change the replica count of a running fleet yet)"),
    # One engine on 31400 of each host now, the config asks for 2 replicas.
    ("lab-fleet-r2-b15", [f"http://127.0.42.1{h}:31400" for h in (1, 2, 3)],
     "serving.replicas 2 behind the fleet router http://127.0.42.14:31400 (on lab4), which fronts 1 engine(s) on each "
     "GPU host now"),
    # lab3 has 3 replicas (someone ran the per-host role there): named alone.
    ("lab-fleet-r2-b15", R2 + ["http://127.0.42.13:31405"], "which fronts 3 engine(s) on lab3 now"),
])
def test_a_change_of_the_replica_count_behind_the_fleet_router_is_refused(tmp_path, config, workers, want):
    if config == "lab-fleet-r1-b15":   # the r2 config with one replica on the same port
        text = (LAB / "lab-fleet-r2-b15.yml").read_text()
        data = yaml.safe_load(text)
        data["serving"]["replicas"] = 1
        data["serving"]["gpus"] = data["serving"]["gpus"][:len(data["serving"]["gpus"]) // 2]
        data["serving"]["router"] = True
        (tmp_path / f"{config}.yml").write_text(yaml.safe_dump(data))
        cfg = spec.load(str(tmp_path / f"{config}.yml"))
    else:
        cfg = _cfg(config)
    plan = fleet.plan(cfg, LAB_ENGINES, LAB_ROUTER, "1")
    from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_router_api import parse_router_unit
    got = fleet.replica_count_change(plan, {"lab4": parse_router_unit(_installed(workers))["workers"]})
    assert want in got
    assert "\n" not in got


def test_the_same_replica_count_or_a_first_deploy_passes():
    plan = fleet.plan(_cfg("lab-fleet-r2-b15"), LAB_ENGINES, LAB_ROUTER, "1")
    from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_router_api import parse_router_unit
    assert fleet.replica_count_change(plan, {"lab4": parse_router_unit(_installed(R2))["workers"]}) == ""
    assert fleet.replica_count_change(plan, {}) == ""   # no installed fleet router: a first deploy
    one = fleet.plan(_cfg("lab-fleet-b15"), LAB_ENGINES, LAB_ROUTER, "1")
    same = [f"http://127.0.42.1{h}:31300" for h in (1, 2, 3)]
    assert fleet.replica_count_change(one, {"lab4": parse_router_unit(_installed(same, 31300))["workers"]}) == ""
