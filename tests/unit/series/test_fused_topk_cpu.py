"""The fused top-k kernels (feature topk), run on the CPU by Triton's interpreter (TRITON_INTERPRET=1).

The GPU tests (tests/gpu/test_fused_topk.py) need the lent H200; this runs the same kernel file,
patches/sglang/src/sglang/kernels/ops/speculative/ddtree/fused_depth_topk.py, in CI at small shapes and holds it to
the same rule (tests/gpu/fused_topk_ref.py: log-probs within 1e-3 of float64, the same ids
except ties). It covers what the selection must get right whatever the data: the top K all in
one 128-column segment, spread one per segment, exact ties, vocabulary padding, chunks (one
with a single column), K that is 1 or not a power of two, and the tensor-parallel merge; on all
three logits paths (the Triton streaming kernel, cuBLAS + the pass, the persistent TMA kernel
with the pass as its epilogue, whose TMA loads and stores the interpreter emulates), the TMA
path's cases with the selection's optional compaction (CAP) on.

Test equipment: the interpreter runs the Triton kernels with numpy, and on the CPU the cuBLAS
fp32-output matmul (`torch.mm(..., out_dtype=torch.float32)`, CUDA only) is stood in for by
`a.float() @ b.float()`. The child process runs in build/cpu-venv (torch 2.13 CPU + triton, the
venv of test_patched_cli.py); this file is its script.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

# name, rows N, vocab V, hidden H, K, config (path forced; small tiles for the interpreter)
TRITON = {"path": "triton", "BN": 16, "BV": 128, "BK": 32, "num_warps": 4, "num_stages": 1}
TMA = {"path": "tma", "BM": 16, "BN": 64, "BK": 32, "SEG": 32, "SUP": 4, "num_warps": 4, "num_stages": 2}
CASES = [
    ("triton K8", 15, 3001, 64, 8, TRITON),
    ("triton K16, H not a BK multiple", 15, 2000, 48, 16, TRITON),
    ("triton K5 in 700-column chunks, BV 64", 5, 2000, 64, 5, {**TRITON, "BV": 64, "VC": 700}),
    ("cuBLAS K16", 7, 3001, 64, 16, {"path": "cublas"}),
    ("cuBLAS K3 in 1000-column chunks (last one 1 column)", 7, 3001, 64, 3, {"path": "cublas", "VC": 1000}),
    ("cuBLAS K1, 3 slices per row, 64-column segments", 7, 3001, 64, 1,
     {"path": "cublas", "BV": 256, "SEG": 64, "PS": 3}),
    ("cuBLAS K16, vocabulary of 20 (fewer segments than K)", 3, 20, 64, 16, {"path": "cublas"}),
    ("TMA K8, 3001 columns (padded row stride), groups of 4 segments", 15, 3001, 64, 8, TMA),
    ("TMA K16, H not a BK multiple, no group level", 40, 2000, 48, 16, {**TMA, "SUP": 1}),
    ("TMA K5 in 700-column chunks, one 64-column segment per tile", 5, 2000, 64, 5, {**TMA, "SEG": 64, "VC": 700}),
    ("TMA K16, vocabulary of 20 (fewer groups and segments than K)", 3, 20, 64, 16, TMA),
    ("TMA K16, 16 compacted candidates (most rows sort all)", 15, 3001, 64, 16, {**TMA, "CAP": 16}),
    ("TMA K8, 64 compacted candidates", 15, 3001, 64, 8, {**TMA, "CAP": 64}),
]


def _child() -> int:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    sys.path.insert(0, str(REPO / "tests" / "gpu"))
    import torch
    from fused_topk_ref import check, load_kernel_module

    mod = load_kernel_module()
    # Stand-in for cuBLAS's fp32-output matmul (CUDA only): the same product in fp32 on the CPU.
    mod._mm_fp32 = lambda a, b, out: out.copy_(a.float() @ b.float())
    gen = torch.Generator().manual_seed(0)
    DTYPE = torch.float16  # the interpreter (numpy) has no bfloat16; the kernels take either

    def weight(v, h):
        return (torch.randn(v, h, generator=gen) * (3.0 / h**0.5)).to(DTYPE)

    def hidden(n, h):
        return torch.randn(n, h, generator=gen).to(DTYPE)

    # Every fp32 buffer the kernels get starts as +inf, so a read of memory no kernel wrote would
    # win the top K and fail the rule.
    allocs = []
    real_empty = torch.empty

    def poisoned_empty(*args, **kw):
        t = real_empty(*args, **kw)
        if t.dtype == torch.float32:
            allocs.append(t.fill_(float("inf")))
        return t

    torch.empty = poisoned_empty
    out = []
    for name, n, v, h, k, cfg in CASES:
        w, x = weight(v, h), hidden(n, h)
        allocs.clear()
        lp, ids = mod.fused_depth_topk(x, w, k, config=cfg)
        res = check(lp, ids, x, w.double(), k, v)
        res["poisoned_buffers"] = len(allocs)
        out.append({"case": name, **res})

    for cfg in (TRITON, {"path": "cublas", "VC": 640}, {**TMA, "VC": 640, "CAP": 64}):
        path = cfg["path"]
        # The top 16 of rows 0-2 all in one 128-column segment (columns 256-271); rows 3-5 have
        # theirs one per segment (columns 60, 188, ..., 1980): the selection takes K segments.
        v, h, k = 2000, 64, 16
        w, x = weight(v, h), hidden(6, h)
        for j in range(k):
            w[256 + j] = (x[0].float() * (0.5 + 0.01 * j)).to(DTYPE)
            w[60 + 128 * j] = (x[3].float() * (0.5 + 0.01 * j)).to(DTYPE)
        x[1:3] = x[0]
        x[4:6] = x[3]
        lp, ids = mod.fused_depth_topk(x, w, k, config=cfg)
        res = check(lp, ids, x, w.double(), k, v)
        assert sorted(ids[0].tolist()) == list(range(256, 272)), ids[0].tolist()
        assert sorted(ids[3].tolist()) == [60 + 128 * j for j in range(k)], ids[3].tolist()
        out.append({"case": f"{path}: top K in one segment / one per segment", **res})

        # Exact ties: 9 identical head rows pushed into the top 16, the lower id first among them.
        w = weight(2000, 64)
        w[100:108] = w[7]
        x = hidden(4, 64)
        x[:2] = (w[7].float() * 4).to(DTYPE)
        lp, ids = mod.fused_depth_topk(x, w, 16, config=cfg)
        res = check(lp, ids, x, w.double(), 16, 2000)
        assert sorted(ids[0, :9].tolist()) == [7, *range(100, 108)], ids[0].tolist()
        for j in range(15):  # among bitwise-equal values, the lower id first
            assert lp[0, j] != lp[0, j + 1] or ids[0, j] < ids[0, j + 1], (lp[0].tolist(), ids[0].tolist())
        res["equal_values_in_row_0"] = int((lp[0, 1:] == lp[0, :-1]).sum())
        out.append({"case": f"{path}: exact ties", **res})

        # Padding rows past vocab_size (a vocab-parallel shard's) never appear.
        w = weight(1500, 64)
        padded = torch.cat([w, torch.full((64, 64), 1.0, dtype=DTYPE)])
        x = hidden(5, 64).abs()  # the all-ones padding rows would win
        lp, ids = mod.fused_depth_topk(x, padded, 8, vocab_size=1500, config=cfg)
        out.append({"case": f"{path}: padded vocabulary", **check(lp, ids, x, w.double(), 8, 1500)})

        # Tensor parallelism: three uneven shards, each its own partial, then the merge.
        w, x = weight(3000, 64), hidden(6, 64)
        shards = [(0, 700), (700, 2900), (2900, 3000)]
        parts = [mod.fused_local_topk(x, w[a:b], 16, vocab_start=a, config=cfg) for a, b in shards]
        lp, ids, lse = mod.merge_topk_partials(*(torch.stack([p[i] for p in parts], 1) for i in range(3)), 16)
        lse_err = (lse.double() - torch.logsumexp(x.double() @ w.double().T, -1)).abs().max().item()
        assert lse_err <= 1e-3, lse_err
        res = check(lp, ids, x, w.double(), 16, 3000)
        out.append({"case": f"{path}: TP merge of 3 shards", "lse_err": lse_err, **res})
    # TMA needs 16-byte aligned rows: forced on 60-wide fp16 rows (120 bytes), it is refused by name;
    # so is the ping-pong kernel (Gluon, Hopper's wgmma) off a Hopper GPU.
    for case, x, w, cfg in (("TMA forced on unaligned rows", hidden(3, 60), weight(500, 60), TMA),
                            ("ping-pong forced on the CPU", hidden(3, 64), weight(500, 64), {"path": "pingpong"})):
        try:
            mod.fused_depth_topk(x, w, 4, config=cfg)
            out.append({"case": case, "refused": None})
        except AssertionError as exc:
            out.append({"case": case, "refused": str(exc)})
    print(json.dumps(out))
    return 0


def _compile_hopper() -> int:
    """Compile the ping-pong kernel (Gluon, which the interpreter cannot run) for sm_90 with this
    venv's Triton, launching nothing: Gluon's API moves between Triton releases, and the GPU
    machine's Triton (3.6) is not the one SGLang 0.5.23's torch brings."""
    sys.path.insert(0, str(REPO / "tests" / "gpu"))
    import torch
    import triton
    from fused_topk_ref import load_kernel_module
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    mod = load_kernel_module()
    gl, k = mod.gl, mod._pingpong_logits_kernel
    cfg = mod.default_config(960, 248320, 5120, torch.device("cpu"), path="pingpong")
    sig = {name: "i32" for name in k.arg_names}
    for name, shape in (("a_desc", [cfg["BM"], cfg["BK"]]), ("b_desc", [cfg["BN"], cfg["BK"]])):
        layout = gl.NVMMASharedLayout.get_default_for(shape, gl.bfloat16)
        sig[name] = f"tensordesc<bf16{shape},{layout!r}>"
    sig.update(mx_ptr="*fp32", pl_ptr="*fp32", x_ptr="*fp32")
    consts = {name: cfg[name] for name in ("BM", "BN", "BK", "SEG", "STAGES", "REGS")}
    consts.update(NUM_PROGS=132, WRITE=True)
    sig.update({name: "constexpr" for name in consts})
    compiled = triton.compile(GluonASTSource(k, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=4))
    ptx = compiled.asm["ptx"]
    print(json.dumps({"triton": triton.__version__, "shared": compiled.metadata.shared,
                      "num_warps": compiled.metadata.num_warps, "wgmma": ptx.count("wgmma.mma_async"),
                      "setmaxnreg_232": ptx.count("setmaxnreg.inc.sync.aligned.u32 \t232"),
                      "tma_loads": len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::\w+\.global", ptx))}))
    return 0


if __name__ == "__main__":
    sys.exit(_compile_hopper() if "--compile-hopper" in sys.argv else _child())

import pytest  # noqa: E402
from test_patched_cli import cpu_python  # noqa: E402, F401  (the build/cpu-venv fixture)

pytestmark = pytest.mark.slow


def _run_child(python, *args, what: str):
    """This file as a script in build/cpu-venv (no GPU; the interpreter is switched on by the
    child itself where it wants it): the JSON on its last line."""
    env = {key: val for key, val in os.environ.items() if key != "TRITON_INTERPRET"}
    proc = subprocess.run([str(python), __file__, *args], capture_output=True, text=True, timeout=1800,
                          env=dict(env, CUDA_VISIBLE_DEVICES=""), cwd=REPO)
    assert proc.returncode == 0, f"{what}:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def interpreted(cpu_python) -> list:  # noqa: F811
    return _run_child(cpu_python, what="the interpreted kernels failed")


@pytest.fixture(scope="module")
def hopper_build(cpu_python) -> dict:  # noqa: F811
    return _run_child(cpu_python, "--compile-hopper", what="the ping-pong kernel did not compile for sm_90")


def test_pingpong_kernel_compiles_for_hopper(hopper_build):
    """The ping-pong kernel builds for sm_90 with the CPU venv's Triton (not the GPU machine's):
    three warpgroups (TMA producer, two wgmma consumers raised to 232 registers), two TMA loads
    per stage, and the shared memory a block may take on an H100/H200 (227 KB)."""
    assert hopper_build["num_warps"] == 12, hopper_build
    assert hopper_build["wgmma"] >= 2 and hopper_build["tma_loads"] == 2, hopper_build
    assert hopper_build["setmaxnreg_232"] >= 1, hopper_build
    assert 200 * 1024 <= hopper_build["shared"] <= 227 * 1024, hopper_build


def test_every_case_meets_the_float64_rule(interpreted):
    checked = [r for r in interpreted if "max_abs_lp_err" in r]
    names = [r["case"] for r in checked]
    assert names[: len(CASES)] == [c[0] for c in CASES]
    assert len(names) == len(CASES) + 12
    assert all(r["max_abs_lp_err"] <= 1e-3 for r in checked)
    # every case's fp32 buffers (logits, segment maxima, partial LSEs, outputs) started as +inf
    assert all(r["poisoned_buffers"] >= 4 for r in checked[: len(CASES)]), checked


def test_tma_path_refuses_unaligned_rows(interpreted):
    """Forcing the TMA path on operands TMA cannot address fails with a message that says why
    (the default dispatch takes cuBLAS + the pass for them instead)."""
    (res,) = [r for r in interpreted if r["case"] == "TMA forced on unaligned rows"]
    assert res["refused"] and res["refused"].startswith("path 'tma' needs") and "16-byte aligned" in res["refused"], res


def test_exact_ties_were_exercised(interpreted):
    """The tie cases had bitwise-equal values in the top 16 (the child asserts the lower id comes
    first among them): 9 tied rows give 8 equal neighbours."""
    ties = [r for r in interpreted if r["case"].endswith("exact ties")]
    assert [r["equal_values_in_row_0"] for r in ties] == [8, 8, 8]


def test_pingpong_path_refused_off_hopper(interpreted):
    """The warp-specialised ping-pong kernel (Gluon, wgmma) runs on Hopper GPUs only; forced
    anywhere else it is refused with a message naming what it needs (the GPU tests run it)."""
    (res,) = [r for r in interpreted if r["case"] == "ping-pong forced on the CPU"]
    assert res["refused"] == "path 'pingpong' needs Gluon (triton >= 3.5) on a Hopper GPU", res
