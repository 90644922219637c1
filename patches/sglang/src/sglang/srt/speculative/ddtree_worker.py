"""DDTREE worker: DFlash drafting, a best-first draft tree, EAGLE tree verify.

Per decode step (all device ops, no host synchronisation in the tree part):
1. the DFlash drafter runs its block as usual (``DFlashWorkerV2``);
2. ``depth_topk_logprobs`` projects the D = block_size - 1 draft hidden states
   of every request through the target lm_head once ([bs * D, H] rows) and
   returns per-depth top-K log-probabilities (TP: only K values + LSE gathered);
3. ``build_ddtree`` selects the ``budget`` best paths and writes mask, links,
   positions and verify tokens;
4. ``DDTreeVerifyInput`` carries that tree through the EAGLE tree-verify path.

5. ``run_eagle_verify`` (the EAGLE V2 verify body): target TARGET_VERIFY forward
   with the tree's custom mask, ``eagle_sample`` (greedy tree walk, or
   ``tree_speculative_sampling_target_only``: lossless tree sampling), the
   tree-aware mamba commit (accepted node = step), and the compaction of the
   accepted path's KV slots, tokens and hidden states to the front of each
   request's verify window (``finalize_tree_path``);
6. commit: ``set_accepted_nodes``, the accepted path's target hidden states into
   the draft KV (positions prefix .. prefix + accept_len - 1, now contiguous),
   next draft input (bonus token, new lengths).

``ddtree_accept.py`` states the same acceptance rules in plain torch (tests).
Budget schedule (diff 0005, ``ddtree_schedule.py``): ``step_budget`` gives each decode step the
budget of its batch size; every width-dependent part of the step takes the step's width, and
``ddtree_graphs.install`` captures the target's verify graphs at every scheduled width.
CUDA graphs: the target's verify graphs are captured at the verify width budget + 1
with the tree's custom mask (0001's edit of ``decode_cuda_graph_runner.py``); the draft
runner's graphs at ``block_size`` tokens per request (0001's edit of
``spec_info.get_num_tokens_per_req_for_target_verify`` for the draft worker), and
``_maybe_build_draft_sampler`` folds no DFlash greedy head into them.
Not wired: the overlap plan stream (verify preparation runs on the forward
stream), and the DFlash variants (selector, LiLiCorr, Domino, compact draft cache)
are refused. The step ran inside a server on an H200 (tests/gpu/e2e/FINDINGS.md);
the graph fixes above were proven on the CPU only (tests/unit/test_ddtree_fixes.py).

New file of the sgdeploy patch series (not in SGLang 0.5.23); ``spec_info.py``'s
diff (patch 0001) returns this worker for ``--speculative-algorithm DDTREE`` only,
so AR and DFLASH servers never import it.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
from sglang.srt.runtime_context import get_spec
from sglang.srt.speculative import ddtree_decode
from sglang.srt.speculative.ddtree_info import DDTreeVerifyInput
from sglang.srt.speculative.ddtree_topk import depth_topk_logprobs
from sglang.srt.speculative.ddtree_tree import build_ddtree
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

logger = logging.getLogger(__name__)


class DDTreeWorker(DFlashWorkerV2):
    # diff 0005: the budget schedule (ddtree_schedule.BudgetSchedule), set by __init__ when one is given; None: the
    # fixed budget. A class default, so that a worker made without __init__ (tests) steps at its fixed budget.
    ddtree_schedule = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        spec = get_spec()
        self.ddtree_budget = int(spec.speculative_ddtree_budget)
        self.ddtree_topk_cap = int(spec.speculative_ddtree_topk_cap)
        self.ddtree_depth = int(self.block_size) - 1
        # --speculative-ddtree-topk (resolved by ddtree_hook.handle_ddtree): fused | torch.
        self.ddtree_fused_topk = (spec.speculative_ddtree_topk or "fused") == "fused"
        self.speculative_num_draft_tokens = self.ddtree_budget + 1
        # diff 0005: a budget per running batch size; ddtree_budget is then its largest (buffers, graphs).
        schedule = getattr(spec, "speculative_ddtree_budget_schedule", None)
        if schedule:
            from sglang.srt.speculative.ddtree_schedule import BudgetSchedule

            self.ddtree_schedule = BudgetSchedule.from_text(schedule)
        ddtree_decode.check_supported(self, spec)
        logger.info(
            "DDTREE: budget=%d schedule=%s topk_cap=%d depth=%d verify width=%d top-k=%s state forking=%s",
            self.ddtree_budget,
            self.ddtree_schedule or "none",
            self.ddtree_topk_cap,
            self.ddtree_depth,
            self.ddtree_budget + 1,
            "fused" if self.ddtree_fused_topk else "torch",
            spec.speculative_ddtree_state_forking or "on",
        )

    def init_cuda_graphs(self):
        """The drafter's graphs (``DFlashWorkerV2``), then the target's verify graphs at every other scheduled
        budget's width (``ddtree_graphs.install``). 0.5.23's scheduler (``init_all_cuda_graphs``) captures the
        target's graphs (``tp_worker.init_cuda_graphs``) before this, and after every worker is built: installed
        from ``__init__`` (as first written), the target had no graph runner yet, nothing was captured, and every
        step at a smaller budget verified eagerly (H100, 2026-12-05: ``cuda graph: False`` on each such step)."""
        super().init_cuda_graphs()
        if self.ddtree_schedule is not None:
            from sglang.srt.speculative import ddtree_graphs

            ddtree_graphs.install(
                self.target_worker.model_runner, self.ddtree_schedule.budgets, self.ddtree_budget
            )

    def step_budget(self, batch_size: int) -> int:
        """The tree budget of a decode step of ``batch_size`` requests (host only)."""
        if self.ddtree_schedule is None:
            return self.ddtree_budget
        return self.ddtree_schedule.budget_for(batch_size)

    def _maybe_build_draft_sampler(self):
        """No in-graph draft head under DDTREE (``DFlashWorkerV2.init_cuda_graphs`` folds the
        head it returns into the draft graph as a capture tail hook). DDTree builds its tree
        from the drafter's hidden states (``depth_topk_logprobs``), never from the head's
        greedy argmax, so the head would be wasted work in every step."""
        if self._target_tp_rank == 0:
            logger.info("DDTREE: no DFlash draft greedy head (the tree reads the draft hidden states).")
        return None

    def build_verify_input(
        self,
        *,
        draft_hidden: torch.Tensor,
        lm_head,
        root_tokens: torch.Tensor,
        seq_lens: torch.Tensor,
        full_mask: bool,
        capture_hidden_mode,
        tp_group=None,
        draft_probs: Optional[torch.Tensor] = None,
        seq_lens_sum: Optional[int] = None,
        budget: Optional[int] = None,
    ) -> DDTreeVerifyInput:
        """``draft_hidden`` [bs, D, H]: the drafter's hidden states at block positions 1..D."""
        bs, depth, hidden = draft_hidden.shape
        logprobs, ids = depth_topk_logprobs(
            draft_hidden.reshape(bs * depth, hidden), lm_head, self.ddtree_topk_cap, tp_group,
            fused=self.ddtree_fused_topk,
        )
        layout = build_ddtree(
            logprobs.view(bs, depth, -1),
            ids.view(bs, depth, -1),
            self.ddtree_budget if budget is None else int(budget),
            root_tokens=root_tokens,
            root_positions=seq_lens,
        )
        return DDTreeVerifyInput.from_layout(
            layout,
            seq_lens=seq_lens,
            tree_depth=depth,
            topk_cap=self.ddtree_topk_cap,
            full_mask=full_mask,
            capture_hidden_mode=capture_hidden_mode,
            draft_probs=draft_probs,
            seq_lens_sum=seq_lens_sum,
        )

    def forward_batch_generation(self, batch, *args, **kwargs):
        if (
            batch.forward_mode.is_extend()
            or batch.forward_mode.is_idle()
            or getattr(batch, "is_extend_in_batch", False)
        ):
            return super().forward_batch_generation(batch, *args, **kwargs)
        return ddtree_decode.forward_decode(self, batch, *args, **kwargs)
