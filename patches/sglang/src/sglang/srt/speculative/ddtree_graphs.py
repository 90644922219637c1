"""Target verify CUDA graphs per budget for a DDTree budget schedule (patch 0005), on by default.

What: the target's decode graph runner (0.5.23's ``DecodeCudaGraphRunner``) captures one verify
width, ``--speculative-num-draft-tokens`` = the schedule's largest budget + 1, and replays only
batches of that width (its ``can_run_graph``: "the batch's actual per-request width must match this
runner's capture width; anything else falls back to eager"). Unless ``SGLANG_DDTREE_SCHEDULE_GRAPHS=0``,
``install`` adds one more runner per other budget of the schedule, each captured at that budget + 1
with an attention backend of its own, and puts a ``WidthDispatchRunner`` in the model runner's place:
``can_run_graph``, ``load_batch`` and ``execute`` go to the runner whose captured width is the batch's
``spec_info.num_tokens_per_req``; every other attribute to the largest width's runner.

Why a backend per width: the captured kernels read their backend's graph buffers, and some of them
are shaped by the width (the GDN backend's ``init_cuda_graph_state`` lays out the verify query starts
and the tree links for ``max_num_tokens // max_bs`` tokens per request), so two widths cannot share
one backend. And because the rest of the step reads ``model_runner.attn_backend`` (the tree mask
buffer, ``ForwardBatch.attn_backend``, the recurrent-state commit's ``forward_metadata``),
``step_backend`` puts the width's backend there for the verify of one decode step and the server's own
back after it (prefill graphs and eager steps keep the server's backend).

On by default since its run on the H200 (2026-12-05, the trained pair, tests/gpu/e2e set ``derive``):
widths 16/33/65 captured in 5.9 s for 0.14 GiB, 170 of the 171 decode log lines of the schedule
1:64,4:32,8:15 said "cuda graph: True" (every fixed budget's server logs the same one eager line; with
the switch off, 29 of 170 were eager), lossless like every fixed budget (57 of 64 outputs equal to
AR, every other prompt within the near-tie rule), and 1.5-2.0x the tokens/s of the same schedule whose
smaller budgets verify eagerly at batch 4-16. ``SGLANG_DDTREE_SCHEDULE_GRAPHS=0`` turns it off (the
other budgets verify eagerly). The first two versions failed on the GPU: installed from the worker's
``__init__`` they were never captured (the target's graphs come later); installed after the capture,
``load_batch`` went to the largest width's runner and the scheduler died at the first smaller step.

Each extra runner captures the same batch sizes as the first (0.5.23 derives them from the server's
graph flags); ``install`` logs what the capture cost.

New file of the sgdeploy patch series (feature ``ddtree``), not in SGLang 0.5.23; used by
``ddtree_worker.py`` and ``ddtree_decode.py`` only when a schedule is set.
"""

from __future__ import annotations

import contextlib
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

    def load_batch(self, forward_batch, *args, **kwargs):
        """The verify's graph inputs into the buffers of the runner of the batch's width (0.5.23's
        ``eagle_prepare_for_verify`` calls it before ``execute``). Passed to the largest width's runner (as first
        written), a batch of 8 at width 16 was copied into buffers of 8 x 65 rows and the scheduler died:
        "The size of tensor a (520) must match the size of tensor b (128)" (H100, 2026-12-05)."""
        runner = self._runner_for(forward_batch)
        self.__dict__["_last"] = runner
        return runner.load_batch(forward_batch, *args, **kwargs)

    def execute(self, forward_batch, *args, **kwargs):
        runner = self._runner_for(forward_batch)
        self.__dict__["_last"] = runner
        return runner.execute(forward_batch, *args, **kwargs)

    @property
    def bs(self):
        """The padded batch of the last replay, from the runner that replayed it (``ModelRunner`` reads it after a
        forward for the experts/indexer capturers)."""
        return getattr(self.__dict__.get("_last") or self.__dict__["_base"], "bs", None)

    def backend_for(self, width: int):
        """The attention backend of the runner captured at ``width``; the server's own when none is."""
        runner = self._runners.get(int(width)) or self.__dict__["_base"]
        return runner.attn_backend

    @property
    def widths(self) -> list[int]:
        return sorted(self._runners)

    def __getattr__(self, name):
        return getattr(self.__dict__["_base"], name)


def install(model_runner, budgets, largest: int) -> WidthDispatchRunner | None:
    """Capture the target's verify graphs at every budget of ``budgets`` other than ``largest`` (already
    captured by the server) and dispatch by width. None (nothing changed) when the target has no
    graphs (``--disable-cuda-graph``), when the switch is off (``=0``), or when only one budget is scheduled."""
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
        logger.info("DDTREE schedule: budgets other than %d verify eagerly (%s=0).", largest, ENV_SWITCH)
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


@contextlib.contextmanager
def step_backend(model_runner, width: int):
    """For one decode step's verify: ``model_runner.attn_backend`` is the backend of the graphs captured at
    ``width`` (``WidthDispatchRunner.backend_for``), then the server's own again, whatever happens. Without a
    dispatch runner (no schedule, graphs off or disabled) nothing changes."""
    dispatch = getattr(model_runner, "decode_cuda_graph_runner", None)
    if not isinstance(dispatch, WidthDispatchRunner):
        yield model_runner.attn_backend
        return
    own = model_runner.attn_backend
    model_runner.attn_backend = dispatch.backend_for(width)
    try:
        yield model_runner.attn_backend
    finally:
        model_runner.attn_backend = own


def _free_gib(model_runner):
    try:
        import torch

        free, _ = torch.cuda.mem_get_info(model_runner.gpu_id)
        return free / 2**30
    except Exception:  # noqa: BLE001 - only for the log line
        return None
