"""The float64 reference and the acceptance rule of the fused per-depth top-k kernel (feature topk),
and the loader that imports the kernel file from where it lives (patches/sglang/src/, or
$FUSED_TOPK_FILE). Needs torch only (no
pytest): tests/gpu/test_fused_topk.py (GPU), tests/gpu/bench_fused_topk.py and the CPU child of
tests/unit/series/test_fused_topk_cpu.py (Triton's interpreter) share it."""

from __future__ import annotations

import importlib.util
import os
import pathlib

import torch

REPO = pathlib.Path(__file__).resolve().parents[2]
REL = "sglang/kernels/ops/speculative/ddtree/fused_depth_topk.py"
KERNEL_FILE = REPO / "patches" / "sglang" / "src" / REL
# The host side that dispatches to it (patch 0001, 0003).
DDTREE_TOPK_FILE = REPO / "patches" / "sglang" / "src" / "sglang/srt/speculative/ddtree_topk.py"

# Tolerances (absolute, in nats).
LP_TOL = 1e-3  # log-probabilities vs float64 (bf16 inputs, fp32 accumulation over H=5120)
TIE_TOL = 1e-4  # two ids count as tied when their float64 log-probs differ by at most this


def load_kernel_module():
    path = os.environ.get("FUSED_TOPK_FILE") or str(KERNEL_FILE)
    spec = importlib.util.spec_from_file_location("fused_depth_topk", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def reference(hidden, w64, k):
    lp = torch.log_softmax(hidden.double() @ w64.T, dim=-1)
    vals, ids = lp.topk(k, dim=-1)
    return vals, ids, lp


def check(lp, ids, hidden, w64, k, v_total):
    """Asserts the kernel's (lp, ids) against float64; returns a summary dict."""
    ref_vals, ref_ids, ref_lp = reference(hidden, w64, k)
    assert lp.shape == (hidden.shape[0], k) and ids.shape == lp.shape
    assert lp.dtype == torch.float32 and ids.dtype == torch.int64
    assert torch.isfinite(lp).all(), "unwritten or non-finite log-probs"
    assert ((ids >= 0) & (ids < v_total)).all(), "id out of range"
    srt = ids.sort(dim=-1).values
    assert (srt[:, 1:] != srt[:, :-1]).all(), "duplicate id in a row"
    err = (lp.double() - ref_vals).abs().max().item()
    # Log-probabilities, rank by rank: |kernel - float64| <= LP_TOL = 1e-3 nats.
    assert err <= LP_TOL, f"log-prob error {err:.3g} > {LP_TOL}"
    # Same ids except exact ties: a different id at rank j must have (float64) the same
    # log-prob as the reference's id at rank j, within TIE_TOL = 1e-4.
    got_ref_lp = ref_lp.gather(1, ids)
    diff = ids != ref_ids
    tie_gap = (got_ref_lp - ref_vals).abs()[diff]
    worst_tie = tie_gap.max().item() if tie_gap.numel() else 0.0
    assert worst_tie <= TIE_TOL, f"id mismatch that is not a tie: gap {worst_tie:.3g}"
    # Descending order.
    assert (lp[:, 1:] <= lp[:, :-1]).all()
    return {"max_abs_lp_err": err, "id_mismatches_tied": int(diff.sum()), "worst_tie_gap": worst_tie}
