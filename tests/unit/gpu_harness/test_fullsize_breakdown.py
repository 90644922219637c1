"""The full-size run's profiler breakdown (tests/gpu/fullsize/breakdown.py) on a small synthetic trace: GPU
kernels reach the part whose range launched them (through the launch's correlation id, a CUDA-graph launch
carrying many kernels), verify kernels split by name, and kernels outside a step are left out; and the
hook (full_hook.py) that opens those ranges inside the server."""

from __future__ import annotations

import contextlib
import gzip
import json
import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu" / "fullsize"))

import breakdown  # noqa: E402
import full_hook  # noqa: E402

STEP = "sgdeploy_e2e::ddtree_decode_step"


def rng(name, ts, dur, tid=1):
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def launch(corr, ts, name="cudaLaunchKernel", tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": 2,
            "args": {"correlation": corr}}


def kernel(corr, name, dur, ts=5000):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}


def step_events(t0: float, scale: float = 1.0) -> list[dict]:
    p = "sgdeploy_full::"
    ev = [rng(STEP, t0, 1000), rng(p + "draft", t0 + 10, 90), rng(p + "topk", t0 + 100, 50),
          rng(p + "tree", t0 + 150, 20), rng(p + "mask", t0 + 170, 10), rng(p + "verify", t0 + 200, 700),
          rng(p + "target_forward", t0 + 210, 590), rng(p + "fork_commit", t0 + 810, 10)]
    c = int(t0) * 100
    kernels = [  # (launch offset, kernel name, duration)
        (20, "nvjet_gemm_draft", 300), (110, "_topk_select_kernel", 40), (155, "_ddtree_build_kernel", 10),
        (175, "_ddtree_mask_kernel", 5), (820, "fused_commit_kernel", 6), (850, "eagle_sample_kernel", 4),
        (950, "assign_next_input", 3),
    ]
    for i, (off, name, dur) in enumerate(kernels):
        ev += [launch(c + i, t0 + off), kernel(c + i, name, dur * scale, ts=t0 + 5000 + off)]
    # one CUDA-graph launch inside the target forward carries three kernels
    ev.append(launch(c + 50, t0 + 300, "cudaGraphLaunch"))
    for name, dur in (("_fwd_kernel_stage1", 100), ("fused_sigmoid_gating_delta_rule_update_kernel", 200),
                      ("sm90_xmma_gemm_bf16", 900)):
        ev.append(kernel(c + 50, name, dur * scale, ts=t0 + 5300))
    return ev


def trace(steps: int = 3) -> dict:
    ev = []
    for i in range(steps):
        ev += step_events(10_000 * i)
    ev += [launch(999_999, 95_000), kernel(999_999, "prefill_gemm", 5000)]  # outside every step
    ev += [launch(888_888, 20, tid=2), kernel(888_888, "other_thread", 50)]  # another thread: not this step
    return {"traceEvents": ev}


def test_every_kernel_reaches_its_part():
    recs = breakdown.attribute(trace(1))
    assert len(recs) == 1
    parts = recs[0]["parts"]
    assert parts["draft"] == 300 and parts["topk"] == 40 and parts["tree_mask"] == 15
    assert parts["verify_attention"] == 100 and parts["verify_gdn"] == 200 and parts["verify_rest"] == 900
    assert parts["commit"] == 10 and parts["fork_commit"] == 6  # commit: fork commit + the sampling kernel
    assert parts["other"] == 3
    assert recs[0]["device_us"] == 300 + 40 + 15 + 100 + 200 + 900 + 10 + 3


def test_summary_takes_medians_and_the_ddtree_only_share():
    s = breakdown.summarise(trace(3))
    assert s["steps"] == 3
    assert s["device_us_median"] == 1568
    assert s["ddtree_only_us_median"] == 40 + 15 + 6
    assert s["ddtree_only_share"] == round(61 / 1568, 4)
    assert s["top_kernels"][0]["name"] == "sm90_xmma_gemm_bf16" and s["top_kernels"][0]["part"] == "verify_rest"
    assert "| verify_gdn | 200.0 |" in breakdown.table("t", s)


def test_without_the_step_range_the_python_stack_event_marks_the_step():
    """The first full-size run's traces had no e2e step range (the hook was shadowed); SGLang's profiler
    records the Python stack, whose forward_decode event then marks the step."""
    ev = [e for e in trace(2)["traceEvents"] if e.get("name") != STEP]
    assert breakdown.summarise({"traceEvents": ev})["steps"] == 0
    for t0 in (0, 10_000):
        ev.append({"ph": "X", "cat": "python_function", "pid": 1, "tid": 1, "ts": t0, "dur": 1000,
                   "name": "sglang/srt/speculative/ddtree_decode.py(169): forward_decode"})
    ev.append({"ph": "X", "cat": "python_function", "pid": 1, "tid": 1, "ts": 95_000, "dur": 10,
               "name": "sglang/srt/speculative/ddtree_decode.py(79): _draft_block_hidden"})  # not a step
    s = breakdown.summarise({"traceEvents": ev})
    assert s["steps"] == 2 and s["device_us_median"] == 1568


def test_a_trace_without_steps_says_so_and_the_cli_reads_gzip(tmp_path, capsys):
    assert breakdown.summarise({"traceEvents": []})["verdict"].startswith("no decode step")
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(trace(2), f)
    assert breakdown.main([str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["t.trace.json.gz"]["steps"] == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert breakdown.main([str(bad)]) == 2
    assert "cannot read the trace" in capsys.readouterr().err


@pytest.mark.parametrize("name,kind", [("fused_recurrent_gated_delta_rule_fwd_kernel", "verify_gdn"),
                                       ("_causal_conv1d_update_kernel", "verify_gdn"),
                                       ("_ddtree_tree_conv_kernel", "verify_gdn"),  # patch 0004
                                       ("_fwd_grouped_kernel_stage1", "verify_attention"),
                                       ("nvjet_tst_128x64", "verify_rest")])
def test_kernel_names_map_to_the_verify_parts(name, kind):
    assert breakdown.kernel_kind(name) == kind


def test_the_hook_opens_a_range_around_each_wrapped_function(monkeypatch):
    seen = []

    @contextlib.contextmanager
    def record_function(name):
        seen.append(name)
        yield

    fake_torch = types.SimpleNamespace(profiler=types.SimpleNamespace(record_function=record_function))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)

    class Info:
        @classmethod
        def from_layout(cls, x):
            return (cls.__name__, x)

    class Worker:
        def forward_batch_generation(self, batch):
            return batch.tag

    mod = types.SimpleNamespace(DDTreeVerifyInput=Info, depth_topk_logprobs=lambda h: h * 2,
                                DFlashWorkerV2=Worker)
    done = full_hook.patch_module(mod, [("DDTreeVerifyInput.from_layout", "mask"), ("depth_topk_logprobs", "topk"),
                                        ("DFlashWorkerV2.forward_batch_generation", "dflash"), ("missing", "x")])
    assert done == ["DDTreeVerifyInput.from_layout", "depth_topk_logprobs", "DFlashWorkerV2.forward_batch_generation"]
    assert mod.depth_topk_logprobs(3) == 6 and Info.from_layout(1) == ("Info", 1)
    decode = types.SimpleNamespace(forward_mode=types.SimpleNamespace(is_extend=lambda: False, is_idle=lambda: False),
                                   tag="d")
    assert Worker().forward_batch_generation(decode) == "d"
    assert seen == ["sgdeploy_full::topk", "sgdeploy_full::mask", "sgdeploy_full::dflash_decode"]
    again = full_hook.patch_module(mod, [("depth_topk_logprobs", "topk")])  # installing twice wraps once
    assert again == ["depth_topk_logprobs"] and mod.depth_topk_logprobs(1) == 2 and seen[-1] == "sgdeploy_full::topk"
    assert seen.count("sgdeploy_full::topk") == 2


def test_both_hooks_reach_a_module_they_both_patch(tmp_path, monkeypatch):
    """As the server's sitecustomize installs them (e2e_hook, then full_hook): importing ddtree_decode gets the
    e2e step range around forward_decode and full_hook's draft range, both."""
    import e2e_hook

    seen = []

    @contextlib.contextmanager
    def record_function(name):
        seen.append(name)
        yield

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(
        profiler=types.SimpleNamespace(record_function=record_function)))
    pkg = tmp_path / "sglang" / "srt" / "speculative"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "sglang", tmp_path / "sglang" / "srt", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "ddtree_decode.py").write_text(
        "def _draft_block_hidden(x):\n    return x + 1\n\n"
        "def forward_decode(x):\n    return _draft_block_hidden(x)\n")
    for name in [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SGDEPLOY_E2E_HOOK", "1")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    e2e_hook.install()
    full_hook.install()
    import importlib

    mod = importlib.import_module("sglang.srt.speculative.ddtree_decode")
    assert mod.forward_decode(1) == 2
    assert seen == ["sgdeploy_e2e::ddtree_decode_step", "sgdeploy_full::draft"]
