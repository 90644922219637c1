"""DDTree acceptance on the GPU: ``ddtree_accept`` (patch 0001) on real DDTree layouts.

- greedy: the torch walk and the wheel's Triton ``verify_tree_greedy_kernel_triton`` (the
  same contract as the CUDA ``verify_tree_greedy`` the EAGLE path calls) against the plain
  Python reference walk, exact equality, on trees from ``build_ddtree`` (batch 1-64,
  budget 1-64, depth 1-15, cap 1-8, a different tree per request);
- sampled: the torch walk equals the float64 reference walk given the same coins, and the
  emitted tokens follow the target distribution (chi-square, z = 5 limit, 2 M samples per
  case) while a wrong acceptance rule is rejected by the same test.

Modules: ``ddtree_tree``/``ddtree_accept`` from the repository (``patches/sglang/src``,
``sglang_loader.ROOTS``); the Triton greedy kernel from the unpacked wheel's
``sglang/kernels/ops/speculative/spec_tree.py`` (``sglang_loader.UPSTREAM_ROOT``; only the
kernel function is taken, its module imports the SGLang runtime).

    python tests/gpu/test_ddtree_verify.py      # writes a JSON summary to $OUT if set
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO / "tests" / "unit" / "series"))

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (the CPU part is tests/unit/series/test_ddtree_accept.py)", allow_module_level=True)

import test_ddtree_accept as cpu  # noqa: E402
from sglang_loader import ROOTS, UPSTREAM_ROOT, load_module  # noqa: E402

DEV = "cuda"


def modules():
    tree = load_module(ROOTS, "sglang.srt.speculative.ddtree_tree")
    acc = load_module(ROOTS, "sglang.srt.speculative.ddtree_accept")
    return tree, acc


def triton_greedy_kernel():
    src_path = UPSTREAM_ROOT / "sglang" / "kernels" / "ops" / "speculative" / "spec_tree.py"
    src = src_path.read_text()
    node = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "verify_tree_greedy_kernel_triton")
    text = "import triton\nimport triton.language as tl\n\n" + ast.get_source_segment(src, node, padded=False)
    # the decorator lines precede the def
    deco = "\n".join("@" + ast.get_source_segment(src, d) for d in node.decorator_list)
    body = ast.get_source_segment(src, node)
    text = "import triton\nimport triton.language as tl\n\n" + deco + "\n" + body + "\n"
    tmp = Path(tempfile.mkdtemp()) / "ddtree_greedy_kernel.py"
    tmp.write_text(text)
    spec = importlib.util.spec_from_file_location("ddtree_greedy_kernel", tmp)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.verify_tree_greedy_kernel_triton


def random_layout(tree_mod, rng, gen, bs, budget, depth, k):
    lp = torch.sort(torch.rand(bs, depth, k, generator=gen) * -6.0, dim=-1, descending=True).values
    ids = torch.stack([torch.stack([torch.randperm(5000, generator=gen)[:k] for _ in range(depth)]) for _ in range(bs)])
    root_tok = torch.randint(0, 5000, (bs,), generator=gen)
    root_pos = torch.randint(0, 4000, (bs,), generator=gen)
    return tree_mod.build_ddtree(lp.to(DEV), ids.to(DEV), budget, root_tokens=root_tok.to(DEV), root_positions=root_pos.to(DEV))


def run_greedy(cases=300, seed=0):
    tree_mod, acc = modules()
    kernel = triton_greedy_kernel()
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    trees = accepted = 0
    for _ in range(cases):
        bs = rng.choice([1, 2, 3, 7, 16, 33, 64])
        depth = rng.choice([1, 2, 4, 7, 15])
        k = rng.choice([1, 2, 3, 4, 8])
        budget = min(rng.choice([1, 2, 3, 5, 8, 15, 16, 31, 32, 64]), sum(k ** d for d in range(1, depth + 1)))
        lay = random_layout(tree_mod, rng, gen, bs, budget, depth, k)
        cand = lay.verify_tokens.cpu()
        parent = lay.retrieve_parent_token.cpu()
        steps = depth + 1
        target = cpu.greedy_targets(rng, parent, cand, 5000)
        want = cpu.ref_greedy(parent.tolist(), cand.tolist(), target.tolist(), steps)
        got = acc.greedy_accept(lay.verify_tokens, lay.retrieve_parent_token, target.to(DEV), steps)
        assert [x.cpu().tolist() for x in got] == list(want), (bs, budget, depth, k)
        # the wheel's Triton greedy verify on the same layout (EAGLE contract, topk = -1)
        t = budget + 1
        predict = torch.zeros(bs * t, dtype=torch.int32, device=DEV)
        accept_index = torch.full((bs, steps), -1, dtype=torch.int32, device=DEV)
        ntok = torch.zeros(bs, dtype=torch.int32, device=DEV)
        retrieve_index = torch.arange(bs * t, device=DEV, dtype=torch.int64).view(bs, t)
        kernel[(bs,)](
            predict, accept_index, ntok, lay.verify_tokens.contiguous(), retrieve_index,
            lay.retrieve_next_token.contiguous(), lay.retrieve_next_sibling.contiguous(),
            target.to(DEV).contiguous(), batch_size=bs, num_speculative_tokens=steps, num_draft_tokens=t,
        )
        assert predict.cpu().tolist() == want[0], ("triton predict", bs, budget, depth, k)
        assert accept_index.cpu().tolist() == want[1], ("triton accept_index", bs, budget, depth, k)
        assert ntok.cpu().tolist() == want[2], ("triton accept_num", bs, budget, depth, k)
        trees += bs
        accepted += sum(want[2])
    return {"greedy_cases": cases, "greedy_trees": trees, "greedy_accepted_nodes": accepted}


def run_sampled_exact(cases=100, seed=1):
    tree_mod, acc = modules()
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    for _ in range(cases):
        bs, depth, k = rng.choice([1, 4, 16]), rng.choice([1, 3, 6]), rng.choice([2, 3, 4])
        budget = min(rng.choice([1, 4, 8, 15]), sum(k ** d for d in range(1, depth + 1)))
        # small vocabulary so that the tree's tokens carry real target mass
        vocab = 12
        lp = torch.sort(torch.rand(bs, depth, k, generator=gen) * -3.0, dim=-1, descending=True).values
        ids = torch.stack([torch.stack([torch.randperm(vocab, generator=gen)[:k] for _ in range(depth)]) for _ in range(bs)])
        lay = tree_mod.build_ddtree(lp.to(DEV), ids.to(DEV), budget, root_tokens=torch.zeros(bs, dtype=torch.int64, device=DEV), root_positions=torch.zeros(bs, dtype=torch.int64, device=DEV))
        t = budget + 1
        probs = torch.softmax(torch.randn(bs, t, vocab, generator=gen, dtype=torch.float64) * 2, -1)
        coins = torch.rand(bs, t, generator=gen, dtype=torch.float64)
        cf = torch.rand(bs, generator=gen, dtype=torch.float64)
        cand, parent = lay.verify_tokens.cpu(), lay.retrieve_parent_token.cpu()
        want = cpu.ref_sampled(parent.tolist(), cand.tolist(), probs.tolist(), coins.tolist(), cf.tolist(), depth + 1)
        got = acc.sampled_accept(lay.verify_tokens, lay.retrieve_parent_token, probs.to(DEV), coins.to(DEV), cf.to(DEV), depth + 1)
        assert [x.cpu().tolist() for x in got] == list(want)
    return {"sampled_exact_cases": cases}


def run_sampled_distribution(n=2_000_000):
    _, acc = modules()
    out = {}
    for seed in (3, 4, 5):
        parent, cand, probs, gen = cpu.sampling_case(seed)
        stat, df = cpu.chi_square_first_two(acc, parent, cand, probs, n=n, gen=gen, device=DEV)
        limit = cpu.chi_square_limit(df)
        assert stat < limit, (seed, stat, df, limit)
        bad, bdf = cpu.chi_square_first_two(acc, parent, cand, probs, n=n, gen=gen, device=DEV, walk=cpu.wrong_walk(acc))
        assert bad > cpu.chi_square_limit(bdf), (seed, bad, bdf)
        out[f"seed{seed}"] = {"chi2": round(stat, 1), "df": df, "limit_z5": round(limit, 1), "wrong_rule_chi2": round(bad, 1)}
    return out


def run_timing():
    tree_mod, acc = modules()
    rng, gen = random.Random(9), torch.Generator().manual_seed(9)
    res = {}
    for bs, budget in ((1, 64), (64, 64)):
        lay = random_layout(tree_mod, rng, gen, bs, budget, 15, 8)
        target = torch.randint(0, 5000, (bs, budget + 1), device=DEV)
        args = (lay.verify_tokens, lay.retrieve_parent_token, target, 16)
        for _ in range(3):
            acc.greedy_accept(*args)
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            acc.greedy_accept(*args)
            with torch.cuda.graph(g):
                acc.greedy_accept(*args)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        for name, fn in (("eager", lambda: acc.greedy_accept(*args)), ("graph", g.replay)):
            t0 = time.perf_counter()
            for _ in range(200):
                fn()
            torch.cuda.synchronize()
            res[f"greedy_bs{bs}_budget{budget}_{name}_us"] = round((time.perf_counter() - t0) / 200 * 1e6, 1)
    return res


def test_greedy_on_ddtree_layouts():
    run_greedy(cases=120)


def test_sampled_matches_reference_on_ddtree_layouts():
    run_sampled_exact(cases=60)


def test_sampled_distribution():
    run_sampled_distribution(n=1_000_000)


if __name__ == "__main__":
    summary = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    for fn in (run_greedy, run_sampled_exact, run_sampled_distribution, run_timing):
        t0 = time.time()
        summary[fn.__name__] = fn()
        summary[fn.__name__ + "_s"] = round(time.time() - t0, 1)
        print(json.dumps(summary), flush=True)
    out = os.environ.get("OUT")
    if out:
        Path(out, "ddtree_verify.json").write_text(json.dumps(summary, indent=1))
