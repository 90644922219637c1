"""DDTree layouts through the server's own EAGLE verify kernels (the CUDA JIT ones).

``ddtree_decode`` verifies through ``run_eagle_verify`` -> ``eagle_sample``, which on CUDA
calls ``sglang.kernels.ops.speculative.tree.verify_tree_greedy`` (greedy; reached through
``spec_tree.verify_tree_greedy_func``) and
``sglang.kernels.ops.speculative.sampling.tree_speculative_sampling_target_only``
(sampling, ``draft_probs = zeros``, ``threshold_single = threshold_acc = 1``,
``deterministic=True``). Both are CUDA sources of the pristine 0.5.23 wheel
(``kernels/jit/csrc/speculative/{tree,sampling}.cuh``) that ``load_jit`` compiles with
nvcc at first use and loads through apache-tvm-ffi. This test imports those wheel
modules unmodified (package ``__init__``s are skipped as in ``sglang_loader``; two
helpers of ``sglang.srt.utils.common`` are stubbed) and runs them on trees from the
patched ``build_ddtree``:

- greedy: ``predict``, ``accept_index`` and ``accept_token_num`` exactly equal to the plain
  Python reference walk (``tests/unit/series/test_ddtree_accept.py``) and to ``ddtree_accept``;
- sampled, zero draft probs: given the same coins, equal to the float64 reference walk
  per request (requests whose coin lies within float32 round-off of an interval edge
  are counted as near ties, not compared), on small vocabularies (plain Python
  reference) and real ones (4 099 / 32 002 / 151 936: every ``vec_size`` variant);
- sampled distribution: the kernel's emitted (t1, t2) against the target's joint
  (chi-square, z = 5), and the same test rejecting the kernel run with a non-lossless
  ``threshold_acc = 0.5``.

Inputs (environment): the ``ddtree_*`` modules from the repository (``patches/sglang/src``,
``sglang_loader.ROOTS``), ``SGLANG_PRISTINE_ROOT`` (folder holding the wheel's ``sglang/``;
default ``build/eagle-jit/carry/pristine`` if present, else ``sglang_loader.UPSTREAM_ROOT``,
``build/patchwork/tree``), ``SGLANG_JIT_CACHE_DIR`` (default: a fresh temporary
folder). Needs apache-tvm-ffi, msgspec, nvcc and ninja; sampling also needs flashinfer's
headers (the installed package, else the stand-in ``build/eagle-jit/carry/flashinfer``) and
curand's (the toolkit's, else ``build/eagle-jit/carry/curand`` if present, via CPATH).
docs/results/benchmarks-history.md ("DDTree verify and accept") gives the recipe of that folder.

    python tests/gpu/test_ddtree_eagle_jit.py   # writes $OUT/ddtree_eagle_jit.json if OUT is set
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO / "tests" / "unit" / "series"))

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
    # tvm-ffi would otherwise JIT-build its optional torch DLPack add-on at import.
    os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")
pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi (the JIT loader) is not installed")
pytest.importorskip("msgspec", reason="msgspec (sglang's JIT BuildSpec) is not installed")

import test_ddtree_accept as cpu  # noqa: E402
from sglang_loader import ROOTS, UPSTREAM_ROOT, _ensure_package, load_module  # noqa: E402

CARRY = REPO / "build" / "eagle-jit" / "carry"
_default_pristine = CARRY / "pristine" if (CARRY / "pristine").is_dir() else UPSTREAM_ROOT
PRISTINE = Path(os.environ.get("SGLANG_PRISTINE_ROOT", str(_default_pristine)))
DEV = "cuda"
TREE_TOL = 1e-6  # float32 round-off of a sum of <= 16 sibling probabilities
BONUS_TOL = 1e-6  # float32 block-scan round-off of the bonus CDF (relative to a total <= 1)
ENV: dict = {}


def _cuda_home() -> Path:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        return Path(home)
    nvcc = shutil.which("nvcc")
    return Path(nvcc).resolve().parent.parent if nvcc else Path("/usr/local/cuda")


def _prepare_environment() -> dict:
    """Toolchain pieces the JIT needs; what was found goes into the summary."""
    info: dict = {}
    if not os.environ.get("SGLANG_JIT_CACHE_DIR"):
        os.environ["SGLANG_JIT_CACHE_DIR"] = tempfile.mkdtemp(prefix="sgl-jit-")
    info["jit_cache_dir"] = os.environ["SGLANG_JIT_CACHE_DIR"]
    if shutil.which("ninja") is None and (Path(sys.executable).parent / "ninja").exists():
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    info["ninja"] = shutil.which("ninja")
    if not (os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")) and not list(
        _cuda_home().glob("lib64/libcudart.so*")
    ):
        # load_jit takes the toolkit root from the nvcc on PATH; a wrapper script elsewhere
        # (/usr/local/bin/nvcc) would send the link to a folder without libcudart.
        for home in (Path("/usr/local/cuda"), *sorted(Path("/usr/local").glob("cuda-*"))):
            if (home / "bin" / "nvcc").exists() and list(home.glob("lib64/libcudart.so*")):
                os.environ["CUDA_HOME"] = str(home)
                info["cuda_home_set"] = str(home)
                break
    info["cuda_home"] = str(_cuda_home())
    nvcc = shutil.which("nvcc") or str(_cuda_home() / "bin" / "nvcc")
    try:
        out = subprocess.check_output([nvcc, "--version"], text=True)
        info["nvcc"] = re.search(r"release [\d.]+, V[\d.]+", out).group(0)
    except (OSError, subprocess.SubprocessError, AttributeError) as e:
        info["nvcc"] = f"unavailable: {e}"
    # flashinfer/sampling.cuh includes curand_kernel.h; a pip-installed toolkit may lack it.
    home = _cuda_home()
    have = [p for p in (home / "include", *home.glob("targets/*/include")) if (p / "curand_kernel.h").exists()]
    if have:
        info["curand_headers"] = str(have[0])
    elif (CARRY / "curand" / "curand_kernel.h").exists():
        os.environ["CPATH"] = os.pathsep.join(filter(None, [str(CARRY / "curand"), os.environ.get("CPATH")]))
        info["curand_headers"] = f"CPATH={CARRY / 'curand'} (nvidia-curand cu13 wheel headers)"
    if importlib.util.find_spec("flashinfer") is None and (CARRY / "flashinfer").is_dir():
        sys.path.append(str(CARRY))
        info["flashinfer_headers"] = f"stand-in {CARRY / 'flashinfer'} (flashinfer-python 0.7.2 data/include)"
    else:
        spec = importlib.util.find_spec("flashinfer")
        info["flashinfer_headers"] = str(Path(spec.origin).parent) if spec and spec.origin else None
    import tvm_ffi

    info["tvm_ffi"] = getattr(tvm_ffi, "__version__", "?")
    info["tvm_ffi_disable_torch_c_dlpack"] = os.environ.get("TVM_FFI_DISABLE_TORCH_C_DLPACK", "0")
    return info


def _cuda_version() -> tuple[int, ...]:
    return tuple(int(x) for x in (torch.version.cuda or "0.0").split(".")[:2])


@functools.cache
def ddtree_modules():
    tree = load_module(ROOTS, "sglang.srt.speculative.ddtree_tree")
    acc = load_module(ROOTS, "sglang.srt.speculative.ddtree_accept")
    return tree, acc


@functools.cache
def jit_modules():
    """The wheel's ``ops/speculative/tree.py`` and ``sampling.py``, imported unmodified."""
    ENV.update(_prepare_environment())
    ddtree_modules()  # the patched tree first: its packages get the wheel root's path too
    for name, folder in (("sglang", "sglang"), ("sglang.srt", "sglang/srt"), ("sglang.kernels", "sglang/kernels")):
        _ensure_package(name, PRISTINE / folder)
    # sglang.srt.utils.common imports the whole runtime; the JIT needs two helpers of it.
    if "sglang.srt.utils" not in sys.modules:
        _ensure_package("sglang.srt.utils", PRISTINE / "sglang" / "srt" / "utils")
    common = sys.modules.get("sglang.srt.utils.common")
    if common is None:
        import types

        common = types.ModuleType("sglang.srt.utils.common")
        sys.modules["sglang.srt.utils.common"] = common
        sys.modules["sglang.srt.utils"].common = common
    common.is_cuda = lambda: bool(torch.cuda.is_available() and torch.version.cuda)
    common.get_cuda_version = _cuda_version
    if not hasattr(common, "torch_release"):
        common.torch_release = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:3])
    # KERNEL_PATH is found with importlib.util.find_spec("sglang.kernels.jit"): import that
    # package for real (its __init__ is a docstring) so that it has a spec.
    jit_dir = PRISTINE / "sglang" / "kernels" / "jit"
    if getattr(sys.modules.get("sglang.kernels.jit"), "__spec__", None) is None:
        spec = importlib.util.spec_from_file_location(
            "sglang.kernels.jit", jit_dir / "__init__.py", submodule_search_locations=[str(jit_dir)]
        )
        mod = importlib.util.module_from_spec(spec)
        sys.modules["sglang.kernels.jit"] = mod
        spec.loader.exec_module(mod)
        sys.modules["sglang.kernels"].jit = mod
    tree = load_module(PRISTINE, "sglang.kernels.ops.speculative.tree")
    sampling = load_module(PRISTINE, "sglang.kernels.ops.speculative.sampling")
    ENV["kernel_sources_sha256"] = {
        rel: hashlib.sha256((jit_dir / rel).read_bytes()).hexdigest()[:16]
        for rel in (
            "csrc/speculative/tree.cuh",
            "include/sgl_kernel/speculative/eagle.cuh",
            "csrc/speculative/sampling.cuh",
            "include/sgl_kernel/speculative/sampling.cuh",
        )
    }
    return tree, sampling


@functools.cache
def compiled(vec_sizes=(1, 2, 4)):
    """Build the tree module and every sampling variant at once (the wheel's parallel_compile)."""
    tree, sampling = jit_modules()
    from sglang.kernels.jit.utils import get_jit_cuda_arch, parallel_compile

    t0 = time.time()
    builders = [tree._jit_tree_module] + [functools.partial(sampling._jit_sampling_module, v, True) for v in vec_sizes]
    mods = parallel_compile(builders)
    ENV["jit_build_s"] = round(time.time() - t0, 1)
    ENV["jit_arch"] = get_jit_cuda_arch().target_name
    ENV["jit_modules"] = sorted(
        str(p.relative_to(os.environ["SGLANG_JIT_CACHE_DIR"]))
        for p in Path(os.environ["SGLANG_JIT_CACHE_DIR"]).rglob("*.so")
    )
    return mods


# ---------------------------------------------------------------- kernel calls, as eagle_sample makes them


def cuda_greedy(tree_ops, candidates, next_token, next_sibling, target_predict, steps):
    bs, t = candidates.shape
    predict = torch.zeros(bs * t, dtype=torch.int32, device=DEV)
    accept_index = torch.full((bs, steps), -1, dtype=torch.int32, device=DEV)
    num_correct = torch.empty((bs,), dtype=torch.int32, device=DEV)
    retrieve_index = torch.arange(bs * t, device=DEV, dtype=torch.int64).view(bs, t)  # DDTreeVerifyInput.from_layout
    tree_ops.verify_tree_greedy(
        predicts=predict,
        accept_index=accept_index,
        accept_token_num=num_correct,
        candidates=candidates,
        retrive_index=retrieve_index,
        retrive_next_token=next_token,
        retrive_next_sibling=next_sibling,
        target_predict=target_predict,
    )
    return predict, accept_index, num_correct


def cuda_sampled(
    sampling_ops, candidates, next_token, next_sibling, probs, coins, coins_final, steps, threshold_acc=1.0
):
    bs, t = candidates.shape
    predict = torch.zeros(bs * t, dtype=torch.int32, device=DEV)
    accept_index = torch.full((bs, steps), -1, dtype=torch.int32, device=DEV)
    num_correct = torch.empty((bs,), dtype=torch.int32, device=DEV)
    retrieve_index = torch.arange(bs * t, device=DEV, dtype=torch.int64).view(bs, t)
    sampling_ops.tree_speculative_sampling_target_only(
        predicts=predict,
        accept_index=accept_index,
        accept_token_num=num_correct,
        candidates=candidates,
        retrive_index=retrieve_index,
        retrive_next_token=next_token,
        retrive_next_sibling=next_sibling,
        uniform_samples=coins,
        uniform_samples_for_final_sampling=coins_final,
        target_probs=probs,
        draft_probs=torch.zeros_like(probs),  # what eagle_sample passes without rejection sampling
        threshold_single=1.0,
        threshold_acc=threshold_acc,
        deterministic=True,
    )
    return predict, accept_index, num_correct


def random_layout(tree_mod, gen, bs, budget, depth, k, vocab):
    lp = torch.sort(torch.rand(bs, depth, k, generator=gen) * -6.0, dim=-1, descending=True).values
    ids = torch.stack(
        [torch.stack([torch.randperm(vocab, generator=gen)[:k] for _ in range(depth)]) for _ in range(bs)]
    )
    root_tok = torch.randint(0, vocab, (bs,), generator=gen)
    root_pos = torch.randint(0, 4000, (bs,), generator=gen)
    return tree_mod.build_ddtree(
        lp.to(DEV), ids.to(DEV), budget, root_tokens=root_tok.to(DEV), root_positions=root_pos.to(DEV)
    )


def _rows(out, bs, t):
    predict, accept, n = (x.cpu().tolist() for x in out)
    return [(predict[b * t : (b + 1) * t], accept[b], n[b]) for b in range(bs)]


def _ref_rows(want, bs, t):
    predict, accept, n = want
    return [(predict[b * t : (b + 1) * t], accept[b], n[b]) for b in range(bs)]


# ---------------------------------------------------------------- greedy


def _compare(res: dict, examples: list, walk: str, got, want, **case) -> None:
    """Count a mismatch of one request's walk under ``mismatches_<walk>``; keep the first five."""
    if got != want:
        res[f"mismatches_{walk}"] += 1
        if len(examples) < 5:
            examples.append({"walk": walk, **case, "got": got, "want": want})


def run_greedy(cases=400, seed=0):
    compiled()
    tree_ops, _ = jit_modules()
    tree_mod, acc = ddtree_modules()
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    res = {
        "cases": cases,
        "trees": 0,
        "accepted_nodes": 0,
        "full_depth_walks": 0,
        "mismatches_cuda": 0,
        "mismatches_torch": 0,
    }
    examples = []
    shapes = set()
    for _ in range(cases):
        bs = rng.choice([1, 2, 3, 7, 16, 33, 64])
        depth = rng.choice([1, 2, 4, 7, 15])
        k = rng.choice([1, 2, 3, 4, 8])
        budget = min(rng.choice([1, 2, 3, 5, 8, 15, 16, 31, 32, 64, 100, 128]), sum(k**d for d in range(1, depth + 1)))
        shapes.add((budget, depth, k))
        lay = random_layout(tree_mod, gen, bs, budget, depth, k, 5000)
        cand, parent = lay.verify_tokens.cpu(), lay.retrieve_parent_token.cpu()
        steps = depth + 1  # DDTreeVerifyInput.max_tree_depth
        target = cpu.greedy_targets(rng, parent, cand, 5000, p_follow=rng.choice([0.5, 0.8, 1.0]))
        want = cpu.ref_greedy(parent.tolist(), cand.tolist(), target.tolist(), steps)
        got = cuda_greedy(
            tree_ops, lay.verify_tokens, lay.retrieve_next_token, lay.retrieve_next_sibling, target.to(DEV), steps
        )
        torch_walk = acc.greedy_accept(lay.verify_tokens, lay.retrieve_parent_token, target.to(DEV), steps)
        t = budget + 1
        for name, out in (("cuda", got), ("torch", torch_walk)):
            for b, (g, w) in enumerate(zip(_rows(out, bs, t), _ref_rows(want, bs, t), strict=True)):
                _compare(res, examples, name, g, w, bs=bs, budget=budget, depth=depth, k=k, req=b)
        res["trees"] += bs
        res["accepted_nodes"] += sum(want[2])
        res["full_depth_walks"] += sum(1 for n in want[2] if n == depth)
    res["distinct_shapes"] = len(shapes)
    res["max_budget"] = max(s[0] for s in shapes)
    res["examples"] = examples
    return res


# ---------------------------------------------------------------- sampled, same coins


def ref_sampled_margins(parent, cand, p_node, probs_last, coins, coins_final, steps):
    """Float64 reference walk (the rule of ``cpu.ref_sampled``) that also returns, per
    request, how close each decision was to an interval edge. ``p_node[b][j]``: the
    target probability of node j's token at its parent; ``probs_last(b, node, removed)``
    -> float64 CPU row of the target at ``node`` with ``removed`` tokens zeroed."""
    bs, t = len(parent), len(parent[0])
    rows = []
    for b in range(bs):
        kids = [[] for _ in range(t)]
        for j in range(1, t):
            kids[parent[b][j]].append(j)
        predict, accept, n = [0] * t, [-1] * steps, 0
        accept[0] = b * t
        cur, margin, tried = 0, math.inf, []
        for _ in range(1, steps):
            acc_p, nxt, tried = 0.0, None, []
            u = coins[b][cur]
            for c in kids[cur]:
                p = p_node[b][c]
                acc_p += p
                if p > 0:
                    margin = min(margin, abs(u - acc_p))
                if p > 0 and u < acc_p:
                    nxt = c
                    break
                tried.append(cand[b][c])
            if nxt is None:
                break
            predict[cur] = cand[b][nxt]
            n += 1
            accept[n] = b * t + nxt
            cur, tried = nxt, []
        row = probs_last(b, cur, tried)
        cdf = torch.cumsum(row, 0)
        x = coins_final[b] * float(cdf[-1])
        pick = int(torch.searchsorted(cdf, torch.tensor([x], dtype=torch.float64), right=True)[0])
        pick = min(pick, len(row) - 1)
        edge = [float(cdf[pick]) - x] + ([x - float(cdf[pick - 1])] if pick > 0 else [])
        bonus_margin = min(abs(e) for e in edge)
        predict[cur] = pick
        rows.append(((predict, accept, n), margin, bonus_margin))
    return rows


def sampled_case(tree_mod, gen, bs, budget, depth, k, vocab, scale, boost):
    """A DDTree layout, float32 target probabilities whose tree tokens carry real mass, coins."""
    lay = random_layout(tree_mod, gen, bs, budget, depth, k, vocab)
    t = budget + 1
    g = torch.Generator(device=DEV).manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    logits = torch.randn(bs, t, vocab, generator=g, device=DEV) * scale
    b_idx = torch.arange(bs, device=DEV)[:, None].expand(bs, t)
    extra = boost * torch.rand(bs, t, generator=g, device=DEV)
    extra[:, 0] = 0.0
    logits[b_idx[:, 1:], lay.retrieve_parent_token[:, 1:], lay.verify_tokens[:, 1:]] += extra[:, 1:]
    probs = torch.softmax(logits, dim=-1)  # float32, as sampling_softmax returns
    coins = torch.rand(bs, t, generator=g, device=DEV)
    coins_final = torch.rand(bs, generator=g, device=DEV)
    return lay, probs, coins, coins_final


def run_sampled_exact(cases=200, large_cases=30, seed=1):
    _, sampling_ops = jit_modules()
    compiled()
    tree_mod, acc = ddtree_modules()
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    res = {
        "cases": 0,
        "requests": 0,
        "compared": 0,
        "near_ties": 0,
        "near_tie_differences": 0,
        "mismatches_cuda": 0,
        "mismatches_cuda_vs_plain_python_ref": 0,
        "mismatches_torch_walk": 0,
        "accepted_nodes": 0,
        "compared_large_vocab": 0,
        "vocab_sizes": [],
    }
    examples = []
    plan = [("small", rng.choice([6, 9, 12, 16])) for _ in range(cases)] + [
        ("large", rng.choice([4099, 32002, 151936])) for _ in range(large_cases)
    ]
    for kind, vocab in plan:
        if kind == "small":
            bs, depth = rng.choice([1, 4, 16, 64]), rng.choice([1, 2, 3, 6, 15])
            k = min(rng.choice([2, 3, 4, 8]), vocab)
            budget = min(rng.choice([1, 4, 8, 15, 31, 64]), sum(k**d for d in range(1, depth + 1)))
            scale, boost = 2.0, rng.choice([0.0, 2.0, 4.0])
        else:  # peaked like a language model's target, so few draws land within round-off of an edge
            bs, depth, k = rng.choice([1, 4, 16]), rng.choice([3, 7, 15]), rng.choice([4, 8])
            budget = rng.choice([15, 31, 64])
            scale, boost = 4.0, rng.choice([16.0, 20.0])
        lay, probs, coins, coins_final = sampled_case(tree_mod, gen, bs, budget, depth, k, vocab, scale, boost)
        t, steps = budget + 1, depth + 1
        got = _rows(
            cuda_sampled(
                sampling_ops,
                lay.verify_tokens,
                lay.retrieve_next_token,
                lay.retrieve_next_sibling,
                probs,
                coins,
                coins_final,
                steps,
            ),
            bs,
            t,
        )
        parent, cand = lay.retrieve_parent_token.cpu().tolist(), lay.verify_tokens.cpu().tolist()
        rows = torch.arange(bs, device=DEV)[:, None]
        p_node = probs[rows, lay.retrieve_parent_token.clamp(min=0), lay.verify_tokens].double().cpu().tolist()
        c64, cf64 = coins.double().cpu().tolist(), coins_final.double().cpu().tolist()

        def last_row(b, node, removed, probs=probs):
            row = probs[b, node].double().cpu()
            if removed:
                row[torch.tensor(removed, dtype=torch.int64)] = 0.0
            return row

        ref = ref_sampled_margins(parent, cand, p_node, last_row, c64, cf64, steps)
        others = {}
        if kind == "small":
            # ddtree_accept (float32 bonus CDF, so only here) and the unit test's plain-Python walk
            p64 = probs.double()
            others["torch_walk"] = _rows(
                acc.sampled_accept(
                    lay.verify_tokens, lay.retrieve_parent_token, p64, coins.double(), coins_final.double(), steps
                ),
                bs,
                t,
            )
            others["plain_python_ref"] = _ref_rows(
                cpu.ref_sampled(parent, cand, p64.cpu().tolist(), c64, cf64, steps), bs, t
            )
        for b in range(bs):
            want, margin, bonus_margin = ref[b]
            res["requests"] += 1
            if margin < TREE_TOL or bonus_margin < BONUS_TOL:
                res["near_ties"] += 1
                res["near_tie_differences"] += int(got[b] != want)
                continue
            res["compared"] += 1
            res["compared_large_vocab"] += int(kind == "large")
            res["accepted_nodes"] += want[2]
            checks = [("cuda", got[b], want)]
            if others:
                checks += [("torch_walk", others["torch_walk"][b], want)]
                checks += [("cuda_vs_plain_python_ref", got[b], others["plain_python_ref"][b])]
            for name, g, w in checks:
                _compare(
                    res,
                    examples,
                    name,
                    g,
                    w,
                    vocab=vocab,
                    bs=bs,
                    budget=budget,
                    depth=depth,
                    k=k,
                    req=b,
                    margins=(margin, bonus_margin),
                )
        res["cases"] += 1
        if vocab not in res["vocab_sizes"]:
            res["vocab_sizes"].append(vocab)
    res["vocab_sizes"].sort()
    res["examples"] = examples
    return res


# ---------------------------------------------------------------- sampled, distribution


def kernel_walk(sampling_ops, lay, threshold_acc=1.0):
    """``chi_square_first_two``'s walk signature, run by the CUDA kernel on copies of one tree."""

    def walk(C, P, Q, coins, coins_final, steps):
        n = C.shape[0]
        nt = lay.retrieve_next_token[:1].expand(n, -1).contiguous()
        ns = lay.retrieve_next_sibling[:1].expand(n, -1).contiguous()
        return cuda_sampled(
            sampling_ops,
            C,
            nt,
            ns,
            Q.contiguous(),
            coins.float().contiguous(),
            coins_final.float().contiguous(),
            steps,
            threshold_acc,
        )

    return walk


def run_sampled_distribution(n=2_000_000):
    _, sampling_ops = jit_modules()
    compiled()
    tree_mod, acc = ddtree_modules()
    out = {}
    for seed, budget, vocab in ((3, 6, 6), (4, 7, 8), (5, 5, 7)):
        gen = torch.Generator().manual_seed(seed)
        lay = random_layout(tree_mod, gen, 1, budget, 2, 3, vocab)  # D = 2 -> steps = 3, as the statistic needs
        parent, cand = lay.retrieve_parent_token.cpu(), lay.verify_tokens.cpu()
        probs = cpu.random_probs(gen, 1, budget + 1, vocab, sharp=1.0)
        stat, df = cpu.chi_square_first_two(
            acc, parent, cand, probs, n=n, gen=gen, device=DEV, walk=kernel_walk(sampling_ops, lay)
        )
        bad, bdf = cpu.chi_square_first_two(
            acc, parent, cand, probs, n=n, gen=gen, device=DEV, walk=kernel_walk(sampling_ops, lay, threshold_acc=0.5)
        )
        out[f"seed{seed}"] = {
            "tree_parents": parent[0].tolist(),
            "vocab": vocab,
            "chi2": round(stat, 1),
            "df": df,
            "limit_z5": round(cpu.chi_square_limit(df), 1),
            "threshold_acc_0.5_chi2": round(bad, 1),
            "threshold_acc_0.5_limit_z5": round(cpu.chi_square_limit(bdf), 1),
        }
    return out


# ---------------------------------------------------------------- timing (eager, as eagle_sample calls them)


def run_timing(iters=200):
    tree_ops, sampling_ops = jit_modules()
    compiled()
    tree_mod, acc = ddtree_modules()
    gen = torch.Generator().manual_seed(9)
    res = {}
    for bs, budget in ((1, 64), (64, 64)):
        lay = random_layout(tree_mod, gen, bs, budget, 15, 8, 5000)
        target = torch.randint(0, 5000, (bs, budget + 1), device=DEV)
        probs = torch.softmax(torch.randn(bs, budget + 1, 151936, device=DEV), -1)
        coins, cf = torch.rand(bs, budget + 1, device=DEV), torch.rand(bs, device=DEV)
        draft = torch.zeros_like(probs)
        retrieve_index = torch.arange(bs * (budget + 1), device=DEV, dtype=torch.int64).view(bs, budget + 1)
        predict = torch.zeros(bs * (budget + 1), dtype=torch.int32, device=DEV)
        accept_index = torch.full((bs, 16), -1, dtype=torch.int32, device=DEV)
        num_correct = torch.empty((bs,), dtype=torch.int32, device=DEV)

        def sampled_kernel_only():
            sampling_ops.tree_speculative_sampling_target_only(
                predict,
                accept_index,
                num_correct,
                lay.verify_tokens,
                retrieve_index,
                lay.retrieve_next_token,
                lay.retrieve_next_sibling,
                coins,
                cf,
                probs,
                draft,
                1.0,
                1.0,
                True,
            )

        calls = {
            "greedy_cuda": lambda: cuda_greedy(
                tree_ops, lay.verify_tokens, lay.retrieve_next_token, lay.retrieve_next_sibling, target, 16
            ),
            "greedy_torch_walk": lambda: acc.greedy_accept(lay.verify_tokens, lay.retrieve_parent_token, target, 16),
            "sampled_cuda_vocab151936_kernel": sampled_kernel_only,
            "sampled_cuda_vocab151936_with_zeros_like_draft": lambda: cuda_sampled(
                sampling_ops,
                lay.verify_tokens,
                lay.retrieve_next_token,
                lay.retrieve_next_sibling,
                probs,
                coins,
                cf,
                16,
            ),
        }
        for name, fn in calls.items():
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            torch.cuda.synchronize()
            res[f"{name}_bs{bs}_budget{budget}_us"] = round((time.perf_counter() - t0) / iters * 1e6, 1)
    return res


# ---------------------------------------------------------------- pytest


def _need_jit():
    try:
        compiled()
    except Exception as e:  # report why the JIT could not be used
        pytest.skip(f"the wheel's JIT could not build its kernels here: {type(e).__name__}: {e}"[:2000])


def test_greedy_cuda_matches_reference():
    _need_jit()
    res = run_greedy(cases=150)
    assert res["mismatches_cuda"] == 0 and res["mismatches_torch"] == 0, res


def test_sampled_cuda_matches_reference():
    _need_jit()
    res = run_sampled_exact(cases=60, large_cases=6)
    assert res["mismatches_cuda"] == res["mismatches_cuda_vs_plain_python_ref"] == res["mismatches_torch_walk"] == 0, (
        res
    )
    assert res["compared"] >= 0.95 * res["requests"], res


def test_sampled_cuda_distribution():
    _need_jit()
    for seed, r in run_sampled_distribution(n=1_000_000).items():
        assert r["chi2"] < r["limit_z5"], (seed, r)
        assert r["threshold_acc_0.5_chi2"] > r["threshold_acc_0.5_limit_z5"], (seed, r)


if __name__ == "__main__":
    summary = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    import triton

    summary["triton"] = triton.__version__
    out_dir = os.environ.get("OUT")

    def dump():
        print(json.dumps(summary), flush=True)
        if out_dir:
            Path(out_dir, "ddtree_eagle_jit.json").write_text(json.dumps(summary, indent=1))

    def jit_build():
        compiled()
        return dict(ENV)

    stages = [
        ("jit_build", jit_build),
        ("greedy", run_greedy),
        ("sampled_exact", run_sampled_exact),
        ("sampled_distribution", run_sampled_distribution),
        ("timing", run_timing),
    ]
    for name, fn in stages:
        t0 = time.time()
        try:
            summary[name] = fn()
        except Exception as e:  # the summary records the failure and goes on
            summary[name] = {"error": f"{type(e).__name__}: {e}"[:4000], "traceback": traceback.format_exc()[-4000:]}
        summary[name + "_s"] = round(time.time() - t0, 1)
        summary["env"] = dict(ENV)
        dump()
