"""DDTree GPU tree builder and per-depth top-k, checked against references on random inputs.

Runs on the lent H200; the modules come from the repository (``patches/sglang/src``, see
``sglang_loader.ROOTS``). Without a GPU it runs only under ``TRITON_INTERPRET=1``
(CPU interpreter, slow, fewer cases); otherwise it is skipped.

    python -m pytest tests/gpu/test_ddtree_tree.py      # or: python tests/gpu/test_ddtree_tree.py
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from sglang_loader import ROOTS, load_module  # noqa: E402

from sgdeploy import ddtree_ref  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() and not INTERPRET else "cpu"
if DEVICE == "cpu" and not INTERPRET:
    pytest.skip("needs a CUDA GPU or TRITON_INTERPRET=1", allow_module_level=True)

BUDGETS = (1, 2, 3, 5, 8, 15, 16, 31, 32, 64, 100, 128)
DEPTHS = (1, 2, 5, 15)
CAPS = (1, 2, 3, 4, 8, 16)


def _tree_mod():
    return load_module(ROOTS, "sglang.srt.speculative.ddtree_tree")


def random_case(rng: random.Random, bs: int, depth: int, k: int, ties: bool):
    """[bs][D][K] sorted-descending log-probs (coarse grid when ``ties``) and distinct ids."""
    lps, ids = [], []
    for _ in range(bs):
        req_lp, req_ids = [], []
        for _ in range(depth):
            if ties:
                row = [-0.25 * rng.randint(0, 6) for _ in range(k)]
            else:
                row = [rng.uniform(-8.0, 0.0) for _ in range(k)]
            row.sort(reverse=True)
            req_lp.append(row)
            req_ids.append(rng.sample(range(50_000), k))
        lps.append(req_lp)
        ids.append(req_ids)
    return lps, ids


def check_case(mod, lps, ids, budget: int, rng: random.Random) -> list[str]:
    """Build on the device and compare every output with the reference; return mismatch notes."""
    bs = len(lps)
    lp_t = torch.tensor(lps, dtype=torch.float32, device=DEVICE)
    id_t = torch.tensor(ids, dtype=torch.int64, device=DEVICE)
    root_tok = torch.tensor([rng.randint(0, 50_000) for _ in range(bs)], device=DEVICE)
    root_pos = torch.tensor([rng.randint(0, 4000) for _ in range(bs)], device=DEVICE)
    out = mod.build_ddtree(lp_t, id_t, budget, root_tokens=root_tok, root_positions=root_pos, pad_token_id=7)
    got = {k: v.cpu().tolist() for k, v in vars(out).items()}
    bad = []
    for b, (lp, idv) in enumerate(zip(lps, ids, strict=True)):
        ref = ddtree_ref.build_tree(lp, idv, budget)
        n = len(ref)
        pad = budget - n
        exp = {
            "num_nodes": n,
            "parents": ref.parent + [-1] * pad,
            "depths": ref.depth + [1] * pad,
            "node_tokens": ref.token + [7] * pad,
            "scores": ref.score + [float("-inf")] * pad,
            "retrieve_parent_token": ref.verify_parent() + [0] * pad,
            "retrieve_next_token": ref.next_token() + [-1] * pad,
            "retrieve_next_sibling": ref.next_sibling() + [-1] * pad,
            "verify_tokens": [int(root_tok[b])] + ref.token + [7] * pad,
            "positions": [int(root_pos[b]) + d for d in [0] + ref.depth + [1] * pad],
        }
        mask = ref.ancestor_mask()
        t = budget + 1
        full = [[False] * t for _ in range(t)]
        for i in range(n + 1):
            full[i][: n + 1] = mask[i]
        for i in range(n + 1, t):
            full[i][0] = full[i][i] = True
        exp["tree_mask"] = full
        for key, want in exp.items():
            have = got[key][b]
            if have != want:  # exact: same float32 sums, same tie-break
                bad.append(f"req {b} budget {budget}: {key} differs")
    return bad


def run_correctness(seed: int = 0, cases: int = 400) -> dict:
    mod = _tree_mod()
    rng = random.Random(seed)
    counts = {"cases": 0, "trees": 0, "tie_cases": 0, "exhausted": 0, "mismatches": []}
    t0 = time.perf_counter()
    for c in range(cases):
        budget = rng.choice(BUDGETS)
        depth = rng.choice(DEPTHS)
        k = min(rng.choice(CAPS), budget)
        bs = rng.choice((1, 2, 7, 33, 64)) if not INTERPRET else rng.choice((1, 3))
        ties = c % 2 == 0
        lps, ids = random_case(rng, bs, depth, k, ties)
        counts["mismatches"] += check_case(mod, lps, ids, budget, rng)
        counts["cases"] += 1
        counts["trees"] += bs
        counts["tie_cases"] += int(ties)
        counts["exhausted"] += int(ddtree_ref.max_nodes(depth, k) < budget)
    counts["seconds"] = round(time.perf_counter() - t0, 1)
    return counts


def run_topk(seed: int = 0) -> dict:
    """depth_topk_logprobs against a float64 log_softmax + topk reference (tp_group=None)."""
    mod = load_module(ROOTS, "sglang.srt.speculative.ddtree_topk")
    g = torch.Generator(device="cpu").manual_seed(seed)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    results = []
    for n, hidden, vocab, k in ((15, 512, 32_000, 8), (64 * 15, 1024, 151_936, 16), (3, 256, 1000, 1)):
        h = torch.randn(n, hidden, generator=g).to(DEVICE, dtype)
        head = torch.nn.Linear(hidden, vocab, bias=False).to(DEVICE, dtype)
        torch.nn.init.normal_(head.weight, std=0.05, generator=None)
        lp, ids = mod.depth_topk_logprobs(h, head, k)
        ref_full = torch.log_softmax(h.double() @ head.weight.double().t(), dim=-1)
        ref_lp, _ = torch.topk(ref_full, k, dim=-1)
        got_at_ids = torch.gather(ref_full, 1, ids)
        # bf16 matmul output is rounded to bf16 (8 significant bits): allow two bf16 ulps of the
        # largest logit; float32 inputs: 1e-4.
        max_logit = (h.double() @ head.weight.double().t()).abs().max().item()
        tol = 2 * max_logit * 2.0**-8 + 1e-3 if dtype == torch.bfloat16 else 1e-4
        err_vals = (lp.double() - ref_lp).abs().max().item()
        err_ids = (got_at_ids - ref_lp).abs().max().item()
        sorted_ok = bool((lp[:, :-1] >= lp[:, 1:]).all()) if k > 1 else True
        assert lp.dtype == torch.float32 and ids.dtype == torch.int64
        assert err_vals < tol and err_ids < tol and sorted_ok, (n, hidden, vocab, k, err_vals, err_ids)
        results.append(
            {
                "n": n,
                "hidden": hidden,
                "vocab": vocab,
                "k": k,
                "max_abs_err": err_vals,
                "max_abs_err_at_ids": err_ids,
                "tol": tol,
            }
        )
    return {"topk": results}


def test_tree_matches_reference():
    counts = run_correctness(cases=400 if not INTERPRET else 40)
    assert not counts["mismatches"], counts["mismatches"][:10]
    assert counts["tie_cases"] > 0 and counts["exhausted"] > 0


def test_depth_topk_logprobs():
    run_topk()


if __name__ == "__main__":
    summary = {
        "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (TRITON_INTERPRET)",
        "torch": torch.__version__,
    }
    import triton

    summary["triton"] = triton.__version__
    summary["tree"] = run_correctness(cases=int(os.environ.get("DDTREE_CASES", "400")))
    summary["tree"]["mismatch_count"] = len(summary["tree"]["mismatches"])
    summary["tree"]["mismatches"] = summary["tree"]["mismatches"][:20]
    print(json.dumps(summary["tree"]), flush=True)
    try:
        summary.update(run_topk())
    except AssertionError as e:
        summary["topk_failure"] = str(e)
    text = json.dumps(summary, indent=1)
    print(text)
    out = os.environ.get("OUT")
    if out:
        Path(out, "ddtree_test.json").write_text(text)
    sys.exit(1 if summary["tree"]["mismatch_count"] or "topk_failure" in summary else 0)
