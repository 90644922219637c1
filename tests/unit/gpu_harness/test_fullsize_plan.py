"""The full-size step-cost run's models and plan (tests/gpu/fullsize): the Qwen3.6-27B shape, the drafter's
shape, the servers' flags (the configs' rendered ones plus the run's), the memory each is predicted to need
(sgdeploy.budget's forking buffers), and the waves they run in."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[2] / "gpu"
sys.path.insert(0, str(HERE / "fullsize"))
sys.path.insert(0, str(HERE / "e2e"))

import full_plan  # noqa: E402
import models  # noqa: E402
import plan as e2e_plan  # noqa: E402
import waves  # noqa: E402

from sgdeploy import budget, render, spec  # noqa: E402

GIB = 1 << 30


def pairs(args):
    out, i = {}, 0
    while i < len(args):
        value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
        out[args[i]] = value
        i += 2 if value is not None else 1
    return out


def test_the_target_has_qwen3_6_27b_shapes_and_agrees_with_budget():
    c = models.target_config()
    assert (c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]) == (5120, 248_320, 64)
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["intermediate_size"]) == (24, 4, 256,
                                                                                                            17_408)
    assert c["layer_types"].count("linear_attention") == 48 and c["layer_types"][3::4] == ["full_attention"] * 16
    shape = budget.QWEN3_6_27B
    gdn_layers = c["layer_types"].count("linear_attention")
    assert shape.recurrent_layers == gdn_layers
    assert (shape.value_heads, shape.key_head_dim, shape.value_head_dim, shape.conv_width) == (
        c["linear_num_value_heads"], c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"])
    assert shape.conv_dim == budget.gdn_conv_dim(c["linear_num_key_heads"], c["linear_num_value_heads"], 128, 128)
    assert 26.5e9 < models.parameter_counts()["target"] < 27.5e9  # a 27B model


def test_the_drafter_has_the_published_drafters_shape():
    d = models.drafter_config()
    assert d["architectures"] == ["DFlashDraftModel"] and d["block_size"] == 16
    assert (d["hidden_size"], d["num_hidden_layers"], d["vocab_size"]) == (5120, 5, 248_320)
    assert d["dflash_config"]["target_layer_ids"] == [1, 16, 31, 46, 61]  # SGLang's rule for 64 layers, 5 drafts
    assert 0 <= d["dflash_config"]["mask_token_id"] < d["vocab_size"]
    assert models.target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # the same rule for a 36-layer target


def test_models_writes_configs_without_weights(tmp_path):
    info = models.make(tmp_path)
    assert json.loads((tmp_path / "target" / "config.json").read_text()) == models.target_config()
    assert json.loads((tmp_path / "drafter" / "config.json").read_text()) == models.drafter_config()
    assert not list(tmp_path.rglob("*.safetensors"))
    assert info["target_params"] == models.parameter_counts()["target"]


@pytest.fixture(scope="module")
def built():
    return full_plan.build()


def test_every_server_carries_its_configs_rendered_flags(built):
    replaced = {"--model-path", "--speculative-draft-model-path", "--port", "--nccl-port", "--mem-fraction-static",
                "--max-running-requests", "--speculative-ddtree-budget", "--speculative-ddtree-topk-cap",
                "--speculative-ddtree-state-forking", "--speculative-ddtree-topk"}
    for e in built["servers"]:
        deployed = pairs(render.launch_args(spec.load(e["config"]), render.HostSettings(release_label="x")))
        mine = pairs(e["args"])
        for flag, value in deployed.items():
            assert flag in mine, (e["name"], flag)
            if flag not in replaced:
                assert mine[flag] == value, (e["name"], flag)
        for flag in full_plan.FULL_ARGS[::2]:
            if flag.startswith("--"):
                assert flag in mine, (e["name"], flag)
        assert mine["--load-format"] == "dummy" and "--skip-tokenizer-init" in mine
        assert mine["--model-path"] == f"{full_plan.MODELS}/target"
        assert e["env"]["SGLANG_RECORD_STEP_TIME"] == "1"
        assert ("--speculative-draft-load-format" in mine) == (e["algorithm"] != "NONE")


def test_the_grid_is_the_issues(built):
    s = {e["name"]: pairs(e["args"]) for e in built["servers"]}
    assert list(s)[:4] == ["ar", "dflash-b16", "ddtree-b15", "ddtree-b64"]  # most important first
    assert "--speculative-algorithm" not in s["ar"]
    assert s["dflash-b16"]["--speculative-algorithm"] == "DFLASH"
    assert s["dflash-b16"]["--speculative-dflash-block-size"] == "16"
    for name, b in (("ddtree-b15", "15"), ("ddtree-b32", "32"), ("ddtree-b64", "64")):
        assert s[name]["--speculative-ddtree-budget"] == b
        assert (s[name]["--speculative-ddtree-state-forking"], s[name]["--speculative-ddtree-topk"]) == ("on", "fused")
    assert s["ddtree-b64-nofork"]["--speculative-ddtree-state-forking"] == "off"
    assert s["ddtree-b64-torchtopk"]["--speculative-ddtree-topk"] == "torch"
    upstream_conv = {"ddtree-b64-upstreamconv": "64", "ddtree-b15-upstreamconv": "15"}
    for name, b in upstream_conv.items():
        assert s[name]["--speculative-ddtree-tree-conv"] == "upstream"
        assert s[name]["--speculative-ddtree-budget"] == b
        assert (s[name]["--speculative-ddtree-state-forking"], s[name]["--speculative-ddtree-topk"]) == ("on", "fused")
    assert all("--speculative-ddtree-tree-conv" not in a for n, a in s.items() if n not in upstream_conv)
    assert "--disable-cuda-graph" not in {f for a in s.values() for f in a}
    assert all(a["--cuda-graph-max-bs-decode"] == "8" for a in s.values())


def test_every_release_is_one_the_e2e_bundle_carries(built):
    assert set(built["wheels"]) <= set(e2e_plan.all_wheels())
    ports = [p for e in built["servers"] for p in (e["port"], e["port"] + 1)]
    assert len(ports) == len(set(ports))
    assert not set(ports) & {p for n in e2e_plan.SETS for e in e2e_plan.build(n)["servers"] for p in (e["port"],)}


def test_memory_prediction_uses_the_budget_rule(built):
    s = {e["name"]: e for e in built["servers"]}
    b15 = s["ddtree-b15"]
    assert b15["predicted_bytes"]["spec_buffers"] == budget.forking_buffer_bytes(budget.QWEN3_6_27B, 15, 8)
    assert s["ar"]["predicted_bytes"]["spec_buffers"] == 0
    assert s["dflash-b16"]["verify_positions"] == 16 and s["ddtree-b64"]["verify_positions"] == 65
    # budget 64 at 8 requests needs 83.9 GiB of buffers on top of 53 GiB of weights: not on one H200
    assert budget.forking_buffer_bytes(budget.QWEN3_6_27B, 64, 8) / GIB == pytest.approx(83.87, abs=0.01)
    assert full_plan.predict_bytes("DDTREE", 64, 8)["total"] > (full_plan.GPU_GIB - full_plan.GPU_RESERVE_GIB) * GIB
    assert s["ddtree-b64"]["max_running"] == 6 and s["ddtree-b64"]["batches"] == [1, 6]
    assert s["ddtree-b15"]["batches"] == [1, 6, 8] and s["ar"]["max_running"] == 8
    for e in built["servers"]:
        assert e["predicted_bytes"]["total"] <= (full_plan.GPU_GIB - full_plan.GPU_RESERVE_GIB) * GIB


def test_a_server_that_fits_no_gpu_is_refused_by_name():
    with pytest.raises(SystemExit, match="ddtree-b64: does not fit one GPU of 60"):
        full_plan.server_entry(full_plan.SERVERS[3], 3, gpu_gib=60)


def test_waves_keep_the_order_and_the_memory(built):
    servers = built["servers"]
    one = waves.waves(servers, 1, full_plan.GPU_GIB * GIB)
    assert [[e["name"] for e, _ in w] for w in one] == [[e["name"]] for e in servers]  # one H200: one at a time
    four = waves.waves(servers, 4, full_plan.GPU_GIB * GIB)
    assert [[(e["name"], g) for e, g in w] for w in four][0] == [("ar", 0), ("dflash-b16", 1), ("ddtree-b15", 2),
                                                                   ("ddtree-b64", 3)]
    assert sum(len(w) for w in four) == len(servers)
    small = [{"name": n, "predicted_bytes": {"total": 30 * GIB}} for n in "abc"]
    assert [[(e["name"], g) for e, g in w] for w in waves.waves(small, 1, 70 * GIB)] == [[("a", 0), ("b", 0)],
                                                                                        [("c", 0)]]
    with pytest.raises(ValueError, match="server a: predicted 30.0 GiB does not fit a GPU of 20.0 GiB"):
        waves.waves(small, 1, 20 * GIB)


def test_the_scheduled_server_renders_its_schedule_and_its_graphs_switch(built):
    s = {e["name"]: e for e in built["servers"]}
    sched = s["ddtree-sched"]
    a = pairs(sched["args"])
    assert a["--speculative-ddtree-budget-schedule"] == "1:32,6:15"
    assert a["--speculative-ddtree-budget"] == "32"  # the schedule's largest (the server refuses another)
    assert a["--speculative-ddtree-topk-cap"] == "8"
    assert (a["--speculative-ddtree-state-forking"], a["--speculative-ddtree-topk"]) == ("on", "fused")
    assert a["--max-running-requests"] == "8" and a["--cuda-graph-bs-decode"] == "1"
    assert "--disable-cuda-graph" not in a
    assert sched["env"] == {"SGLANG_RECORD_STEP_TIME": "1", "SGLANG_DDTREE_SCHEDULE_GRAPHS": "1"}
    assert sched["budget_schedule"] == [[1, 32], [6, 15]] and sched["batches"] == [1, 6, 8]
    assert sched["wheel"] == "ddtree-fork-topk" and sched["config"] == "ddtree-b32"
    # the fixed servers it is compared with carry no schedule and no graphs switch
    for fixed in ("ddtree-b15", "ddtree-b32"):
        assert "--speculative-ddtree-budget-schedule" not in pairs(s[fixed]["args"])
        assert "SGLANG_DDTREE_SCHEDULE_GRAPHS" not in s[fixed]["env"] and s[fixed]["budget_schedule"] is None
    names = [e["name"] for e in built["servers"]]
    # run.sh runs plan order: on one H200, ddtree-b15, the schedule, then ddtree-b32 if the deadline allows
    assert names.index("ddtree-b15") < names.index("ddtree-sched") < names.index("ddtree-b32")


def test_the_scheduled_server_is_sized_for_its_largest_budget(built):
    s = {e["name"]: e for e in built["servers"]}
    sched, b32, b15 = s["ddtree-sched"], s["ddtree-b32"], s["ddtree-b15"]
    assert sched["predicted_bytes"] == b32["predicted_bytes"]  # buffers at budget 32 for 8 requests, not at 15
    assert sched["predicted_bytes"]["spec_buffers"] == budget.forking_buffer_bytes(budget.QWEN3_6_27B, 32, 8)
    assert sched["predicted_bytes"]["total"] > b15["predicted_bytes"]["total"]
    assert sched["predicted_bytes"]["total"] / GIB == pytest.approx(105.65, abs=0.01)
    assert sched["max_running"] == 8 and sched["verify_positions"] == 33
    assert sched["predicted_bytes"]["total"] <= (full_plan.GPU_GIB - full_plan.GPU_RESERVE_GIB) * GIB
    assert waves.waves([sched], 1, full_plan.GPU_GIB * GIB) == [[(sched, 0)]]  # one H200 holds it


def test_the_buffers_follow_the_schedules_largest_budget():
    sp = spec.Speculative(algorithm="DDTREE", budget=64, budget_schedule=((1, 64), (8, 15)))
    assert full_plan.sized_budget(sp) == 64
    assert full_plan.sized_budget(spec.Speculative(algorithm="DDTREE", budget=15)) == 15
