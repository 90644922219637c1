"""DDTREE decode step: DFlash draft block -> per-depth top-k -> tree -> EAGLE tree verify.

Kept out of ``dflash_worker_v2.py`` (patches 0002 edits that file). The draft half
follows ``DFlashWorkerV2.forward_batch_generation``'s plain path (no selector,
LiLiCorr, Domino or compact draft cache: ``check_supported`` refuses those); the
verify half is ``eagle_worker_common.run_eagle_verify`` on a ``DDTreeVerifyInput``.

KV windows per request (the scheduler reserves 2 x speculative_num_draft_tokens =
2 (budget + 1) slots past the committed length, ``DFlashDraftInputV2.prepare_for_decode``):
the draft block writes ``block_size`` slots from ``prefix``; the target verify writes
``budget + 1``. After verify, ``run_eagle_verify(finalize_tree_path=True)`` moves the
accepted path's target KV, tokens and hidden states to the front of the verify window,
so the committed tokens are the chain ``prefix .. prefix + accept_len - 1`` and the
DFlash draft-KV append runs unchanged on them.

Host reads: none. Both the draft block and the tree's FULL_MASK custom mask are sized
from host lengths only (``host_prefix_lens``): the scheduler's ``seq_lens_cpu`` when the
batch carries it (exact), else the draft input's reserved KV lengths (an upper bound:
the mask is then longer than needed, as EAGLE's preallocated mask buffer is). The
batch's ``seq_lens_sum`` is not used: the scheduler may leave it None, and
``flatten_tree_mask`` would then read the sum from the device (a sync per step).

New file of the sgdeploy patch series (feature ``ddtree``; imported by ``ddtree_worker.py`` only; not in SGLang
0.5.23), laid over the pristine wheel at this path by the build.
"""

from __future__ import annotations

import contextlib
import logging

import torch
from sglang.srt.speculative import ddtree_graphs

logger = logging.getLogger(__name__)

# run_eagle_verify only distinguishes topk == 1 (chain bookkeeping) from topk > 1 (tree:
# compaction of the accepted path). A DDTree verify is always a tree.
_TREE_TOPK = 2


def check_supported(worker, spec) -> None:
    """Refuse configurations whose decode the DDTree step does not implement."""
    problems = []
    if getattr(worker, "selector", None) is not None:
        problems.append("a DFlash candidate selector")
    if getattr(worker, "lilicorr", None) is not None:
        problems.append("a LiLiCorr head")
    if getattr(worker, "_is_domino", False):
        problems.append("a Domino drafter")
    if getattr(worker, "use_compact_draft_cache", False):
        problems.append("a sliding-window (compact) draft cache")
    if getattr(spec, "speculative_use_rejection_sampling", False):
        problems.append("--speculative-use-rejection-sampling (chain-only sampler)")
    for name in ("speculative_accept_threshold_single", "speculative_accept_threshold_acc"):
        value = getattr(spec, name, 1.0)
        if value is not None and float(value) != 1.0:
            problems.append(f"--{name.replace('_', '-')}={value} (lossless needs 1.0)")
    block = int(worker.block_size)
    width = int(worker.ddtree_budget) + 1
    if block > 2 * width:
        problems.append(
            f"draft block size {block} > 2 x verify width {width} (the scheduler reserves "
            "2 x (budget + 1) KV slots per decode step); raise --speculative-ddtree-budget"
        )
    if problems:
        raise ValueError("DDTREE decode does not support " + "; ".join(problems) + ".")


def host_prefix_lens(batch, draft_input) -> tuple[torch.Tensor, int, bool]:
    """Host lengths of the committed prefixes, never read from the device: ``(lens, total,
    exact)``. ``exact``: the scheduler's ``batch.seq_lens_cpu`` and its sum. Without it (the
    GPU-only overlap path) the draft input's ``nxt_kv_lens_cpu`` (the KV reserved past each
    prefix, >= prefix + 2 x verify width) and its host sum: an upper bound, never less."""
    if batch.seq_lens_cpu is not None:
        return batch.seq_lens_cpu, int(batch.seq_lens_cpu.sum()), True
    return draft_input.nxt_kv_lens_cpu, int(draft_input.nxt_kv_lens_sum), False


def _draft_block_hidden(worker, batch, draft_input, bs: int):
    """Run the DFlash drafter over [bonus, mask x (block-1)]; return its hidden states
    [bs, block, H] (DFlash's plain-path preparation, unchanged)."""
    from sglang.kernels.ops.speculative.dflash import _prepare_dflash_draft_block_unchecked
    from sglang.srt.lora.layers import unwrap_lora_layer
    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardBatch,
        ForwardMode,
        enable_num_token_non_padded,
    )
    from sglang.srt.speculative.dflash_worker_v2 import _resolve_dflash_embedding_module
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_utils import draft_tp_context

    block_size = int(worker.block_size)
    device = worker.device
    target_model = worker.target_worker.model_runner.model
    embed_module = unwrap_lora_layer(_resolve_dflash_embedding_module(worker.draft_model, target_model))
    worker._ensure_draft_block_buffers(bs)
    block_ids = worker._draft_block_ids_buf[:bs]
    positions_2d = worker._draft_block_positions_buf[:bs]
    block_loc_2d = worker._draft_verify_out_cache_loc_buf[:bs]
    prefix_lens = batch.seq_lens
    req_to_token = worker.model_runner.req_to_token_pool.req_to_token
    _prepare_dflash_draft_block_unchecked(
        bonus_tokens=draft_input.bonus_tokens.view(-1),
        prefix_lens=prefix_lens.view(-1),
        req_pool_indices=batch.req_pool_indices.view(-1),
        req_to_token=req_to_token,
        block_ids_out=block_ids,
        positions_out=positions_2d,
        cache_loc_out=block_loc_2d,
        mask_token_id=int(worker._mask_token_id),
    )
    if worker._full_embed_gpu is not None:
        noise = torch.nn.functional.embedding(block_ids, worker._full_embed_gpu)
    else:
        noise = embed_module(block_ids)
    if worker._noise_embed_scale != 1.0:
        noise = noise * worker._noise_embed_scale
    host_lens, host_sum, exact = host_prefix_lens(batch, draft_input)
    block_plan = worker.target_worker.model_runner.kv_index_translator.plan(
        req_pool_indices=batch.req_pool_indices,
        seq_lens=prefix_lens,
        seq_lens_cpu=host_lens,
        write_virtual=block_loc_2d.reshape(-1),
        read_extent=block_size,
    )
    seq_lens_cpu = worker._draft_seq_lens_cpu_buf[:bs]
    seq_lens_cpu.copy_(host_lens)
    if exact:
        seq_lens_cpu.add_(block_size)
        seq_lens_sum = host_sum + bs * block_size
    else:  # the reserved lengths already cover the block
        seq_lens_sum = host_sum
    forward_batch = ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY,
        batch_size=bs,
        input_ids=block_ids.flatten(),
        req_pool_indices=batch.req_pool_indices,
        seq_lens=prefix_lens,
        out_cache_loc=block_loc_2d.reshape(-1),
        seq_lens_sum=seq_lens_sum,
        seq_lens_cpu=seq_lens_cpu,
        positions=positions_2d.reshape(-1),
        input_embeds=noise.view(-1, noise.shape[-1]),
        spec_algorithm=SpeculativeAlgorithm.DFLASH,
        spec_info=worker._draft_block_spec_info,
        capture_hidden_mode=CaptureHiddenMode.NULL,
        num_token_non_padded=(
            torch.full((), bs * block_size, dtype=torch.int32, device=device)
            if enable_num_token_non_padded()
            else None
        ),
        global_num_token_non_padded_cpu=bs * block_size,
        can_run_decode_cuda_graph=batch.can_run_decode_cuda_graph,
    )
    block_plan.bind(forward_batch, worker.draft_model_runner.kv_index_translator)
    with torch.inference_mode(), draft_tp_context(worker.draft_parallel_layout):
        draft_out = worker.draft_model_runner.forward(forward_batch)
    hidden = draft_out.logits_output.hidden_states
    if hidden is None:
        raise RuntimeError(
            "DDTREE needs the drafter's hidden states; the draft runner returned none "
            "(an in-graph draft sampler consumes them: run DDTREE without it)."
        )
    return hidden.view(bs, block_size, -1), block_ids


def forward_decode(worker, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
    from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
    from sglang.srt.lora.layers import unwrap_lora_layer
    from sglang.srt.managers.scheduler import GenerationBatchResult
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
    from sglang.srt.speculative.eagle_worker_common import run_eagle_verify

    if batch.spec_info is None:
        batch.spec_info = DFlashDraftInputV2.create_idle_input(device=worker.device)
    draft_input = batch.spec_info
    if not isinstance(draft_input, DFlashDraftInputV2):
        raise RuntimeError("DDTREE expected DFlashDraftInputV2 state on the running batch.")
    batch.seq_lens.record_stream(torch.get_device_module(worker.device).current_stream())

    bs = len(batch.seq_lens)
    # The step's budget: the fixed one, or the schedule's for this batch size (diff 0005; host only).
    budget = int(worker.step_budget(bs))
    width = budget + 1
    prefix_lens = batch.seq_lens

    # 1) Draft block; 2) per-depth top-k; 3) tree; 4) verify input.
    host_lens, host_sum, _ = host_prefix_lens(batch, draft_input)
    draft_hidden, block_ids = _draft_block_hidden(worker, batch, draft_input, bs)
    lm_head = unwrap_lora_layer(getattr(worker.target_worker.model_runner.model, "lm_head", None))
    parallel = get_parallel()
    tp_group = parallel.tp_group if parallel.tp_size > 1 else None
    # The verify runs on the attention backend of the graphs captured at this step's width (diff 0005,
    # ddtree_graphs.step_backend; unchanged without a schedule's per-width graphs).
    with ddtree_graphs.step_backend(worker.target_worker.model_runner, width) as attn_backend:
        verify_mask = getattr(attn_backend, "verify_mask", None)
        full_mask = verify_mask is None or getattr(verify_mask.mode, "name", "") == "FULL_MASK"
        verify_input = worker.build_verify_input(
            draft_hidden=draft_hidden[:, 1:, :],
            lm_head=lm_head,
            root_tokens=block_ids[:, 0],
            seq_lens=prefix_lens,
            full_mask=full_mask,
            capture_hidden_mode=CaptureHiddenMode.FULL,
            tp_group=tp_group,
            seq_lens_sum=host_sum,  # host: the FULL_MASK size needs no device read
            budget=budget,
        )
        # Verify window: budget + 1 slots from the committed length (reserved by the
        # scheduler), and its plan for the target/draft id translation.
        verify_loc = assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices,
            req_to_token=worker.model_runner.req_to_token_pool.req_to_token,
            start_offset=prefix_lens,
            end_offset=prefix_lens + width,
            batch_size=bs,
            draft_token_num=width,
            device=worker.device,
        )
        verify_plan = worker.target_worker.model_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices,
            seq_lens=prefix_lens,
            seq_lens_cpu=host_lens,
            write_virtual=verify_loc,
            read_extent=width,
        )
        verify_input.prepared_out_cache_loc = verify_loc
        verify_input.kv_loc_plan = verify_plan

        # 5) Target verify, sampling, tree-aware mamba commit, accepted-path compaction.
        batch.spec_info = verify_input
        target_mr = worker.target_worker.model_runner
        result = run_eagle_verify(
            batch,
            target_worker=worker.target_worker,
            req_to_token_pool=target_mr.req_to_token_pool,
            token_to_kv_pool_allocator=target_mr.token_to_kv_pool_allocator,
            plan_stream=None,
            plan_stream_ctx=contextlib.nullcontext(),
            topk=_TREE_TOPK,
            num_draft_tokens=width,
            device=worker.device,
            metadata_ready_pre_pad=False,
            finalize_tree_path=True,
            pp_proxy_tensors=pp_proxy_tensors,
            grammar_barrier=grammar_barrier,
        )
        # As in DFlash, the running batch keeps its draft input; the scheduler takes the
        # next one from the result.
        batch.spec_info = draft_input
    accept_lens = result.accept_lens  # accepted nodes incl. the root = committed tokens
    verify_input.set_accepted_nodes(result.accept_index, accept_lens)
    new_seq_lens = prefix_lens + accept_lens.to(prefix_lens.dtype)
    if on_publish is not None:
        on_publish(new_seq_lens)

    # 6) Accepted path (now at the front of the window) into the draft KV.
    logits_output = result.logits_output
    hidden = logits_output.hidden_states
    if hidden is None:
        raise RuntimeError("DDTREE verify requires target hidden states, but got None.")
    hidden = hidden[: bs * width]
    cache_loc = worker._draft_write_ids(verify_plan)
    positions = (prefix_lens.to(torch.int64)[:, None] + torch.arange(width, device=worker.device)).reshape(-1)
    worker._append_target_hidden_to_draft_kv_by_loc(
        target_hidden=hidden.reshape(-1, hidden.shape[-1]),
        cache_loc=cache_loc,
        cache_loc_2d=cache_loc.view(bs, width),
        positions=positions,
        commit_lens=accept_lens,
    )
    logits_output.hidden_states = None

    bonus = result.next_draft_input.bonus_tokens.to(torch.int64)
    next_draft_input = worker._make_next_draft_input_decode(bonus_tokens=bonus, new_seq_lens=new_seq_lens)
    return GenerationBatchResult(
        logits_output=logits_output,
        next_token_ids=result.next_token_ids,  # compacted: accepted path first per request
        accept_lens=accept_lens,
        can_run_cuda_graph=result.can_run_cuda_graph,
        next_draft_input=next_draft_input,
        speculative_num_draft_tokens=width,
        new_seq_lens=new_seq_lens,
        routed_experts_output=result.routed_experts_output,
        indexer_topk_output=result.indexer_topk_output,
        extra_keep_alive_refs=result.extra_keep_alive_refs,
    )
