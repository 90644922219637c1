"""The TP-2 top-k harness (tests/gpu/test_topk_tp2.py) on the CPU: two gloo ranks, small shapes.

The harness runs in build/cpu-venv (torch 2.13 CPU, the venv of test_patched_cli.py) as two real processes
joined by torch.distributed (gloo), calls the series' ``depth_topk_logprobs`` (the torch path; the fused
kernel needs CUDA) with SGLang's vocab-parallel shard layout and a GroupCoordinator shim, and checks on rank 0
against TP 1 and float64; with ``--interpret`` also the fused kernel's own TP merge under Triton's
interpreter. This checks the merge of the vocabulary shards in ddtree_topk.py and the harness
itself: with a deliberately wrong shim (``--fault``: a shard offset of 0 on every rank, the padding rows counted
as vocabulary, an all_gather that exchanges nothing) the same harness must fail, naming the check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_patched_cli import cpu_python  # noqa: F401  (the build/cpu-venv fixture)

REPO = Path(__file__).resolve().parents[3]
HARNESS = REPO / "tests" / "gpu" / "test_topk_tp2.py"
sys.path.insert(0, str(REPO / "tests" / "gpu"))

pytestmark = pytest.mark.slow


def run(python, out: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    proc = subprocess.run([str(python), str(HARNESS), "--out", str(out), *args], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO)
    res = out / "topk_tp2.json"
    return proc, (json.loads(res.read_text()) if res.is_file() else None)


@pytest.fixture(scope="module")
def good(cpu_python, tmp_path_factory):  # noqa: F811
    return run(cpu_python, tmp_path_factory.mktemp("good"), "--backend", "gloo", "--device", "cpu", "--reps", "3")


def test_two_gloo_ranks_agree_with_tp1_and_float64(good):
    proc, info = good
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert info["backend"] == "gloo" and info["world_size"] == 2 and info["fault"] is None
    assert info["env"]["NCCL_NVLS_ENABLE"] == "0"  # multicast off in the ranks' environment
    ran = [r for r in info["results"] if "skipped" not in r]
    assert [r["case"] for r in ran] == ["small V1001 k8 torch", "small V3000 k16 torch"]
    assert info["passed"] == 2 and info["failed"] == 0
    for r in ran:
        assert r["ok"] and r["fused_kernel"] is False
        assert r["tp1"]["tp1_max_abs_lp_diff"] <= 1e-4 and r["tp1"]["tp1_worst_tie_gap"] <= 1e-4
        assert r["f64"]["f64_tol"] == 1e-4 and r["f64"]["f64_max_abs_lp_err"] <= 1e-4  # float32 head
    # SGLang's layout: V 1001 padded to 1024, 512 rows a rank, rank 1 holds ids 512..1000 and 23 padding rows.
    assert ran[0]["shard_rank0"] == [0, 512] and ran[0]["shard_rank1"] == [512, 489]
    assert ran[1]["shard_rank1"] == [1504, 1496]  # V 3000: 3008 padded
    # the fused path is recorded as not run on the CPU, not as passed
    skipped = [r for r in info["results"] if "skipped" in r]
    assert [r["case"] for r in skipped] == ["small V1001 k8 fused", "small V3000 k16 fused"]


def test_the_timing_says_how_it_was_taken(good):
    _, info = good
    (t,) = info["timings"]
    assert t["case"] == "small V1001 k8 torch" and t["reps"] == 3
    for tp in ("tp1", "tp2"):
        assert t[tp]["eager_us"] > 0 and t[tp]["eager_timer"] == "wall clock (CPU)"
        assert t[tp]["graph_us"] is None and t[tp]["graph_error"] == "no CUDA graphs on the CPU"
    assert "TIME small V1001 k8 torch tp2: eager" in good[0].stdout


@pytest.mark.parametrize("fault,check,message", [
    ("offset", "tp1", "id mismatch that is not a tie"),
    ("padding", "tp1", "log-prob difference"),
    ("local", "tp1", "log-prob difference"),
])  # fmt: skip
def test_a_wrong_shim_fails_the_run(cpu_python, tmp_path, fault, check, message):  # noqa: F811
    """The harness catches a broken merge: every case fails, the TP-1 check named, exit status 1."""
    proc, info = run(cpu_python, tmp_path, "--backend", "gloo", "--device", "cpu", "--no-timing", "--fault", fault)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert info["fault"] == fault and info["passed"] == 0 and info["failed"] == 2
    for r in info["results"]:
        if "skipped" not in r:
            assert not r["ok"] and f"{check}: TP 1: {message}" in r["error"], r["error"]
            assert "tp1_f64" in r  # TP 1 itself (no shim) still meets float64
    assert "FAIL small V1001 k8 torch: tp1: TP 1:" in proc.stdout


def test_cuda_without_two_gpus_is_refused_in_one_line(cpu_python, tmp_path):  # noqa: F811
    proc, info = run(cpu_python, tmp_path)
    assert proc.returncode == 2 and info is None
    assert proc.stderr.strip() == ("test_topk_tp2: --device cuda needs 2 CUDA GPUs, this machine has 0 "
                                   "(for a CPU run: --backend gloo --device cpu)")


# Run in the CPU venv: the harness's shard layout and its TP-1 rule on hand-made rows.
PROBE = r"""
import json, sys, torch
sys.path.insert(0, "tests/gpu")
import test_topk_tp2 as h
lay = {f"{v}/{tp}": [[s.org_vocab_start_index, s.num_org_elements, s.num_elements_padded]
                     for s in (h.shard_indices(v, r, tp) for r in range(tp))]
       for v, tp in ((248320, 2), (1001, 2), (16, 2), (100, 3), (151666, 2))}
lp1, ids1 = torch.tensor([[-1.0, -1.0, -2.0]]), torch.tensor([[5, 7, 9]])
rule = {}
for name, ids in (("reordered tie", [7, 5, 9]), ("k-th tie", [5, 7, 11]), ("not a tie", [5, 9, 7])):
    try:
        h.check_tp1(lp1.clone(), torch.tensor([ids]), lp1, ids1)
        rule[name] = "ok"
    except AssertionError as exc:
        rule[name] = str(exc)
print(json.dumps({"layout": lay, "rule": rule}))
"""


@pytest.fixture(scope="module")
def probe(cpu_python):  # noqa: F811
    proc = subprocess.run([str(cpu_python), "-c", PROBE], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_shard_layout_is_sglangs(probe):
    """SGLang 0.5.23's VocabParallelEmbedding._get_indices for the original vocabulary: padded to 64 (to 64 x tp
    where 64 does not give a multiple of tp), equal padded shards, the real rows first. [start, real rows,
    padded rows] per rank."""
    lay = probe["layout"]
    assert lay["248320/2"] == [[0, 124160, 124160], [124160, 124160, 124160]]  # Qwen3.6: no padding
    assert lay["1001/2"] == [[0, 512, 512], [512, 489, 512]]
    assert lay["151666/2"] == [[0, 75840, 75840], [75840, 75826, 75840]]
    assert lay["100/3"] == [[0, 64, 64], [64, 36, 64], [100, 0, 64]]  # 128 % 3: padded to 192
    # The e2e harness's tiny models (vocabulary 16) at TP 2: rank 1 holds no real row (tests/gpu/e2e/README.md).
    assert lay["16/2"] == [[0, 16, 32], [16, 0, 32]]


def test_tp1_rule_allows_ties_only(probe):
    """A different id passes only where TP 1 gives it the same log-prob (reordered equal values) or it ties TP 1's
    k-th value; any other different id fails, naming the gap."""
    rule = probe["rule"]
    assert rule["reordered tie"] == "ok" and rule["k-th tie"] == "ok"
    assert rule["not a tie"] == "TP 1: id mismatch that is not a tie: gap 1 > 0.0001"



@pytest.mark.parametrize("fault", [None, "local"])
def test_the_fused_kernels_merge_under_the_interpreter(cpu_python, tmp_path, fault):  # noqa: F811
    """--interpret: fused_depth_topk's own TP merge (one packed all_gather along dim 0 through the same shim) under
    Triton's interpreter on two gloo ranks: TP 1 within 1e-4 and float64 within 1e-3; an all_gather that exchanges
    nothing fails it. One case (the interpreter takes about 20 s a rank)."""
    extra = ("--fault", fault) if fault else ()
    proc, info = run(cpu_python, tmp_path, "--backend", "gloo", "--device", "cpu", "--no-timing", "--interpret",
                     "--cases", "small V1001 k8", *extra)
    (r,) = [x for x in info["results"] if x["case"] == "small V1001 k8 fused (Triton interpreter)"]
    if fault is None:
        assert proc.returncode == 0 and info["passed"] == 2, proc.stdout + proc.stderr[-3000:]
        assert r["ok"] and r["dtype"] == "torch.float16" and r["tp1"]["tp1_max_abs_lp_diff"] <= 1e-4
        assert r["f64"]["f64_tol"] == 1e-3 and r["tp1_f64"]["f64_max_abs_lp_err"] <= 1e-3
    else:
        assert proc.returncode == 1 and not r["ok"] and "tp1: TP 1: log-prob difference" in r["error"], r


def test_a_rank_without_vocabulary_merges_like_tp1(cpu_python, tmp_path):  # noqa: F811
    """Vocabulary 16 at TP 2 (the e2e harness's tiny models): rank 0 holds ids 0-15, rank 1 only padding. Before
    ddtree_topk padded a short shard's top-k to k (session 8), rank 1 gathered 0 columns and the gather hung."""
    proc, info = run(cpu_python, tmp_path, "--backend", "gloo", "--device", "cpu", "--no-timing", "--timeout", "10",
                     "--edge", "--cases", "tiny V16 k8 (rank 1 holds no vocabulary)")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert info["passed"] == 1
