"""Issue 34 item 4, "Nothing is replaced silently": the conflict plan of a deploy and of a rollback
(module_utils/sglang_deploy_conflicts.py). Another config that the deploy would stop or displace is
refused with one line naming it and what collides, unless REPLACES names it; taking exactly its place
(a switch between configs) needs no name; a rollback collides with anything but the config it rolls back."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "collections"))

from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_conflicts import (  # noqa: E402
    ConflictError,
    conflicts,
    parse_replaces,
)


def cfg(name, port=30000, gpus=(0,), active=True, enabled=True, bind="127.0.0.1"):
    return {"config": name, "unit_name": f"sglang-{name}.service", "bind_address": bind, "ports": [port, port + 1],
            "gpus": list(gpus), "active": active, "enabled": enabled}


B15 = cfg("ddtree-b15")


def test_a_port_on_the_others_nccl_port_is_refused_naming_it():
    with pytest.raises(ConflictError) as exc:
        conflicts(cfg("mine", port=30001, gpus=(1,)), [B15])
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith("deploying mine would stop or displace ddtree-b15 (active, sglang-ddtree-b15.service: "
                          "its port 30001 is ddtree-b15's NCCL port)"), msg
    assert "REPLACES=ddtree-b15" in msg


def test_the_nccl_port_on_the_others_port_and_a_shared_gpu_are_named():
    with pytest.raises(ConflictError, match=r"its NCCL port 30000 is ddtree-b15's port"):
        conflicts(cfg("mine", port=29999, gpus=(1,)), [B15])
    with pytest.raises(ConflictError, match=r"GPU 1 overlaps \(it uses GPUs \[1, 2\], two uses \[0, 1\]\)"):
        conflicts(cfg("mine", port=31000, gpus=(1, 2)), [cfg("two", port=32000, gpus=(0, 1))])
    with pytest.raises(ConflictError, match=r"enabled, not running"):
        conflicts(cfg("mine", port=30001, gpus=(1,)), [cfg("ddtree-b15", active=False)])


def test_replaces_names_it_and_the_line_says_so():
    out = conflicts(cfg("mine", port=30001, gpus=(1,)), [B15], replaces=["ddtree-b15"])
    assert out["named"] == ["ddtree-b15"]
    assert out["line"].startswith("replaces ddtree-b15 (active") and out["line"].endswith("(named by REPLACES)")


@pytest.mark.parametrize("mine", [cfg("ddtree-b32"), cfg("lab-port-31000", port=31000), cfg("tp2", gpus=(0, 1))])
def test_taking_it_over_whole_is_a_config_switch_and_needs_no_name(mine):
    """All of its GPUs, and a shared port only in the same role: PLAN and the summary name it as before."""
    out = conflicts(mine, [B15])
    assert [d["config"] for d in out["displaced"]] == ["ddtree-b15"] and out["named"] == [] and out["line"] == ""


@pytest.mark.parametrize("mine, words", [
    (cfg("mine", port=30000, gpus=(1,)), "both serve on port 30000"),  # a config on other GPUs, for its port
    (cfg("mine", port=31000, gpus=(1,)), None),  # nothing shared
    (cfg("mine", port=30001, gpus=(0,)), "its port 30001 is ddtree-b15's NCCL port"),  # its GPU, ports cross-wired
])
def test_part_of_it_or_its_ports_crosswise_is_refused(mine, words):
    others = [B15, cfg("two-gpus", port=32000, gpus=(2, 3))]
    if words is None:
        with pytest.raises(ConflictError, match=r"would stop or displace two-gpus .*GPU 2 overlaps"):
            conflicts(cfg("mine", port=31000, gpus=(1, 2)), others)
        return
    with pytest.raises(ConflictError, match=re.escape(words)):
        conflicts(mine, others)


def test_itself_other_addresses_and_stopped_disabled_configs_do_not_collide():
    assert conflicts(cfg("ddtree-b15", port=30001), [B15])["displaced"] == []
    assert conflicts(cfg("mine", port=30001, gpus=(1,), bind="127.0.0.2"), [B15])["displaced"] == []
    assert conflicts(cfg("mine", port=30001), [cfg("ddtree-b15", active=False, enabled=False)])["displaced"] == []


def test_a_rollback_collides_even_in_the_same_place_and_replaces_cannot_stop_it():
    previous = cfg("conf-a", gpus=(1,), port=30100)
    with pytest.raises(ConflictError, match=r"^rolling back conf-a to its previous deploy \(conf-a\) would collide "
                                            r"with conf-b .*GPU 1 overlaps"):
        conflicts(previous, [cfg("conf-a", gpus=(2,), port=30100), cfg("conf-b", gpus=(1,), port=30200)],
                  rollback="conf-a")
    with pytest.raises(ConflictError, match=r"a rollback stops only conf-a"):
        conflicts(previous, [cfg("conf-b", gpus=(1,), port=30200)], replaces=["conf-b"], rollback="conf-a")
    # ddtree-b32 replaced ddtree-b15: its previous is ddtree-b15's deploy; rolling back stops ddtree-b32.
    assert conflicts(cfg("ddtree-b15"), [cfg("ddtree-b32")], rollback="ddtree-b32")["displaced"] == []


@pytest.mark.parametrize("value, names", [("", []), (None, []), ("a,b", ["a", "b"]), (" a , ", ["a"]), (["x"], ["x"])])
def test_replaces_parses(value, names):
    assert parse_replaces(value) == names


def test_a_bad_replaces_name_is_one_line():
    with pytest.raises(ConflictError, match=r"^replaces 'A;rm' is not allowed: use config names"):
        parse_replaces("ok,A;rm")


# Issue 37 deliver 2 (docs/multinode.md): a rank of an engine over several hosts stops only with its other ranks, rank 0
# first, in one batch. A deploy on some hosts of the engine only is refused before any change, in one line.
def rank(n, config="two-host", hosts=("lab1", "lab2"), gpus=(6,), port=32000):
    return {**cfg(config, port=port, gpus=gpus), "nnodes": len(hosts), "node_rank": n, "engine_hosts": list(hosts)}


ONE_HOST = cfg("one-host", port=32010, gpus=(6,))  # takes the rank's GPU over whole: no name needed


@pytest.mark.parametrize("replaces", [[], ["two-host"]])
def test_a_rank_above_0_whose_rank_0_is_not_in_the_run_is_refused_naming_the_engine(replaces):
    with pytest.raises(ConflictError) as exc:
        conflicts(ONE_HOST, [rank(1)], replaces, host="lab2", batch=["lab2"], run=["lab2"])
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith("deploying one-host would stop two-host (active, sglang-two-host.service: GPU 6 overlaps "
                          "(it uses GPUs [6], two-host uses [6])) here, rank 1 of an engine over hosts lab1,lab2 whose "
                          "other host lab1 is not in the run; its ranks stop only together, rank 0 first"), msg
    assert msg.endswith("include every host of the engine in the run, in one batch (e.g. LIMIT=lab1,lab2 SERIAL=2 "
                        "REPLACES=two-host), or roll the engine off first (systemctl disable --now "
                        "sglang-two-host.service on lab1, then on lab2)"), msg


def test_a_rank_0_whose_other_ranks_are_not_in_the_run_is_refused_too():
    hosts = ("lab1", "lab2", "lab3")
    with pytest.raises(ConflictError, match=r"here, rank 0 of an engine over hosts lab1,lab2,lab3 whose other hosts "
                                            r"lab2,lab3 are not in the run; .*rank 0 stopped alone ends the engine"):
        conflicts(ONE_HOST, [rank(0, hosts=hosts)], ["two-host"], host="lab1", batch=["lab1"], run=["lab1"])


def test_an_engine_split_over_batches_is_refused_and_its_own_config_on_one_host_alone_too():
    with pytest.raises(ConflictError, match=r"whose other host lab1 does not deploy in this batch \(SERIAL splits"):
        conflicts(ONE_HOST, [rank(1)], ["two-host"], host="lab2", batch=["lab2"], run=["lab1", "lab2"])
    # The same config name on one host only, over a rank of that config's engine (no REPLACES in the hint).
    with pytest.raises(ConflictError, match=r"would stop two-host \(active, sglang-two-host.service: its own deploy "
                                            r"there\) here, rank 1 .* \(e.g. LIMIT=lab1,lab2 SERIAL=2\), or roll"):
        conflicts(cfg("two-host", port=32010, gpus=(6,)), [rank(1)], host="lab2", batch=["lab2"], run=["lab2"])


def test_every_host_of_the_engine_in_the_batch_stops_it_as_before_and_says_which_engine():
    out = conflicts(ONE_HOST, [rank(1)], ["two-host"], host="lab2", batch=["lab1", "lab2"], run=["lab1", "lab2"])
    assert out["named"] == ["two-host"] and [d["config"] for d in out["displaced"]] == ["two-host"]
    assert out["engines"] == [{"config": "two-host", "unit_name": "sglang-two-host.service", "node_rank": 1,
                               "engine_hosts": ["lab1", "lab2"]}]
    # The engine's own config again over the same hosts (a switch of every rank): not refused here.
    assert conflicts(rank(0), [rank(0)], host="lab1", batch=["lab1", "lab2"])["engines"][0]["node_rank"] == 0
    # A one-host config elsewhere, a stopped and disabled rank, and no batch (a rollback, replicas) find no engine.
    assert conflicts(cfg("other", port=31000, gpus=(1,)), [rank(1)], host="lab2", batch=["lab2"])["engines"] == []
    assert conflicts(ONE_HOST, [{**rank(1), "active": False, "enabled": False}], host="lab2",
                     batch=["lab2"])["engines"] == []
    assert conflicts(ONE_HOST, [rank(1)])["engines"] == []
