"""The end-to-end harness's servers get the flags the project renders for their configs (tests/gpu/e2e/plan.py):
the config's own ExecStart arguments, with only the host paths and the harness's sizing replaced."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu" / "e2e"))

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
        # the tp2 set (issue 25) replaces the config's tensor parallelism too, and nothing else
        replaced = REPLACED | ({"--tp-size"} if set_name == "tp2" else set())
        if set_name in ("budget", "judge", "learned", "quick", "schedule") and "nofork" in entry["name"]:
            replaced |= {"--speculative-ddtree-topk"}  # the field's nofork configs use torch; issue 32 asks fused
        for flag, value in deployed.items():
            assert flag in harness, (entry["name"], flag)
            if flag not in replaced:
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


def test_the_tp2_set_runs_ar_and_ddtree_b15_b64_over_both_gpus():
    """Issue 25 (nvidia-h200-x2): the AR reference and DDTree budgets 15 and 64 (state forking on, fused top-k,
    CUDA graphs and overlap on) each at --tp-size 2 on GPUs 0 and 1, NVLink multicast off."""
    servers = {s["name"]: s for s in plan.build("tp2")["servers"]}
    assert list(servers) == ["ar", "ddtree-b15-k8", "ddtree-b64-k16"]
    graphs = {s["name"]: s for s in plan.build("graphs")["servers"]}
    for name, s in servers.items():
        args = pairs(s["args"])
        assert args["--tp-size"] == "2" and s["tp_size"] == 2, name
        assert s["env"]["CUDA_VISIBLE_DEVICES"] == "0,1" and s["env"]["NCCL_NVLS_ENABLE"] == "0", name
        assert "--enable-nccl-nvls" not in s["args"], name
        assert "--disable-cuda-graph" not in s["args"] and "--disable-overlap-schedule" not in s["args"], name
        # the same server as in the single-GPU graphs set, tensor parallelism and the ports aside
        # (the tp2 set stays on the tiny vocabulary-16 models, graphs runs on the trained pair: plan.TINY_SETS)
        def same(a, skip=("--tp-size", "--port", "--nccl-port", "--model-path", "--speculative-draft-model-path")):
            return {k: v for k, v in a.items() if k not in skip}

        assert same(args) == same(pairs(graphs[name]["args"])), name
        assert pairs(graphs[name]["args"])["--tp-size"] == "1"
        assert s["role"] == "experiment" and "tp2" in s["tags"], name
    assert "--speculative-algorithm" not in servers["ar"]["args"]  # the losslessness reference the runner takes
    for name, budget, cap in (("ddtree-b15-k8", "15", "8"), ("ddtree-b64-k16", "64", "16")):
        args = pairs(servers[name]["args"])
        assert args["--speculative-algorithm"] == "DDTREE" and args["--speculative-ddtree-budget"] == budget
        assert args["--speculative-ddtree-topk-cap"] == cap
        assert args["--speculative-ddtree-state-forking"] == "on" and args["--speculative-ddtree-topk"] == "fused"
        assert servers[name]["wheel"] == "ddtree-fork-topk"


def test_single_gpu_sets_keep_tp1_and_their_env():
    """Only the tp2 set sets tensor parallelism, CUDA_VISIBLE_DEVICES and NCCL_NVLS_ENABLE: the other sets'
    servers are what they were (one GPU, the config's env, plus a server's own switch: the schedule set's
    one-graph server)."""
    for name in set(plan.SETS) - {"tp2"}:
        for server, s in zip(plan.SETS[name], plan.build(name)["servers"], strict=True):
            assert s["tp_size"] == 1 and pairs(s["args"])["--tp-size"] == "1", (name, s["name"])
            assert s["env"] == {**spec.load(s["config"]).serving.env, **dict(server.env)}, (name, s["name"])
            assert "CUDA_VISIBLE_DEVICES" not in s["env"] and "NCCL_NVLS_ENABLE" not in s["env"]


def test_learned_sets_load_the_trained_pair_and_tiny_sets_keep_the_random_models():
    """Issue 32 item 5: the losslessness sets (graphs, recheck, treeconv) and the budget / judge sets serve the
    trained pair (tests/gpu/learned) with its held-out prompts; the sets named in TINY_SETS keep the tiny models."""
    for name in plan.SETS:
        p = plan.build(name)
        root = plan.MODELS if name in plan.TINY_SETS else plan.LEARNED
        assert p["models"] == root and p["learned"] == (root == plan.LEARNED), name
        assert p["prompts"] == (f"{plan.LEARNED}/prompts.json" if p["learned"] else None), name
        for s in p["servers"]:
            assert pairs(s["args"])["--model-path"] == f"{root}/target", (name, s["name"])
    assert {"graphs", "recheck", "treeconv", "budget", "judge"}.isdisjoint(plan.TINY_SETS)


def test_the_budget_set_covers_every_budget_cap_and_forking_off():
    """Issue 32 item 2: AR, DFLASH 16, DDTREE 8 / 15 / 32 / 64 at caps 4 / 8 / 16 (a cap at most the budget) with
    forking on, and forking off at cap 8 for every budget (and 64 / 16), CUDA graphs and overlap on, fused top-k."""
    servers = {s["name"]: s for s in plan.build("budget")["servers"]}
    trees = [s for s in servers.values() if s["algorithm"] == "DDTREE"]
    on = {(s["budget"], s["topk_cap"]) for s in trees if s["state_forking"]}
    off = {(s["budget"], s["topk_cap"]) for s in trees if not s["state_forking"]}
    assert on == {(8, 4), (8, 8), (15, 4), (15, 8), (32, 4), (32, 8), (32, 16), (64, 4), (64, 8), (64, 16)}
    assert off == {(8, 8), (15, 8), (32, 8), (64, 8), (64, 16)}
    assert {s["algorithm"] for s in servers.values()} == {"NONE", "DFLASH", "DDTREE"}
    for s in servers.values():
        args = pairs(s["args"])
        assert "--disable-cuda-graph" not in s["args"] and "--disable-overlap-schedule" not in s["args"], s["name"]
        if s["algorithm"] == "DDTREE":
            assert args["--speculative-ddtree-budget"] == str(s["budget"]), s["name"]
            assert args["--speculative-ddtree-topk-cap"] == str(s["topk_cap"]), s["name"]
            assert args.get("--speculative-ddtree-topk") == "fused", s["name"]
            assert args["--speculative-ddtree-state-forking"] == ("on" if s["state_forking"] else "off"), s["name"]


def test_the_schedule_servers_say_whether_their_per_width_graphs_are_on():
    """Patch 0005's per-width verify graphs are on by default since the H200 run of 2026-12-05: the one-graph
    server must switch them off explicitly, or it would measure the same thing as its neighbour."""
    for name in ("schedule", "derive"):
        env = {s["name"]: s["env"].get("SGLANG_DDTREE_SCHEDULE_GRAPHS") for s in plan.build(name)["servers"]
               if "--speculative-ddtree-budget-schedule" in s["args"]}
        if name == "schedule":  # set "derive" has no one-graph server (dropped after the graphs were proven)
            assert env.pop("sched-k8-onegraph") == "0", name
        assert env and set(env.values()) == {"1"}, (name, env)
