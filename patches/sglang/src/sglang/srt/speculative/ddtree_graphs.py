"""Target verify CUDA graphs per budget for a DDTree budget schedule (patch 0005).

What: the target's decode graph runner (0.5.23's ``DecodeCudaGraphRunner``) captures one verify
width, ``--speculative-num-draft-tokens`` = the schedule's largest budget + 1, and replays only
batches of that width (its ``can_run_graph``: "the batch's actual per-request width must match this
runner's capture width; anything else falls back to eager"). ``install`` adds one more runner per
other budget of the schedule, each captured at that budget + 1 with an attention backend of its own
(``ModelRunner._get_attention_backend``: the captured kernels read that backend's buffers, which
its replay refills; the backends of two widths never share metadata), and puts a
``WidthDispatchRunner`` in the model runner's place: it answers ``can_run_graph`` and ``execute``
with the runner whose captured width is the batch's ``spec_info.num_tokens_per_req``, and passes
every other attribute to the largest width's runner (what the rest of the server read before).

Each extra runner captures the same batch sizes as the first (0.5.23 derives them from the server's
graph flags; a budget is used only in its bucket, so part of each capture is never replayed): the
memory is the graphs' (the input buffers go through the process-wide graph pool as the first
runner's do) and each backend's graph metadata. ``install`` logs what the capture cost.

Off with ``SGLANG_DDTREE_SCHEDULE_GRAPHS=0`` (a steps at a budget other than the largest then
verifies eagerly): the side-by-side switch for measuring what the graphs give.

New file of the sgdeploy patch series (feature ``ddtree``), not in SGLang 0.5.23; used by
``ddtree_worker.py`` only when a schedule is set.
"""

from __future__ import annotations

import logging
import os
import time

logger = logging.getLogger(__name__)

ENV_SWITCH = "SGLANG_DDTREE_SCHEDULE_GRAPHS"


class WidthDispatchRunner:
    """The model runner's decode graph runner for several verify widths."""

    def __init__(self, runners: dict[int, object], base: object):
        self.__dict__["_runners"] = dict(runners)
        self.__dict__["_base"] = base

    def _runner_for(self, forward_batch):
        spec_info = forward_batch.spec_info
        width = getattr(spec_info, "num_tokens_per_req", -1) if spec_info is not None else -1
        if width is None or width <= 0:
            return self._base
        return self._runners.get(int(width))

    def can_run_graph(self, forward_batch) -> bool:
        runner = self._runner_for(forward_batch)
        return runner is not None and bool(runner.can_run_graph(forward_batch))

    def execute(self, forward_batch, *args, **kwargs):
        return self._runner_for(forward_batch).execute(forward_batch, *args, **kwargs)

    @property
    def widths(self) -> list[int]:
        return sorted(self._runners)

    def __getattr__(self, name):
        return getattr(self.__dict__["_base"], name)


def install(model_runner, budgets, largest: int) -> WidthDispatchRunner | None:
    """Capture the target's verify graphs at every budget of ``budgets`` other than ``largest`` (already
    captured by the server) and dispatch by width. None (nothing changed) when the target has no
    graphs (``--disable-cuda-graph``), when the switch is off, or when only one budget is scheduled."""
    base = getattr(model_runner, "decode_cuda_graph_runner", None)
    if base is None or getattr(base, "captured_req_width", None) != largest + 1:
        # Said, not silent: a schedule whose smaller budgets verify eagerly is slow (2026-12-05, H100).
        logger.warning(
            "DDTREE schedule: no target verify graphs at width %d (%s): every step at another budget verifies "
            "eagerly.",
            largest + 1,
            "none captured" if base is None else f"captured at {getattr(base, 'captured_req_width', None)}",
        )
        return None
    if os.environ.get(ENV_SWITCH, "1") == "0":
        logger.info("DDTREE schedule: %s=0: budgets other than %d verify eagerly.", ENV_SWITCH, largest)
        return None
    others = [b for b in budgets if b != largest]
    if not others:
        return None
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    cls = type(base) if isinstance(base, DecodeCudaGraphRunner) else DecodeCudaGraphRunner
    runners = {largest + 1: base}
    free = _free_gib(model_runner)
    tic = time.perf_counter()
    for budget in sorted(others):
        runners[budget + 1] = cls(
            model_runner,
            attn_backend=model_runner._get_attention_backend(),
            speculative_num_draft_tokens=budget + 1,
        )
    after = _free_gib(model_runner)
    dispatch = WidthDispatchRunner(runners, base)
    model_runner.decode_cuda_graph_runner = dispatch
    logger.info(
        "DDTREE schedule: target verify graphs at widths %s (bs %s), the extra ones in %.1f s, %s GiB.",
        dispatch.widths,
        getattr(base, "capture_bs", None),
        time.perf_counter() - tic,
        "?" if free is None or after is None else f"{free - after:.2f}",
    )
    return dispatch


def _free_gib(model_runner):
    try:
        import torch

        free, _ = torch.cuda.mem_get_info(model_runner.gpu_id)
        return free / 2**30
    except Exception:  # noqa: BLE001 - only for the log line
        return None
