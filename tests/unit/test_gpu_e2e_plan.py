"""The end-to-end harness's servers get the flags the project renders for their configs (tests/gpu/e2e/plan.py):
the config's own ExecStart arguments, with only the host paths and the harness's sizing replaced."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu" / "e2e"))

import plan  # noqa: E402

from sgdeploy import render, spec  # noqa: E402

# Flags the harness sets on purpose (paths on the GPU machine, a port per server, sizing for many servers on
# one GPU, the experiment grid); every other rendered flag must reach the server unchanged.
REPLACED = {"--model-path", "--speculative-draft-model-path", "--port", "--nccl-port", "--mem-fraction-static",
            "--max-running-requests", "--speculative-ddtree-budget", "--speculative-ddtree-topk-cap"}


def pairs(args: list[str]) -> dict[str, str | None]:
    out, i = {}, 0
    while i < len(args):
        flag = args[i]
        value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
        out[flag] = value
        i += 2 if value is not None else 1
    return out


@pytest.mark.parametrize("set_name", sorted(plan.SETS))
def test_every_server_carries_its_configs_rendered_flags(set_name):
    for entry in plan.build(set_name)["servers"]:
        deployed = pairs(render.launch_args(spec.load(entry["config"]), render.HostSettings(release_label="x")))
        harness = pairs(entry["args"])
        for flag, value in deployed.items():
            assert flag in harness, (entry["name"], flag)
            if flag not in REPLACED:
                assert harness[flag] == value, (entry["name"], flag, harness[flag], value)


def test_the_experiment_grid_and_the_device_paths():
    servers = {s["name"]: s for s in plan.build("all")["servers"]}
    b64 = pairs(servers["ddtree-b64-k16"]["args"])
    assert b64["--speculative-ddtree-budget"] == "64" and b64["--speculative-ddtree-topk-cap"] == "16"
    assert b64["--model-path"] == f"{plan.MODELS}/target"
    assert b64["--speculative-draft-model-path"] == f"{plan.MODELS}/drafter"
    assert b64["--max-running-requests"] == str(plan.MAX_RUNNING)
    assert "--speculative-algorithm" not in pairs(servers["ar"]["args"])
    assert pairs(servers["dflash"]["args"])["--speculative-algorithm"] == "DFLASH"


def test_ports_differ_within_a_plan():
    for name in plan.SETS:
        ports = [p for s in plan.build(name)["servers"] for p in (s["port"], s["port"] + 1)]
        assert len(ports) == len(set(ports)), name


def test_experiment_servers_take_token_ids_and_gate_servers_text():
    for s in plan.build("all")["servers"]:
        args = s["args"]
        assert ("--skip-tokenizer-init" in args) == (s["role"] == "experiment"), s["name"]
        for flag in plan.HARNESS_ARGS[::2]:
            assert flag in args, (s["name"], flag)


def test_the_release_of_each_server_follows_its_config_unless_given():
    servers = {s["name"]: s for s in plan.build("all")["servers"]}
    assert servers["ddtree-b64-k16"]["wheel"] == "ddtree-fork-topk"
    assert servers["nofork-b64-k16"]["features"] == list(spec.load("ddtree-b64-nofork").patch_features)
    assert servers["ar"]["wheel"] == "stock" and servers["dflash"]["wheel"] == "stock"
    assert servers["ar-patched"]["wheel"] == "ddtree-fork-topk"  # given explicitly
    assert set(plan.all_wheels()) == {"stock", "ddtree", "ddtree-fork-topk"}


def test_a_variant_adds_its_flags_after_the_rendered_ones():
    s = {x["name"]: x for x in plan.build("final")["servers"]}["ddtree-b64-k16-eager"]
    assert s["args"][-1] == "--disable-cuda-graph" and s["variant"] == ["--disable-cuda-graph"]


def test_an_unknown_set_is_refused_with_the_allowed_names():
    with pytest.raises(SystemExit, match="allowed: core"):
        plan.build("nope")
