"""DDTree verify input: a draft tree riding the EAGLE tree-verify path.

The tree comes from ``ddtree_tree.build_ddtree`` (one verify step, all requests).
Verification reuses the EAGLE tree path (``eagle_sample``: greedy tree walk or
tree speculative sampling, both lossless) with ``tree_topk == -1`` (irregular
tree) and ``max_tree_depth == D + 1``. Tree metadata lives on this object, per
request, never behind the global ``speculative_eagle_topk``.

Attribute contract (used by patch 0002, state forking, and 0003):
- ``retrieve_next_token`` [bs, T] int64: first child of each verify index, -1 = none
- ``retrieve_next_sibling`` [bs, T] int64: next sibling, -1 = none
- ``retrieve_parent_token`` [bs, T] int64: parent verify index, root = -1
- ``accepted_node_index`` [bs] int64: verify index of the last accepted node
  (0 = only the root), set by ``set_accepted_nodes`` after sampling
- ``tree_mask`` [bs, T, T] bool: ancestor-or-self mask, ``is_ddtree`` True
T = budget + 1; verify index 0 is the root (last committed token), node i is i + 1,
and parents precede children.

New file of the sgdeploy patch series (feature ``ddtree``; built by ``ddtree_worker.py`` only; not in SGLang
0.5.23), laid over the pristine wheel at this path by the build.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from sglang.srt.speculative.ddtree_accept import accepted_node_index
from sglang.srt.speculative.ddtree_tree import DDTreeLayout
from sglang.srt.speculative.eagle_info import EagleVerifyInput


def flatten_tree_mask(
    tree_mask: torch.Tensor,
    seq_lens: torch.Tensor,
    full_mask: bool,
    seq_lens_sum: Optional[int] = None,
) -> torch.Tensor:
    """EAGLE custom-mask layout from a [bs, T, T] ancestor mask.

    ``full_mask``: per request a [T, prefix + T] block (prefix all True), flattened and
    concatenated (TreeMaskMode.FULL_MASK); else [T, T] blocks (QLEN_ONLY). The
    FULL_MASK form needs the total size on the host: ``seq_lens_sum``, the host sum
    of ``seq_lens`` or an upper bound of it (``ddtree_decode.host_prefix_lens``; the
    mask is then longer, its tail True and never read: the verify kernels index it
    through ``mask_indptr`` from its start), gives it without a device read; without
    it the sum is read from ``seq_lens`` (a sync when they live on the GPU).
    """
    bs, t, _ = tree_mask.shape
    if not full_mask:
        return tree_mask.reshape(-1).contiguous()
    seq_lens = seq_lens.to(torch.int64)
    widths = seq_lens + t  # [bs]
    sizes = widths * t
    starts = torch.cumsum(sizes, 0) - sizes
    if seq_lens_sum is not None:
        total = (int(seq_lens_sum) + bs * t) * t
    else:
        total = int(sizes.sum())
    out = torch.ones(total, dtype=torch.bool, device=tree_mask.device)
    rows = torch.arange(t, device=tree_mask.device)
    cols = torch.arange(t, device=tree_mask.device)
    req = torch.arange(bs, device=tree_mask.device)
    idx = (
        starts.to(tree_mask.device)[req, None, None]
        + rows[None, :, None] * widths.to(tree_mask.device)[:, None, None]
        + seq_lens.to(tree_mask.device)[:, None, None]
        + cols[None, None, :]
    )
    out[idx.reshape(-1)] = tree_mask.reshape(-1)
    return out


@dataclass
class DDTreeVerifyInput(EagleVerifyInput):
    retrieve_parent_token: Optional[torch.Tensor] = None
    accepted_node_index: Optional[torch.Tensor] = None
    tree_mask: Optional[torch.Tensor] = None
    tree_depth: int = 1  # D, the drafter's block size - 1
    is_ddtree: bool = True

    @property
    def max_tree_depth(self) -> int:
        return self.tree_depth + 1

    @property
    def tree_topk(self) -> int:
        return -1

    @classmethod
    def from_layout(
        cls,
        layout: DDTreeLayout,
        *,
        seq_lens: torch.Tensor,
        tree_depth: int,
        topk_cap: int,
        full_mask: bool,
        capture_hidden_mode,
        draft_probs: Optional[torch.Tensor] = None,
        seq_lens_sum: Optional[int] = None,
    ) -> "DDTreeVerifyInput":
        bs, t = layout.verify_tokens.shape
        device = layout.verify_tokens.device
        retrieve_index = torch.arange(bs * t, device=device, dtype=torch.int64).view(bs, t)
        return cls(
            draft_token=layout.verify_tokens.reshape(-1),
            custom_mask=flatten_tree_mask(layout.tree_mask, seq_lens, full_mask, seq_lens_sum),
            positions=layout.positions.reshape(-1),
            retrieve_index=retrieve_index,
            retrieve_next_token=layout.retrieve_next_token,
            retrieve_next_sibling=layout.retrieve_next_sibling,
            retrieve_cum_len=None,
            spec_steps=tree_depth,
            topk=topk_cap,
            draft_token_num=t,
            capture_hidden_mode=capture_hidden_mode,
            seq_lens_sum=None,
            seq_lens_cpu=None,
            draft_probs=draft_probs,
            retrieve_parent_token=layout.retrieve_parent_token,
            tree_mask=layout.tree_mask,
            tree_depth=tree_depth,
        )

    def set_accepted_nodes(self, accept_index: torch.Tensor, accept_lens: torch.Tensor) -> torch.Tensor:
        """From EAGLE's ``accept_index`` [bs, D+1] (global node ids, -1 padded) and
        ``accept_lens`` [bs] (accepted nodes incl. the root): the verify index of each
        request's last accepted node. Device ops only."""
        self.accepted_node_index = accepted_node_index(accept_index, accept_lens, self.draft_token_num)
        return self.accepted_node_index
