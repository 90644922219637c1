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
