"""GPU: DDTree state forking (patch 0002) against a float64 per-path reference.

Runs the SGLang 0.5.23 verify kernels themselves (tree conv update, fused sigmoid-gating
delta-rule verify, post-verify state scatter) and the patched commit-index helper on
random draft trees, and checks every node's outputs and the committed states against a
float64 reference that runs each root-to-node path sequentially. The same tokens run as
a flat chain (no forking: what the field saw before the patch) must diverge.

Kernels are imported from an unpacked patched wheel without running any package
``__init__`` (see /work/shared/docs/sglang-0.5.23.md): ``SGLANG_FORK_ROOT`` is the folder that
holds its ``sglang/`` (default ``build/patchwork/tree``, made by ``make patch-work``); the
series' ``ddtree_state_fork`` comes from the repository (``patches/sglang/src``,
``SGLANG_SRC_ROOT``).

    python3 -m pytest -q tests/gpu/test_state_forking.py   # on the lent H200
"""

from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
ROOT = Path(os.environ.get("SGLANG_FORK_ROOT", REPO / "build" / "patchwork" / "tree"))
SRC = Path(os.environ.get("SGLANG_SRC_ROOT", REPO / "patches" / "sglang" / "src"))

# The lent H200; on a CPU the Triton interpreter (TRITON_INTERPRET=1) runs a small smoke
# version of the same checks (FORK_TEST_SMALL=1 shrinks heads and tree sizes).
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEV = "cuda" if torch.cuda.is_available() else ("cpu" if INTERPRET else None)
SMALL = os.environ.get("FORK_TEST_SMALL") == "1"

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEV is None, reason="needs an NVIDIA GPU (or TRITON_INTERPRET=1)"),
    pytest.mark.skipif(not (ROOT / "sglang").is_dir(), reason=f"no unpacked sglang under {ROOT}"),
]

# Model slice used by the correctness tests: one GDN layer of Qwen3.6-27B at TP 4
# (16 key heads / 48 value heads / 128-dim heads / conv width 4; heads divided by 4).
H, HV, K, V, W = (1, 2, 16, 16, 4) if SMALL else (4, 12, 128, 128, 4)
SIZES = (8, 16) if SMALL else (16, 32, 64, 128)  # verify width T = budget + 1 (root + nodes)
BATCHES = (1, 3) if SMALL else (1, 8)
# The interpreter cannot load bf16; its smoke run uses fp16 (tighter than bf16).
ACT = torch.float16 if INTERPRET else torch.bfloat16


# --------------------------------------------------------------------------- loader


def load_sglang(root: Path = ROOT) -> dict[str, types.ModuleType]:
    """Import the wheel's kernel modules (and the patch's helper) without package inits."""
    import importlib

    pkg = root / "sglang"

    def package(name: str, path: Path | None) -> types.ModuleType:
        mod = sys.modules.get(name)
        if mod is None:
            mod = types.ModuleType(name)
            mine = SRC.joinpath(*name.split(".")) if path is not None else None
            # The series' new files first (from the repository), then the wheel's folder.
            mod.__path__ = [str(p) for p in (mine, path) if p is not None and p.is_dir()]
            sys.modules[name] = mod
        return mod

    for dotted in (
        "sglang",
        "sglang.kernels",
        "sglang.kernels.ops",
        "sglang.kernels.ops.attention",
        "sglang.kernels.ops.attention.fla",
        "sglang.kernels.ops.attention.linear",
        "sglang.kernels.ops.mamba",
        "sglang.kernels.ops.memory",
        "sglang.kernels.ops.speculative",  # the series' kernels (tree conv: fullsize/gdn_verify_split.py)
        "sglang.kernels.ops.speculative.ddtree",
        "sglang.srt",
        "sglang.srt.speculative",
    ):
        package(dotted, pkg.joinpath(*dotted.split(".")[1:]))

    def sm() -> int:
        if DEV != "cuda":
            return 0
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor

    common = types.ModuleType("sglang.srt.utils.common")
    common.torch_release = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    common.is_cuda = lambda: torch.version.cuda is not None
    common.get_device_core_count = lambda device_id=0: torch.cuda.get_device_properties(device_id).multi_processor_count
    utils = package("sglang.srt.utils", None)
    utils.common = common
    utils.is_cuda = common.is_cuda
    utils.is_hip = lambda: False
    utils.is_gfx95_supported = lambda: False
    utils.get_device_sm = sm
    utils.is_sm90_supported = lambda: sm() >= 90
    sys.modules["sglang.srt.utils.common"] = common
    jit = package("sglang.kernels.jit", None)
    jit_utils = types.ModuleType("sglang.kernels.jit.utils")
    jit_utils.is_arch_support_pdl = lambda: sm() >= 90
    jit.utils = jit_utils
    sys.modules["sglang.kernels.jit.utils"] = jit_utils

    names = {
        "conv": "sglang.kernels.ops.mamba.causal_conv1d_triton",
        "gdn": "sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent",
        "scatter": "sglang.kernels.ops.mamba.mamba_state_scatter_triton",
        "fork": "sglang.srt.speculative.ddtree_state_fork",
    }
    return {key: importlib.import_module(name) for key, name in names.items()}


# --------------------------------------------------------------------------- trees


# random_parents (window 6: deep and bushy, like DDTree's best-first trees) and links: tests/gpu/draft_trees.py
from draft_trees import links, random_parents  # noqa: E402, F401


def path(parents: list[int], i: int) -> list[int]:
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out[::-1]  # root first


# --------------------------------------------------------------------------- problem


@dataclass
class Problem:
    bs: int
    T: int
    parents: list[list[int]]
    nxt_tok: torch.Tensor  # [bs, T]
    nxt_sib: torch.Tensor  # [bs, T]
    x: torch.Tensor  # [bs*T, dim] bf16 (mixed qkv before the conv)
    conv_w: torch.Tensor  # [dim, W] bf16
    conv_pool: torch.Tensor  # [slots, dim, W-1] bf16
    a: torch.Tensor  # [bs*T, HV] bf16
    b: torch.Tensor  # [bs*T, HV] bf16
    A_log: torch.Tensor  # [HV] f32
    dt_bias: torch.Tensor  # [HV] f32
    ssm_pool: torch.Tensor  # [slots, HV, V, K] f32
    slots: torch.Tensor  # [bs] int32

    @property
    def dim(self) -> int:
        return self.x.shape[1]


def make_problem(bs: int, T: int, seed: int, link_dtype=torch.int64) -> Problem:
    gen = torch.Generator().manual_seed(seed)
    dev = DEV
    dim = 2 * H * K + HV * V
    parents = [random_parents(T, gen) for _ in range(bs)]
    nt, ns = zip(*(links(p) for p in parents), strict=True)
    n_slots = bs + 5

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen) * scale

    return Problem(
        bs=bs,
        T=T,
        parents=parents,
        nxt_tok=torch.tensor(nt, dtype=link_dtype, device=dev),
        nxt_sib=torch.tensor(ns, dtype=link_dtype, device=dev),
        x=rnd(bs * T, dim).to(dev, ACT),
        conv_w=rnd(dim, W, scale=0.5).to(dev, ACT),
        conv_pool=rnd(n_slots, dim, W - 1).to(dev, ACT),
        a=rnd(bs * T, HV).to(dev, ACT),
        b=rnd(bs * T, HV).to(dev, ACT),
        # decay exp(g) with g = -exp(A_log) * softplus(a + dt_bias): mostly 0.1 .. 0.8
        A_log=torch.log(torch.rand(HV, generator=gen) * 1.5 + 0.5).to(dev),
        dt_bias=rnd(HV, scale=0.5).to(dev),
        ssm_pool=rnd(n_slots, HV, V, K, scale=0.1).to(dev),
        slots=(torch.randperm(n_slots - 1, generator=gen)[:bs] + 1).to(dev, torch.int32),
    )


def verify_buffers(p: Problem, tree: bool) -> dict:
    """One layer's target-verify buffers: the conv pool (a copy), the intermediate conv windows and SSM
    states (rows = bs + 1), their indices, the parents the tree conv writes, the transposed input, seq starts."""
    bs, T, dim = p.bs, p.T, p.dim
    return {
        "conv_pool": p.conv_pool.clone(),
        "inter_conv": torch.zeros(bs + 1, T, dim, W - 1, dtype=ACT, device=DEV),
        "inter_ssm": torch.zeros(bs + 1, T, HV, V, K, dtype=torch.float32, device=DEV),
        "inter_idx": torch.arange(bs, dtype=torch.int32, device=DEV),
        "parent": torch.empty_like(p.nxt_tok) if tree else None,
        "xt": p.x.view(bs, T, dim).transpose(1, 2),
        "qsl": torch.arange(0, bs * T + 1, T, dtype=torch.int32, device=DEV),
    }


def conv_call(m, p: Problem, buf: dict, tree: bool):
    """The verify's conv update (gdn_backend.forward_extend's first kernel) as a call; returns [bs, dim, T]."""
    return lambda: m["conv"].causal_conv1d_update(
        buf["xt"], buf["conv_pool"], p.conv_w, None, "silu", conv_state_indices=p.slots,
        intermediate_conv_window=buf["inter_conv"], intermediate_state_indices=buf["inter_idx"],
        retrieve_next_token=p.nxt_tok if tree else None, retrieve_next_sibling=p.nxt_sib if tree else None,
        retrieve_parent_token=buf["parent"])


def recurrent_call(m, p: Problem, buf: dict, mixed: torch.Tensor):
    """The verify's sigmoid-gating delta-rule update on the conv output ``mixed`` [bs*T, dim], writing per-node
    intermediate states (a tree when ``buf["parent"]`` is set); returns the core output."""
    bs, T = p.bs, p.T
    q, k, v = torch.split(mixed, [H * K, H * K, HV * V], dim=-1)
    return lambda: m["gdn"].fused_sigmoid_gating_delta_rule_update(
        A_log=p.A_log, a=p.a, dt_bias=p.dt_bias, softplus_beta=1.0, softplus_threshold=20.0,
        q=q.view(1, bs * T, H, K), k=k.view(1, bs * T, H, K), v=v.view(1, bs * T, HV, V), b=p.b,
        initial_state_source=p.ssm_pool, initial_state_indices=p.slots, cu_seqlens=buf["qsl"],
        use_qk_l2norm_in_kernel=True, is_kda=False, disable_state_update=True,
        intermediate_states_buffer=buf["inter_ssm"], intermediate_state_indices=buf["inter_idx"],
        cache_steps=T, retrieve_parent_token=buf["parent"])


def run_verify(m, p: Problem, tree: bool):
    """The target-verify sequence of gdn_backend.forward_extend, one layer.

    Returns (conv_out [bs*T, dim], o [bs*T, HV, V], intermediate ssm [bs+1, T, HV, V, K],
    intermediate conv windows [bs+1, T, dim, W-1], parents written by the conv kernel).
    """
    buf = verify_buffers(p, tree)
    mixed = conv_call(m, p, buf, tree)().transpose(1, 2).reshape(p.bs * p.T, p.dim)
    o = recurrent_call(m, p, buf, mixed)()
    return mixed, o.view(p.bs * p.T, HV, V), buf["inter_ssm"], buf["inter_conv"], buf["parent"]


# --------------------------------------------------------------------------- reference


def reference(p: Problem):
    """float64, per path: each node's conv output, core output, state and conv window."""
    bs, T, dim = p.bs, p.T, p.dim
    f = torch.float64
    x = p.x.to(f).view(bs, T, dim).cpu()
    w = p.conv_w.to(f).cpu()
    a, b = p.a.to(f).view(bs, T, HV).cpu(), p.b.to(f).view(bs, T, HV).cpu()
    A = torch.exp(p.A_log.to(f)).cpu()
    dtb = p.dt_bias.to(f).cpu()
    conv_out = torch.empty(bs, T, dim, dtype=f)
    out = torch.empty(bs, T, HV, V, dtype=f)
    states = torch.empty(bs, T, HV, V, K, dtype=f)
    windows = torch.empty(bs, T, dim, W - 1, dtype=f)
    scale = K**-0.5
    for r in range(bs):
        slot = int(p.slots[r])
        hist = p.conv_pool[slot].to(f).cpu()  # [dim, W-1], oldest first
        h0 = p.ssm_pool[slot].to(f).cpu()  # [HV, V, K]
        par = p.parents[r]
        node_state: dict[int, torch.Tensor] = {}
        for i in range(T):  # topological order: the parent's state is ready
            seq = torch.cat([hist, x[r, path(par, i)].T], dim=1)  # [dim, W-1+depth+1]
            win = seq[:, -W:]
            y = (win * w).sum(dim=1)
            y = y / (1 + torch.exp(-y))
            conv_out[r, i] = y
            windows[r, i] = seq[:, -(W - 1) :]
            qi, ki, vi = y[: H * K].view(H, K), y[H * K : 2 * H * K].view(H, K), y[2 * H * K :]
            qi = qi / torch.sqrt((qi * qi).sum(-1, keepdim=True) + 1e-6) * scale
            ki = ki / torch.sqrt((ki * ki).sum(-1, keepdim=True) + 1e-6)
            vi = vi.view(HV, V)
            g = -A * torch.nn.functional.softplus(a[r, i] + dtb)  # [HV]
            beta = torch.sigmoid(b[r, i])
            hprev = h0 if i == 0 else node_state[par[i]]
            hk = hprev * torch.exp(g)[:, None, None]
            kk = ki.repeat_interleave(HV // H, dim=0)  # [HV, K]
            qq = qi.repeat_interleave(HV // H, dim=0)
            delta = (vi - (hk * kk[:, None, :]).sum(-1)) * beta[:, None]  # [HV, V]
            h = hk + delta[:, :, None] * kk[:, None, :]
            node_state[i] = h
            states[r, i] = h
            out[r, i] = (h * qq[:, None, :]).sum(-1)
    return conv_out, out, states, windows


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def scatter_commit(m, dst: torch.Tensor, src: torch.Tensor, slots, steps, conv: bool) -> None:
    """The post-verify commit: dst[slot] = src[row, step] (row = request index)."""
    if DEV == "cuda":
        fn = (
            m["scatter"].fused_conv_window_scatter_with_mask
            if conv
            else m["scatter"].fused_mamba_state_scatter_with_mask
        )
        fn(dst[None], src[None], slots, steps)
        return
    # The interpreter smoke run: the backend's own CPU fallback, inlined.
    rows = torch.arange(steps.shape[0])
    dst[slots.long()] = src[rows, steps.long()]


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per-node relative error: ||got - ref|| / ||ref|| over everything but the node axis."""
    got = got.to(torch.float64).cpu().flatten(2)
    ref = ref.flatten(2)
    return (got - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)


# Tolerances (bf16 inputs and outputs, fp32 accumulation and fp32 states):
CONV_TOL = 8e-3  # conv output is stored in bf16: 2^-8 relative rounding
OUT_TOL = 2e-2  # core output: bf16 q/k/v from the conv, bf16 output store, fp32 state
STATE_TOL = 2e-2  # fp32 intermediate states built from bf16 conv outputs
DIVERGED = 0.1  # a chain node counts as diverged above this relative error


def chain_nodes(parents: list[int]) -> list[bool]:
    """Nodes whose root path is 0, 1, ..., i: where chain and tree agree."""
    ok = [True]
    for i in range(1, len(parents)):
        ok.append(parents[i] == i - 1 and ok[i - 1])
    return ok


def check_case(m, bs: int, T: int, seed: int, link_dtype=torch.int64) -> dict:
    p = make_problem(bs, T, seed, link_dtype)
    ref_conv, ref_out, ref_state, ref_win = reference(p)

    conv, o, inter_ssm, inter_conv, parent_buf = run_verify(m, p, tree=True)
    sync()
    # The conv kernel derives every node's parent from the first-child/next-sibling links.
    got_par = parent_buf.cpu()
    for r in range(bs):
        assert got_par[r, 1:].tolist() == p.parents[r][1:], f"parents, request {r}"

    e_conv = rel_err(conv.view(bs, T, -1), ref_conv)
    e_out = rel_err(o.view(bs, T, HV, V), ref_out)
    e_state = rel_err(inter_ssm[:bs], ref_state)
    assert e_conv.max() < CONV_TOL, f"conv {e_conv.max():.3e}"
    assert e_out.max() < OUT_TOL, f"out {e_out.max():.3e}"
    assert e_state.max() < STATE_TOL, f"state {e_state.max():.3e}"
    # Conv windows are copies of bf16 inputs: exact.
    assert torch.equal(inter_conv[:bs].cpu().to(torch.float64), ref_win), "conv windows"

    # Commit: every request accepts a different node (a random one, deepest first few).
    gen = torch.Generator().manual_seed(seed + 1)
    accepted = torch.randint(0, T, (bs,), generator=gen).to(DEV)
    steps = m["fork"].ddtree_commit_step_indices(accepted)
    ssm_pool = p.ssm_pool.clone()
    conv_pool = p.conv_pool.clone()
    scatter_commit(m, ssm_pool, inter_ssm, p.slots, steps, conv=False)
    scatter_commit(m, conv_pool, inter_conv, p.slots, steps, conv=True)
    sync()
    acc = accepted.cpu()
    for r in range(bs):
        slot, a = int(p.slots[r]), int(acc[r])
        ref_s = ref_state[r, a]
        err = (ssm_pool[slot].to(torch.float64).cpu() - ref_s).norm() / ref_s.norm()
        assert err < STATE_TOL, f"committed state, request {r}: {err:.3e}"
        assert torch.equal(conv_pool[slot].cpu().to(torch.float64), ref_win[r, a]), f"window {r}"
    # Untouched slots stay untouched.
    others = torch.ones(ssm_pool.shape[0], dtype=torch.bool)
    others[p.slots.long().cpu()] = False
    assert torch.equal(ssm_pool[others.to(DEV)], p.ssm_pool[others.to(DEV)])

    # Without forking (the 0.5.23 chain path the field ran): the same tokens diverge.
    c_conv, c_o, c_ssm, _, _ = run_verify(m, p, tree=False)
    sync()
    c_out = rel_err(c_o.view(bs, T, HV, V), ref_out)
    c_state = rel_err(c_ssm[:bs], ref_state)
    tree_only = torch.tensor([[not c for c in chain_nodes(par)] for par in p.parents])
    n_tree_only = int(tree_only.sum())
    diverged = int(((c_out > DIVERGED) & tree_only).sum())
    assert n_tree_only > 0, "the random trees must branch"
    # Nodes on the leading chain agree either way (forking must not change them).
    if (~tree_only).any():
        assert c_out[~tree_only].max() < OUT_TOL, "leading chain nodes"
    assert diverged >= 0.9 * n_tree_only, f"chain diverged on {diverged}/{n_tree_only} only"
    return {
        "bs": bs,
        "T": T,
        "fork_out_max": float(e_out.max()),
        "fork_state_max": float(e_state.max()),
        "fork_conv_max": float(e_conv.max()),
        "chain_out_max": float(c_out.max()),
        "chain_state_max": float(c_state.max()),
        "chain_out_median_branch": float(c_out[tree_only].median()),
        "chain_diverged": diverged,
        "branch_nodes": n_tree_only,
    }


@pytest.fixture(scope="module")
def mods():
    return load_sglang()


def test_ddtree_gate_per_spec_info(mods):
    """The patched backend forks a DDTree verify when the server's state forking is on (the
    --speculative-ddtree-state-forking flag, resolved before the backend is made), and only then."""
    import ast
    from types import SimpleNamespace

    fork = mods["fork"]
    ddtree = SimpleNamespace(is_ddtree=True, retrieve_next_token=None)
    chain = SimpleNamespace(spec_input_type=SimpleNamespace(name="DFLASH_VERIFY"))
    assert fork.is_ddtree_verify(ddtree)
    assert fork.is_ddtree_verify(SimpleNamespace(spec_input_type=SimpleNamespace(name="DDTREE_VERIFY")))
    assert not fork.is_ddtree_verify(chain) and not fork.is_ddtree_verify(None)
    assert fork.ddtree_forking_enabled("DDTREE") and fork.ddtree_forking_enabled("ddtree", "on")
    assert not fork.ddtree_forking_enabled("DDTREE", "off")
    assert not fork.ddtree_forking_enabled("DFLASH")
    assert not fork.ddtree_forking_enabled()  # no runtime context here: off
    assert fork.hybrid_forking(False, "DDTREE", "on") and not fork.hybrid_forking(False, "DDTREE", "off")

    # MambaAttnBackendBase._tree_verify, taken from the patched source and run on stand-ins.
    src = (ROOT / "sglang/srt/layers/attention/hybrid_linear_attn_backend.py").read_text()
    cls = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name == "MambaAttnBackendBase")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_tree_verify")
    ns: dict = {}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "hybrid_linear_attn_backend.py", "exec"), ns)
    tree_verify = ns["_tree_verify"]
    # What __init__ sets: _ddtree_forking from hybrid_forking (DDTREE + flag on), _ddtree_graphs
    # the same on the target only.
    dflash_server = SimpleNamespace(topk=1, _ddtree_forking=False, _ddtree_graphs=False)
    ddtree_server = SimpleNamespace(topk=1, _ddtree_forking=True, _ddtree_graphs=True)
    nofork_server = SimpleNamespace(topk=1, _ddtree_forking=False, _ddtree_graphs=False)
    eagle_server = SimpleNamespace(topk=4, _ddtree_forking=False, _ddtree_graphs=False)
    assert tree_verify(ddtree_server, ddtree)  # per forward: a DDTree verify forks
    assert not tree_verify(ddtree_server, chain)  # eager chain verify stays a chain
    assert tree_verify(ddtree_server, None, graph=True)  # capture dummy of a DDTree target
    assert not tree_verify(nofork_server, ddtree)  # forking off: the DDTree tree runs as a chain
    assert not tree_verify(nofork_server, None, graph=True)
    assert not tree_verify(dflash_server, chain) and not tree_verify(dflash_server, None, graph=True)
    assert tree_verify(eagle_server, chain)  # EAGLE top-k > 1 unchanged
    # Every tree gate of the backend (eager, capture, replay, post-draft refresh) goes
    # through _tree_verify; the bare global top-k gate is gone.
    assert src.count("self._tree_verify(") == 4
    assert "if self.topk > 1:" not in src and "self.topk <= 1" not in src


@pytest.mark.skipif(INTERPRET, reason="the Triton interpreter rejects the int32 link masks")
def test_int32_links_cuda_graph_buffers(mods):
    """The CUDA-graph path feeds int32 link buffers; same results."""
    check_case(mods, BATCHES[-1], SIZES[0], seed=7, link_dtype=torch.int32)


def test_track_step_walks_the_accepted_path(mods):
    """ddtree_track_step_indices returns the node at the crossing depth on the accepted path."""
    fork = mods["fork"]
    gen = torch.Generator().manual_seed(3)
    bs, T, interval = 8, 64, 4
    parents = [random_parents(T, gen) for _ in range(bs)]
    par = torch.tensor(parents, device=DEV)
    accepted = torch.randint(1, T, (bs,), generator=gen)
    paths = [path(parents[r], int(accepted[r])) for r in range(bs)]
    commit = torch.tensor([len(pt) for pt in paths])
    pre = torch.randint(10, 30, (bs,), generator=gen)
    post = pre + commit
    got = fork.ddtree_track_step_indices(
        retrieve_parent_token=par,
        accepted_node_index=accepted.to(DEV),
        commit_lens=commit.to(DEV),
        seq_lens_pre_verify=pre.to(DEV),
        seq_lens_post_verify=post.to(DEV),
        mamba_track_interval=interval,
    ).cpu()
    for r in range(bs):
        point = int(post[r]) // interval * interval
        if int(pre[r]) // interval == int(post[r]) // interval:
            want = -1
        else:
            ith = max(point - int(pre[r]) - 1, 0)
            want = paths[r][ith] if ith < len(paths[r]) else -1
        assert int(got[r]) == want, (r, paths[r], int(pre[r]), int(got[r]), want)


@pytest.mark.parametrize("bs", BATCHES)
@pytest.mark.parametrize("T", SIZES)
def test_forked_verify_matches_per_path_reference(mods, T, bs):
    res = check_case(mods, bs, T, seed=1000 * T + bs)
    print(
        f"\nT={T} bs={bs}: forked out {res['fork_out_max']:.2e} state {res['fork_state_max']:.2e}"
        f" conv {res['fork_conv_max']:.2e} | chain out max {res['chain_out_max']:.2e}"
        f" median(branch) {res['chain_out_median_branch']:.2e}"
        f" diverged {res['chain_diverged']}/{res['branch_nodes']}"
    )
