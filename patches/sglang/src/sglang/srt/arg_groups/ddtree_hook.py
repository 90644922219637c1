"""Server-argument checks and resolution for ``--speculative-algorithm DDTREE``.

What: ``handle_ddtree`` (called by ``SpeculativeAlgorithm.handle_server_args`` for
DDTREE only; diff 0001 of ``spec_info.py``) checks the DDTree flags, runs the DFlash
handler for the drafter (``SpeculativeAlgorithm.DFLASH.handle_server_args``, the
public entry point; no private name of ``speculative_hook.py``), and resolves

- ``--speculative-ddtree-budget`` (default 15) and ``--speculative-ddtree-topk-cap``
  (default min(8, budget)), the verify width ``speculative_num_draft_tokens =
  budget + 1`` and the drafter's ``speculative_dflash_block_size``;
- ``--speculative-ddtree-state-forking {on,off}`` (default on): tree-aware
  recurrent state forking on hybrid targets (``ddtree_state_fork.py``);
- ``--speculative-ddtree-topk {fused,torch}`` (default fused): the per-depth top-k
  through the fused kernel (``fused_depth_topk.py``) or the batched torch path.
- ``--speculative-ddtree-tree-conv {parents,upstream}`` (default parents; diff 0004):
  the GDN verify's tree conv from DDTree's parents (``ddtree_tree_conv.py``) or
  0.5.23's, which rebuilds them from the links (same outputs; a side-by-side switch).
- ``--speculative-ddtree-budget-schedule 1:64,4:32,8:15`` (diff 0005; default none): the
  budget per running batch size (``ddtree_schedule.py``); ``--speculative-ddtree-budget``
  defaults to, and must equal, its largest budget, and the top-k cap is at most its smallest.

The switches stay None for every other algorithm, which is what the upstream
files test before they enter any DDTree code.

Why a new file: the checks are new logic; keeping them here leaves
``speculative_hook.py`` unpatched (the series edits upstream files only where it
must).

New file of the sgdeploy patch series (feature ``ddtree``), not in SGLang 0.5.23.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sglang.srt.arg_groups.overrides import (
    attention_backends_of,
    declare_resolution,
    resolved_view,
    resolving_view,
)

if TYPE_CHECKING:
    from sglang.srt.server_args import ServerArgs

# DDTREE verifies its tree through the EAGLE tree-verify attention path (custom
# ancestor mask); these target backends implement it. The accepted path is
# compacted token by token, which needs page_size == 1.
DDTREE_TARGET_ATTENTION_BACKENDS = ("flashinfer", "triton", "fa3")
DDTREE_DEFAULT_BUDGET = 15
DDTREE_DEFAULT_TOPK_CAP = 8
STATE_FORKING_CHOICES = ("on", "off")
TOPK_CHOICES = ("fused", "torch")
TREE_CONV_CHOICES = ("parents", "upstream")  # diff 0004


def _choice(flag: str, value, choices: tuple, default: str) -> str:
    if value is None:
        return default
    value = str(value).lower()
    if value not in choices:
        raise ValueError(f"{flag} must be one of {', '.join(choices)}, got {value!r}.")
    return value


def handle_ddtree(server_args: ServerArgs) -> None:
    """DDTREE = DFLASH drafting + a best-first draft tree (docs: ddtree_tree.py)."""
    cfg = resolving_view(server_args)
    budget = cfg.speculative_ddtree_budget
    # diff 0005: a budget per batch size (ddtree_schedule.py); the buffers take the largest.
    schedule = getattr(cfg, "speculative_ddtree_budget_schedule", None)
    entries = None
    if schedule is not None:
        from sglang.srt.speculative.ddtree_schedule import parse as parse_schedule

        entries = parse_schedule(schedule)
        largest = max(b for _, b in entries)
        if budget is not None and int(budget) != largest:
            raise ValueError(
                f"--speculative-ddtree-budget ({budget}) must equal the largest budget of "
                f"--speculative-ddtree-budget-schedule ({largest}): buffers and graphs are sized for it."
            )
        budget = largest
    budget = DDTREE_DEFAULT_BUDGET if budget is None else int(budget)
    if budget < 1:
        raise ValueError(f"--speculative-ddtree-budget must be >= 1, got {budget}.")
    smallest = budget if entries is None else min(b for _, b in entries)
    cap = cfg.speculative_ddtree_topk_cap
    cap = min(DDTREE_DEFAULT_TOPK_CAP, smallest) if cap is None else int(cap)
    if cap < 1:
        raise ValueError(f"--speculative-ddtree-topk-cap must be >= 1, got {cap}.")
    if cap > smallest:
        raise ValueError(
            f"--speculative-ddtree-topk-cap ({cap}) must not exceed "
            + (
                f"--speculative-ddtree-budget ({budget})."
                if entries is None
                else f"the smallest budget of --speculative-ddtree-budget-schedule ({smallest})."
            )
        )
    if cap > 254 or budget > 1024:
        raise ValueError("DDTREE supports --speculative-ddtree-topk-cap <= 254 and budget <= 1024.")
    forking = _choice(
        "--speculative-ddtree-state-forking", cfg.speculative_ddtree_state_forking, STATE_FORKING_CHOICES, "on"
    )
    topk = _choice("--speculative-ddtree-topk", cfg.speculative_ddtree_topk, TOPK_CHOICES, "fused")
    tree_conv = _choice(
        "--speculative-ddtree-tree-conv", cfg.speculative_ddtree_tree_conv, TREE_CONV_CHOICES, "parents"
    )
    if cfg.enable_linear_replayssm_spec:
        raise ValueError(
            "--speculative-algorithm DDTREE does not support --enable-linear-replayssm-spec "
            "(ReplaySSM verify is chain-only; a draft tree needs per-node forked states)."
        )
    if cfg.speculative_num_steps is not None and int(cfg.speculative_num_steps) != 1:
        raise ValueError("DDTREE drafts one block per step; do not set --speculative-num-steps.")
    if cfg.speculative_eagle_topk is not None and int(cfg.speculative_eagle_topk) != 1:
        raise ValueError(
            "DDTREE takes its tree width from --speculative-ddtree-topk-cap, "
            "not --speculative-eagle-topk."
        )
    if cfg.speculative_use_block_verification:
        raise ValueError("--speculative-use-block-verification is chain-only; DDTREE does not support it.")
    if cfg.speculative_adaptive:
        raise ValueError("--speculative-adaptive does not support DDTREE.")
    view = resolved_view(server_args)
    page_size = view.page_size
    if page_size is not None and int(page_size) != 1:
        raise ValueError(f"DDTREE supports --page-size 1 only, got {page_size}.")
    for backend in attention_backends_of(view):
        if backend is not None and backend not in DDTREE_TARGET_ATTENTION_BACKENDS:
            raise ValueError(
                f"DDTREE verifies a tree mask, which attention backend {backend!r} does not "
                f"implement; use one of {DDTREE_TARGET_ATTENTION_BACKENDS}."
            )
    # The verify width is budget + 1 while the drafter keeps its block size: the
    # DFlash handler resolves the block size into speculative_num_draft_tokens,
    # which is then recorded as speculative_dflash_block_size and replaced.
    if cfg.speculative_num_draft_tokens is not None:
        if int(cfg.speculative_num_draft_tokens) != budget + 1 or cfg.speculative_dflash_block_size is None:
            raise ValueError(
                "DDTREE sets --speculative-num-draft-tokens to budget + 1; set "
                "--speculative-ddtree-budget and --speculative-dflash-block-size instead."
            )
        declare_resolution(
            server_args, "handle_ddtree", speculative_num_draft_tokens=int(cfg.speculative_dflash_block_size)
        )
    # Upstream's DFLASH resolution, through its public entry point (the enum's handle_server_args, which
    # dispatches DFLASH to speculative_hook's private _handle_dflash): imported here, as spec_info imports
    # this module inside DDTREE's branch.
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    SpeculativeAlgorithm.DFLASH.handle_server_args(server_args)
    block_size = int(cfg.speculative_num_draft_tokens)
    depth_count = block_size - 1
    if depth_count < 1:
        raise ValueError(f"DDTREE needs a drafter block size >= 2, got {block_size}.")
    capacity = sum(cap**d for d in range(1, depth_count + 1))
    if budget > capacity:
        raise ValueError(
            f"--speculative-ddtree-budget {budget} exceeds the {capacity} distinct nodes that "
            f"{depth_count} depths x top-k cap {cap} can hold."
        )
    declare_resolution(
        server_args,
        "handle_ddtree",
        speculative_dflash_block_size=block_size,
        speculative_num_draft_tokens=budget + 1,
        speculative_ddtree_budget=budget,
        speculative_ddtree_topk_cap=cap,
        speculative_ddtree_state_forking=forking,
        speculative_ddtree_topk=topk,
        speculative_ddtree_tree_conv=tree_conv,
    )
    if entries is not None:
        from sglang.srt.speculative.ddtree_schedule import normalise

        declare_resolution(server_args, "handle_ddtree", speculative_ddtree_budget_schedule=normalise(entries))
