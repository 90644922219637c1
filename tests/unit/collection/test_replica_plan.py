"""Issue 34 item 3, "Replica changes are planned whole before anything changes": the rollout's plan
(module_utils/sglang_replica_plan.py) checks every replica's GPUs and ports, the router's port and metrics
port, and finds the surplus replicas of a scale down, before any replica changes. The router's metrics port is
serving.port - 1 whatever the replica count, so a change of the count never moves (restarts) the router; only a
router of the layout before that rule (metrics on serving.port + 1 + 2N) moves, once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "collections"))

from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_replica_plan import (  # noqa: E402
    ReplicaPlanError,
    plan,
    with_live,
)

BIND = "127.0.0.1"


def legacy_metrics(port, n):
    """Where the router's metrics were before they moved below serving.port (serving.port + 1 + 2N)."""
    return port + 1 + 2 * n


def layout(config="ddtree-b15", n=2, port=31500, gpus=None, tp=1):
    gpus = list(range(4, 4 + n * tp)) if gpus is None else gpus
    reps = [{"index": i, "name": f"{config}-r{i}", "unit_name": f"sglang-{config}-r{i}.service",
             "port": port + 1 + 2 * i, "nccl_port": port + 2 + 2 * i, "gpus": gpus[i * tp:(i + 1) * tp],
             "url": f"http://{BIND}:{port + 1 + 2 * i}"} for i in range(n)]
    return {"config": config, "bind_address": BIND, "replicas": reps,
            "router": {"unit_name": f"sglang-router-{port}.service", "port": port, "metrics_port": port - 1,
                       "url": f"http://{BIND}:{port}"}}


def deployed_replicas(config="ddtree-b15", n=2, port=31500, active=True):
    return [{"config": r["name"], "unit_name": r["unit_name"], "bind_address": BIND,
             "ports": [r["port"], r["nccl_port"]], "gpus": r["gpus"], "active": active, "enabled": True}
            for r in layout(config, n, port)["replicas"]]


def router_unit(config="ddtree-b15", n=2, port=31500, metrics=None):
    lay = layout(config, n, port)
    return {"address": BIND, "port": str(port), "metrics_port": str(port - 1 if metrics is None else metrics),
            "workers": [r["url"] for r in lay["replicas"]]}


def sock(port, unit, process="python3", pid=100):
    return {"address": BIND, "port": port, "pids": [pid], "process": process, "unit": unit}


def serving_sockets(config="ddtree-b15", n=2, port=31500, metrics=None):
    router = f"sglang-router-{port}.service"
    out = [sock(port, router, "python"), sock(port - 1 if metrics is None else metrics, router)]
    for r in layout(config, n, port)["replicas"]:
        out += [sock(r["port"], r["unit_name"]), sock(r["nccl_port"], r["unit_name"])]
    return out


def test_a_replica_on_a_gpu_the_host_lacks_is_refused_naming_it_before_replica_0():
    with pytest.raises(ReplicaPlanError) as err:
        plan(layout(gpus=[4, 9]), 8, deployed_replicas(), serving_sockets(), router_unit())
    assert str(err.value) == ("config ddtree-b15: replica 1 (ddtree-b15-r1) would run on GPUs [9]: GPU index 9 does "
                              "not exist on this host (gpu_count 8: indices 0-7); serving.replicas x serving.tp_size "
                              "GPUs from serving.gpus must all exist")


def test_scale_down_retires_the_surplus_replica_and_leaves_the_router_where_it_is():
    p = plan(layout(n=2), 8, deployed_replicas(n=3), serving_sockets(n=3), router_unit(n=3))
    assert [s["name"] for s in p["surplus"]] == ["ddtree-b15-r2"]
    assert p["surplus"][0]["url"] == f"http://{BIND}:31505"
    assert not p["router_moves"] and not p["router_first"]
    assert p["stops"] == ["ddtree-b15-r2"]
    assert "retires ddtree-b15-r2 (http://127.0.0.1:31505)" in p["line"]
    assert "router on port 31500, metrics 31499;" in p["line"] and "moves" not in p["line"]


def test_scale_down_across_configs_retires_the_old_configs_surplus_replica():
    p = plan(layout("ddtree-b32", n=2), 8, deployed_replicas(n=3), serving_sockets(n=3), router_unit(n=3))
    assert [s["name"] for s in p["surplus"]] == ["ddtree-b15-r2"]
    assert [r["replaces"] for r in p["replicas"]] == [["ddtree-b15-r0"], ["ddtree-b15-r1"]]


def test_scale_up_leaves_the_router_where_it_is():
    p = plan(layout(n=3), 8, deployed_replicas(n=2), serving_sockets(n=2), router_unit(n=2))
    assert p["surplus"] == [] and not p["router_moves"] and not p["router_first"]
    assert [r["serving"] for r in p["replicas"]] == [True, True, False]


def test_a_router_of_the_old_layout_moves_its_metrics_port_once_and_says_so():
    # Same count: the old metrics port (31505) is no replica's, so the router moves at the end (one restart).
    legacy = legacy_metrics(31500, 2)
    p = plan(layout(n=2), 8, deployed_replicas(n=2), serving_sockets(n=2, metrics=legacy),
             router_unit(n=2, metrics=legacy))
    assert p["router_moves"] and not p["router_first"]
    assert "router on port 31500, metrics 31499 (moves from 31505: the router restarts once)" in p["line"]
    # A scale up from the old layout: the old metrics port is the new third replica's, so the router moves first.
    p = plan(layout(n=3), 8, deployed_replicas(n=2), serving_sockets(n=2, metrics=legacy),
             router_unit(n=2, metrics=legacy))
    assert p["router_moves"] and p["router_first"]
    assert p["router_workers_first"] == [f"http://{BIND}:31501", f"http://{BIND}:31503"]


def test_a_stray_process_on_the_routers_port_is_refused():
    with pytest.raises(ReplicaPlanError) as err:
        plan(layout(n=2), 8, [], [sock(31500, None, "nc", 4242)], None)
    assert str(err.value).startswith("config ddtree-b15: port 127.0.0.1:31500 (the router's port) is already in use "
                                     "by nc (pid 4242), which this rollout would not stop")


def test_a_stray_process_on_the_metrics_port_is_refused():
    with pytest.raises(ReplicaPlanError) as err:
        plan(layout(n=2), 8, [], [sock(31499, None, "python3", 7)], None)
    assert "port 127.0.0.1:31499 (the router's metrics port) is already in use by python3 (pid 7)" in str(err.value)


def test_a_stray_process_on_a_new_replicas_port_is_refused_before_replica_0():
    with pytest.raises(ReplicaPlanError) as err:
        plan(layout(n=3), 8, deployed_replicas(n=2), serving_sockets(n=2) + [sock(31506, None, "python3", 7)],
             router_unit(n=2))
    assert "port 127.0.0.1:31506 (replica 2's NCCL port) is already in use by python3 (pid 7)" in str(err.value)


def test_another_config_on_a_replicas_gpu_is_refused_unless_named():
    other = {"config": "other", "unit_name": "sglang-other.service", "bind_address": BIND, "ports": [30000, 30001],
             "gpus": [5, 6], "active": True, "enabled": True}
    with pytest.raises(ReplicaPlanError) as err:
        plan(layout(n=2), 8, [other], [], None)
    assert str(err.value).startswith("replica 1: deploying ddtree-b15-r1 would stop or displace other (active")
    p = plan(layout(n=2), 8, [other], [], None, replaces=["other"])
    assert p["stops"] == ["other"]


def test_the_same_layout_again_plans_no_surplus_and_no_move():
    p = plan(layout(n=2), 8, deployed_replicas(n=2), serving_sockets(n=2), router_unit(n=2))
    assert p["surplus"] == [] and not p["router_moves"] and p["stops"] == []
    assert all(r["serving"] for r in p["replicas"])


def test_a_first_deploy_has_no_router_and_free_ports():
    p = plan(layout(n=2), 8, [], [], None)
    assert p["surplus"] == [] and not p["router_moves"] and p["router_workers_first"] == []


def test_a_replica_serves_only_when_the_running_router_lists_it_healthy():
    # The unit lists both, but replica 1's engine was stopped: it is no peer for the canary, and a router that
    # moves first (here one of the old layout) restarts with replica 0 only.
    legacy = legacy_metrics(31500, 2)
    p = plan(layout(n=3), 8, deployed_replicas(n=2), serving_sockets(n=2, metrics=legacy),
             router_unit(n=2, metrics=legacy))
    p = with_live(p, {f"http://{BIND}:31501": {"healthy": True}, f"http://{BIND}:31503": {"healthy": False}})
    assert [r["serving"] for r in p["replicas"]] == [True, False, False]
    assert p["router_workers_first"] == [f"http://{BIND}:31501"]


def test_a_stranger_worker_in_the_running_router_refuses_the_rollout_naming_it():
    # Found (issue 34): a worker added through the router's API stayed through a whole rolling deploy.
    from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_replica_plan import refuse_strangers, strangers

    listing = {f"http://{BIND}:31501": {"id": "a", "healthy": True},
               f"http://{BIND}:31503": {"id": "b", "healthy": True},
               "http://127.0.33.99:9999": {"id": "w-7", "healthy": True}}
    assert strangers(layout(n=2), router_unit(n=2), listing) == [("http://127.0.33.99:9999", "w-7")]
    with pytest.raises(ReplicaPlanError) as err:
        refuse_strangers(layout(n=2), router_unit(n=2), listing, "/etc/sglang/router-31500.env")
    msg = str(err.value)
    assert msg.startswith("config ddtree-b15: router sglang-router-31500.service routes to http://127.0.33.99:9999, "
                          "which neither its unit nor this config names"), msg
    assert "/etc/sglang/router-31500.env" in msg and "http://127.0.0.1:31500/workers/w-7" in msg
    # What the unit or the new layout names is no stranger: a replica of a scale down (the unit) or up (the layout).
    del listing["http://127.0.33.99:9999"]
    listing[f"http://{BIND}:31505"] = {"id": "c", "healthy": True}
    refuse_strangers(layout(n=2), router_unit(n=3), listing, "/etc/sglang/router-31500.env")
    refuse_strangers(layout(n=3), router_unit(n=2), listing, "/etc/sglang/router-31500.env")
