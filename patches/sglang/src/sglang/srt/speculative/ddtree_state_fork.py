"""DDTree tree-aware recurrent state forking (deployment patch 0002).

What: when a DDTree draft tree is verified on a hybrid target (GDN / Mamba recurrent
layers next to attention), every tree node's recurrent state and conv window must
derive from its *parent* node, and the state committed after verification must be
the accepted node's. The 0.5.23 kernels already fork (they were written for EAGLE
top-k > 1): given first-child / next-sibling links, the conv kernel rebuilds the
parent of every node and the recurrent kernels reload the parent's intermediate
state before each step. This module holds the small pieces that route DDTree verify
inputs onto that path:

- ``is_ddtree_verify``: is this spec info a DDTree verify (decided per forward from
  the spec info, not from the global ``speculative_eagle_topk``);
- ``ddtree_commit_step_indices`` / ``ddtree_track_step_indices``: tree-aware step
  indices for the post-verify commit (the accepted node, and the node on the
  accepted path where a mamba-track interval is crossed);
- ``ddtree_forking_enabled``: the server-level switch (DDTREE and
  ``--speculative-ddtree-state-forking on``, the default);
- ``hybrid_forking``: what the hybrid backend asks once at start-up; it logs why
  forking off is lossy on a hybrid target.
  ReplaySSM spec verify is rejected with DDTree by ``ddtree_hook.handle_ddtree``.

The upstream files (``hybrid_linear_attn_backend.py``, ``kda_backend.py``,
``memory_pool.py``, ``dflash_worker_v2.py``; diff 0002) test the resolved flag
``speculative_ddtree_state_forking`` themselves and import this module only when it
is set, which ``handle_ddtree`` does for DDTREE only: AR and DFLASH servers never
enter it.

Why: without forking, sibling nodes share one running state (the flat-chain verify
path); on Qwen3.6-27B that collapsed DDTree acceptance from about 15 to about 4
tokens per step at budgets 32 and 64.

Upstream: not in SGLang 0.5.23. New file of the sgdeploy patch series (feature
``fork``), laid over the pristine wheel at this path by the build. Only torch is
imported at module level, so the pieces can be tested without the server.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch

logger = logging.getLogger(__name__)

DDTREE_ALGORITHM = "DDTREE"
FORKING_OFF_WARNING = (
    "DDTREE with --speculative-ddtree-state-forking off on a hybrid (recurrent) target "
    "is lossy: sibling tree nodes share one recurrent state, so every node after the "
    "first branch is verified against a state that includes tokens not on its path, "
    "and acceptance collapses once the budget exceeds the block size - 1 (about 15 -> 4 "
    "tokens per step on Qwen3.6-27B at budgets 32/64). Turn it on unless you are "
    "reproducing that collapse."
)


def is_ddtree_verify(spec_info: Any) -> bool:
    """True when ``spec_info`` is the verify input of a DDTree step.

    0001's ``DDTreeVerifyInput`` carries ``is_ddtree = True``; a spec input type
    named ``DDTREE_VERIFY`` is accepted too. Its links may be None (dummy runs): the
    backend then leaves the captured link buffers as they are, as for EAGLE.
    """
    if spec_info is None:
        return False
    if getattr(spec_info, "is_ddtree", False):
        return True
    kind = getattr(spec_info, "spec_input_type", None)
    return getattr(kind, "name", None) == "DDTREE_VERIFY"


def ddtree_forking_enabled(
    algorithm: Optional[str] = None, state_forking: Optional[str] = "on"
) -> bool:
    """Server-level: DDTree is the algorithm and its state forking is on.

    Without ``algorithm`` both come from the runtime context (the speculative
    algorithm and ``--speculative-ddtree-state-forking``, resolved to ``on`` by
    default); with no runtime context (tests, tools) the answer is False.
    """
    if algorithm is None:
        try:
            from sglang.srt.runtime_context import get_spec

            spec = get_spec()
            algorithm = spec.speculative_algorithm
            state_forking = getattr(spec, "speculative_ddtree_state_forking", None) or "on"
        except Exception:  # no runtime context (tests, tools)
            return False
    name = getattr(algorithm, "name", algorithm)
    if name is None or str(name).upper() != DDTREE_ALGORITHM:
        return False
    return str(state_forking).lower() == "on"


def hybrid_forking(is_draft_worker: bool, algorithm: Optional[str] = None,
                   state_forking: Optional[str] = None) -> bool:
    """Asked once by a hybrid (recurrent) attention backend under DDTREE: fork or not.

    Logs ``FORKING_OFF_WARNING`` for the target model when forking is off.
    """
    if algorithm is None:
        try:
            from sglang.srt.runtime_context import get_spec

            spec = get_spec()
            algorithm = spec.speculative_algorithm
            state_forking = getattr(spec, "speculative_ddtree_state_forking", None)
        except Exception:  # no runtime context (tests, tools)
            return False
    on = ddtree_forking_enabled(algorithm, state_forking or "on")
    if not on and not is_draft_worker and ddtree_forking_enabled(algorithm, "on"):
        logger.warning(FORKING_OFF_WARNING)
    return on


def ddtree_commit_step_indices(accepted_node_index: torch.Tensor) -> torch.Tensor:
    """Intermediate-state step to commit per request: its last accepted node.

    DDTree verify writes node i's state at step i (verify coordinates, root 0), so
    the committed step is the accepted node's index, not ``commit_lens - 1``.
    """
    return accepted_node_index.to(torch.int64)


def _ancestor_at(
    parents: torch.Tensor, nodes: torch.Tensor, steps_up: torch.Tensor
) -> torch.Tensor:
    """``steps_up``-th ancestor of ``nodes`` per row by pointer doubling.

    ``parents``: [bs, T] (root -1); ``nodes``, ``steps_up``: [bs]. No host sync;
    ceil(log2 T) gathers.
    """
    par = parents.to(torch.int64).clamp(min=0)
    cur = nodes.to(torch.int64).clone()
    left = steps_up.to(torch.int64).clamp(min=0)
    jump = par
    for bit in range(max(int(parents.shape[1]) - 1, 1).bit_length()):
        take = ((left >> bit) & 1).bool()
        cur = torch.where(take, jump.gather(1, cur[:, None]).squeeze(1), cur)
        jump = jump.gather(1, jump)
    return cur


def ddtree_track_step_indices(
    *,
    retrieve_parent_token: torch.Tensor,
    accepted_node_index: torch.Tensor,
    commit_lens: torch.Tensor,
    seq_lens_pre_verify: torch.Tensor,
    seq_lens_post_verify: torch.Tensor,
    mamba_track_interval: int,
) -> torch.Tensor:
    """Tree-aware mamba-track step per request (-1: no interval crossed).

    Same rule as the chain commit (track the state after the token that ends on the
    interval boundary), except that the i-th accepted token is the node at depth i on
    the accepted path, found by walking up from the accepted node. ``commit_lens``
    counts the accepted verify positions including the root, so the accepted node
    sits at depth ``commit_lens - 1``.
    """
    to_track_mask = (
        seq_lens_pre_verify // mamba_track_interval
        != seq_lens_post_verify // mamba_track_interval
    )
    tracking_point = seq_lens_post_verify // mamba_track_interval * mamba_track_interval
    to_track_ith = torch.clamp(tracking_point - seq_lens_pre_verify - 1, min=0)
    commit = commit_lens.to(to_track_ith.dtype)
    can_track = to_track_mask & (to_track_ith < commit)
    # The accepted node is at depth commit_lens - 1 (root = depth 0).
    steps_up = (commit - 1 - to_track_ith).clamp(min=0)
    node = _ancestor_at(retrieve_parent_token, accepted_node_index, steps_up)
    return torch.where(can_track, node, torch.full_like(node, -1))


def commit_tree_steps(
    batch: Any,
    verify_input: Any,
    seq_lens_pre_verify: torch.Tensor,
    seq_lens_post_verify: torch.Tensor,
    commit_lens: torch.Tensor,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(step to commit, mamba-track step or None) per request after a DDTree verify.

    Called by ``DFlashWorkerV2._update_target_mamba_state_after_verify`` (diff 0002)
    only for a DDTree verify input with state forking on; the chain rule stays there.
    """
    steps = ddtree_commit_step_indices(verify_input.accepted_node_index)
    if batch.mamba_track_indices is None:
        return steps, None
    from sglang.srt.runtime_context import mamba_track_grid

    track = ddtree_track_step_indices(
        retrieve_parent_token=verify_input.retrieve_parent_token,
        accepted_node_index=verify_input.accepted_node_index,
        commit_lens=commit_lens,
        seq_lens_pre_verify=seq_lens_pre_verify,
        seq_lens_post_verify=seq_lens_post_verify,
        mamba_track_interval=mamba_track_grid(batch.tree_cache.page_size),
    )
    return steps, track
