"""The series' fixes of the H200 end-to-end findings F1-F3 (tests/gpu/e2e/FINDINGS.md), on the CPU.

Each check runs the patched SGLang 0.5.23 (the wheel built from the repository's series, installed
with `--no-deps` beside build/cpu-venv, as test_patched_cli.py does) in a child process, with the
server arguments that SGLang itself parses and resolves for a DDTREE (budget 64, block 16) and a
DFLASH (block 16) command line, and calls the upstream functions the fixes change, on stand-in
objects where a function needs a runner or a worker:

- F1 (draft CUDA graphs at the verify width): `ModelRunner.decode_num_tokens_per_req` (what
  `DecodeCudaGraphRunner.__init__` sizes `captured_req_width` with, `num_draft_tokens=` the resolved
  `speculative_num_draft_tokens`) and `spec_utils.resolve_num_tokens_per_req` (the FA3 backend's
  draft width) give 16 for the DDTREE draft worker and 65 for its target; DFLASH gives 16 for both.
  `DDTreeWorker._maybe_build_draft_sampler` builds no in-graph draft head (DFLASH's still does).
- F2 (CUDA-graph verify not lossless): `DecodeCudaGraphRunner.get_spec_info` (the verify input the
  target's graphs are captured with) carries the custom-mask buffer for a DDTREE target, so the
  Triton backend's capture metadata (`_build_cuda_graph_forward_metadata`) holds its verify-mask
  buffer and the captured extend kernel reads the tree mask (USE_CUSTOM_MASK); before the fix the
  capture had no mask and the replayed kernel attended causally over the flattened tree, across
  siblings. DFLASH keeps its mask-free (causal) capture; the DDTREE draft worker captures no mask.
- F3 (a host sync per decode step): `ddtree_decode.forward_decode`, run up to the verify input with
  `seq_lens_sum=None` (as the scheduler may leave it) and `seq_lens` standing in for device tensors
  (a tensor subclass that raises on `.item()`, `int()`, `.tolist()`, `.cpu()`...), sizes the
  FULL_MASK custom mask from the host lengths: the exact mask with `seq_lens_cpu`; without it a
  longer one (the draft input's reserved lengths) whose head is the exact mask and whose tail is True.

The child half is torch + SGLang only (run as `python test_ddtree_fixes.py CHECK MODELS_DIR` inside
build/cpu-venv); the pytest half builds the wheel and asserts on the child's JSON. Slow like the other
patched-wheel tests (the wheel build; the venv when it must be made): `pytest -m slow`.
"""

from __future__ import annotations

import json
import sys
import types

BLOCK = 16
BUDGET = 64


def server_lines(models_dir: str) -> dict[str, list[str]]:
    common = [
        "--model-path", f"{models_dir}/target", "--host", "127.0.0.1", "--port", "30000", "--tp-size", "1",
        "--device", "cuda", "--attention-backend", "triton", "--page-size", "1",
        "--speculative-draft-model-path", f"{models_dir}/draft", "--speculative-dflash-block-size", str(BLOCK),
    ]  # fmt: skip
    return {
        "DDTREE": [*common, "--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", str(BUDGET),
                   "--speculative-ddtree-topk-cap", "16"],
        "DFLASH": [*common, "--speculative-algorithm", "DFLASH"],
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The child process: build/cpu-venv with the patched wheel on PYTHONPATH


def publish(argv: list[str]):
    """Parse and resolve `argv` with SGLang, and install it as this process's configuration."""
    from sglang.srt.arg_groups.speculative_hook import handle_speculative_decoding
    from sglang.srt.runtime_context import get_context, get_spec
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    args = prepare_server_args(argv)
    handle_speculative_decoding(args)
    get_context().set_server_args(args)
    return get_spec(), SpeculativeAlgorithm.from_string(get_spec().speculative_algorithm)


def check_widths(lines: dict) -> dict:
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.speculative.spec_utils import resolve_num_tokens_per_req

    out = {}
    for name, argv in lines.items():
        spec, algorithm = publish(argv)
        n = int(spec.speculative_num_draft_tokens)
        got = {"num_draft_tokens": n, "block_size": spec.speculative_dflash_block_size}
        for role, draft in (("draft", True), ("target", False)):
            runner = types.SimpleNamespace(spec_algorithm=algorithm, is_draft_worker=draft)
            got[role] = {
                # DecodeCudaGraphRunner.__init__: captured_req_width (and max_bs * it: the graph's tokens).
                "graph_width": ModelRunner.decode_num_tokens_per_req(runner, num_draft_tokens=n),
                # The attention backends' and base runner's width (no argument).
                "runner_width": ModelRunner.decode_num_tokens_per_req(runner),
                # FlashAttentionBackend's draft verify width.
                "resolved": resolve_num_tokens_per_req(
                    phase="target_verify", spec_algorithm=algorithm, is_draft_worker=draft, num_draft_tokens=n
                ),
            }
        out[name] = got
    return out


def check_draft_sampler(lines: dict) -> dict:
    """`_maybe_build_draft_sampler` of each worker class on a worker whose attributes make DFlash fold
    its greedy head into the draft graph (plain drafter, dense target lm_head, TP 1)."""
    import logging

    import torch
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.speculative import ddtree_worker, dflash_worker_v2

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    for module in (ddtree_worker, dflash_worker_v2):
        module.logger.addHandler(Keep())
        module.logger.setLevel(logging.INFO)
    # The resolved decode graph sizes (resolved by the server's full start, which this test skips).
    decode = types.SimpleNamespace(bs=[1, 2, 4, 8])
    graph = types.SimpleNamespace(cuda_graph_config=types.SimpleNamespace(decode=decode))
    dflash_worker_v2.get_exec = lambda: types.SimpleNamespace(graph=graph)
    lm_head = torch.nn.Linear(256, 1024, bias=False)
    target = types.SimpleNamespace(model_runner=types.SimpleNamespace(model=types.SimpleNamespace(lm_head=lm_head)))
    out = {}
    for name, cls in (("DDTREE", ddtree_worker.DDTreeWorker), ("DFLASH", dflash_worker_v2.DFlashWorkerV2)):
        publish(lines[name])
        worker = object.__new__(cls)
        worker.__dict__.update(
            _target_tp_rank=0, block_size=BLOCK, selector=None, lilicorr=None, _is_domino=False, _target_worker=target
        )
        del records[:]
        try:
            with get_parallel().override(tp_group=types.SimpleNamespace(world_size=1)):
                sampler = worker._maybe_build_draft_sampler()
            out[name] = {"sampler": None if sampler is None else type(sampler).__name__, "logged": list(records)}
        except Exception as exc:
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    return out


def check_capture_mask(lines: dict) -> dict:
    """The verify input each graph runner captures with, and the Triton capture metadata it gives."""
    import torch
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
    from sglang.srt.layers.attention.verify_mask import VerifyMask
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
    from sglang.srt.speculative.eagle_utils import default_tree_mask_mode

    out = {}
    for name, argv in lines.items():
        spec, algorithm = publish(argv)
        for role, draft in (("draft", True), ("target", False)):
            bs = 2
            # The runner's captured_req_width, as DecodeCudaGraphRunner.__init__ computes it.
            width = ModelRunner.decode_num_tokens_per_req(
                types.SimpleNamespace(spec_algorithm=algorithm, is_draft_worker=draft),
                num_draft_tokens=int(spec.speculative_num_draft_tokens),
            )
            # The target of a hybrid (GDN) model: a linear-attention wrapper around its Triton backend.
            triton = object.__new__(TritonAttnBackend)
            wrapper = types.SimpleNamespace(full_attn_backend=triton)
            buffers = types.SimpleNamespace(custom_mask=torch.ones(bs * (1 + width) * width, dtype=torch.bool))
            model_runner = types.SimpleNamespace(spec_algorithm=algorithm, is_draft_worker=draft, attn_backend=wrapper)
            runner = types.SimpleNamespace(
                model_runner=model_runner, buffers=buffers, captured_req_width=width,
                _capture_ragged_verify_layout=lambda n: None,
            )  # fmt: skip
            spec_info = DecodeCudaGraphRunner.get_spec_info(runner, bs * width)
            verify_buffer = torch.zeros(bs * width * (64 + width), dtype=torch.uint8)
            triton.__dict__.update(
                _verify_mask=None if draft else VerifyMask(buffer=verify_buffer, mode=default_tree_mask_mode(),
                                                           max_bs=bs, is_read=True),
                sliding_window_size=None, target_verify_num_tokens_per_req=width,
                kv_indptr=torch.zeros(bs + 1, dtype=torch.int32), qo_indptr=torch.zeros(bs + 1, dtype=torch.int32),
                mask_indptr=torch.zeros(bs + 1, dtype=torch.int64), window_kv_indptr=torch.zeros(bs + 1),
                cuda_graph_kv_indices=torch.zeros(8, dtype=torch.int64),
            )  # fmt: skip
            metadata = TritonAttnBackend._build_cuda_graph_forward_metadata(
                triton, bs, ForwardMode.TARGET_VERIFY, spec_info
            )
            out[f"{name}/{role}"] = {
                "spec_info": type(spec_info).__name__,
                "draft_token_num": spec_info.draft_token_num,
                "capture_mask_is_buffer": spec_info.custom_mask is buffers.custom_mask,
                "capture_mask_none": spec_info.custom_mask is None,
                "metadata_mask_is_verify_buffer": metadata.custom_mask is verify_buffer,
                "metadata_mask_none": metadata.custom_mask is None,
                "max_extend_len": metadata.max_extend_len,
            }
    return out


class DeviceRead(RuntimeError):
    pass


def device_tensor_class():
    import torch

    def refuse(name):
        def method(self, *args, **kwargs):
            raise DeviceRead(f"host read of a device tensor: {name}")

        return method

    names = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__")
    return type("DeviceTensor", (torch.Tensor,), {**{n: refuse(n) for n in names}, "record_stream": lambda s, x: None})


def check_mask_sizing(lines: dict) -> dict:
    """`forward_decode` up to its verify input, with `seq_lens` as device tensors and no `seq_lens_sum`."""
    import sglang.kernels.ops.speculative.cache_locs as cache_locs
    import torch
    from sglang.srt.layers.attention.verify_mask import TreeMaskMode
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.speculative import ddtree_decode, ddtree_worker
    from sglang.srt.speculative.ddtree_info import flatten_tree_mask
    from sglang.srt.speculative.ddtree_tree import DDTreeLayout
    from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2

    publish(lines["DDTREE"])
    device = device_tensor_class()
    budget, depth, hidden = 3, 3, 8
    t = budget + 1
    prefix = [5, 9]
    bs = len(prefix)
    # A tree per request: root -> a -> b and root -> c (parents precede children).
    mask = torch.zeros(bs, t, t, dtype=torch.bool)
    for row, ancestors in enumerate(([0], [0, 1], [0, 1, 2], [0, 3])):
        mask[:, row, ancestors] = True
    i64 = dict(dtype=torch.int64)

    def layout(logprobs, ids, budget_, *, root_tokens, root_positions):
        n = root_tokens.shape[0]
        rows = lambda v: torch.tensor(v, **i64).expand(n, -1).contiguous()  # noqa: E731
        return DDTreeLayout(
            parents=rows([-1, 0, -1]), depths=rows([1, 2, 1]), scores=torch.zeros(n, budget_),
            node_tokens=rows([11, 12, 13]), num_nodes=torch.full((n,), budget_, dtype=torch.int32),
            verify_tokens=torch.cat([root_tokens[:, None], rows([11, 12, 13])], 1),
            positions=root_positions[:, None] + rows([0, 1, 2, 1]), retrieve_parent_token=rows([-1, 0, 1, 0]),
            retrieve_next_token=rows([1, 2, -1, -1]), retrieve_next_sibling=rows([-1, 3, -1, -1]), tree_mask=mask,
        )  # fmt: skip

    class Stop(Exception):
        pass

    def stop(**kwargs):
        raise Stop

    ddtree_worker.build_ddtree = layout
    ddtree_worker.depth_topk_logprobs = lambda h, *a, **k: (
        torch.zeros(h.shape[0], 2), torch.zeros(h.shape[0], 2, **i64)
    )  # fmt: skip
    ddtree_decode._draft_block_hidden = lambda w, b, d, n: (
        torch.zeros(n, depth + 1, hidden), torch.ones(n, depth + 1, **i64)
    )  # fmt: skip
    cache_locs.assign_extend_cache_locs_func = stop
    out = {}
    from sglang.srt.speculative.ddtree_schedule import BudgetSchedule

    # "schedule" (patch 0005): the largest budget is 8, the schedule gives this batch of 2 the budget 3: the step
    # must build, mask and verify a tree of 3 (a fixed-budget worker would pass 8).
    for case, host in (("seq_lens_cpu", True), ("gpu_only", False), ("schedule", True)):
        worker = object.__new__(ddtree_worker.DDTreeWorker)
        seen = {}

        def build(seen=seen, worker=worker, **kwargs):
            seen["seq_lens_sum"] = kwargs["seq_lens_sum"]
            seen["budget"] = kwargs.get("budget")
            seen["input"] = ddtree_worker.DDTreeWorker.build_verify_input(worker, **kwargs)
            return seen["input"]

        backend = types.SimpleNamespace(verify_mask=types.SimpleNamespace(mode=TreeMaskMode.FULL_MASK))
        worker.__dict__.update(
            device="cpu", ddtree_budget=budget, ddtree_topk_cap=2, ddtree_fused_topk=False, build_verify_input=build,
            model_runner=types.SimpleNamespace(req_to_token_pool=types.SimpleNamespace(req_to_token=None)),
            _target_worker=types.SimpleNamespace(
                model_runner=types.SimpleNamespace(model=types.SimpleNamespace(lm_head=None), attn_backend=backend)
            ),
        )  # fmt: skip
        if case == "schedule":
            worker.__dict__.update(ddtree_budget=8, ddtree_schedule=BudgetSchedule.from_text(f"1:8,{bs}:{budget}"))
        draft_input = object.__new__(DFlashDraftInputV2)
        reserved = [p + 2 * t + 1 for p in prefix]  # what prepare_for_decode reserves: >= prefix + 2 x width
        draft_input.__dict__.update(nxt_kv_lens_cpu=torch.tensor(reserved), nxt_kv_lens_sum=sum(reserved))
        batch = types.SimpleNamespace(
            spec_info=draft_input, seq_lens=torch.tensor(prefix).as_subclass(device),
            req_pool_indices=torch.arange(bs).as_subclass(device),
            seq_lens_cpu=torch.tensor(prefix) if host else None, seq_lens_sum=None,
        )  # fmt: skip
        try:
            with get_parallel().override(tp_size=1):
                ddtree_decode.forward_decode(worker, batch)
            out[case] = {"error": "forward_decode ran past the verify input (the stop did not fire)"}
        except Stop:
            got = seen["input"].custom_mask.as_subclass(torch.Tensor)
            exact = flatten_tree_mask(mask, torch.tensor(prefix), True, None)
            out[case] = {
                "seq_lens_sum": seen["seq_lens_sum"], "budget": seen["budget"],
                "width": int(seen["input"].draft_token_num), "numel": int(got.numel()),
                "exact_numel": int(exact.numel()),
                "head_is_exact": bool(torch.equal(got[: exact.numel()], exact)),
                "tail_all_true": bool(got[exact.numel():].all()),
            }  # fmt: skip
        except DeviceRead as exc:
            out[case] = {"device_read": str(exc)}
    return out


CHECKS = {
    "widths": check_widths,
    "draft_sampler": check_draft_sampler,
    "capture_mask": check_capture_mask,
    "mask_sizing": check_mask_sizing,
}


def main(argv: list[str]) -> int:
    import torchvision_standin  # beside this file, so on sys.path when it runs as a script

    torchvision_standin.install()
    check, models_dir = argv
    print(json.dumps(CHECKS[check](server_lines(models_dir))))
    return 0


if __name__ == "__main__":  # the child half ends here
    raise SystemExit(main(sys.argv[1:]))


# ---------------------------------------------------------------------------------------------
# The pytest half

import os  # noqa: E402
import subprocess  # noqa: E402

import pytest  # noqa: E402
from test_ddtree_plumbing import patched_site  # noqa: E402, F401
from test_patched_cli import cpu_python, downloads, models  # noqa: E402, F401

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def run_check(cpu_python, patched_site, models):  # noqa: F811
    done: dict[str, dict] = {}

    def run(check: str) -> dict:
        if check not in done:
            env = dict(os.environ, PYTHONPATH=str(patched_site), CUDA_VISIBLE_DEVICES="")
            proc = subprocess.run(
                [cpu_python, __file__, check, str(models)],
                capture_output=True, text=True, env=env, timeout=900, cwd=patched_site,
            )  # fmt: skip
            assert proc.returncode == 0, f"the {check} check failed (exit {proc.returncode}):\n{proc.stderr[-5000:]}"
            done[check] = json.loads(proc.stdout.strip().splitlines()[-1])
        return done[check]

    return run


def test_ddtree_draft_graphs_are_sized_by_the_block_and_verify_graphs_by_the_budget(run_check):
    """F1: the draft runner runs block_size tokens per request, the target budget + 1."""
    got = run_check("widths")["DDTREE"]
    assert got["num_draft_tokens"] == BUDGET + 1 and got["block_size"] == BLOCK, got
    assert got["draft"] == {"graph_width": BLOCK, "runner_width": BLOCK, "resolved": BLOCK}, got
    assert got["target"] == {"graph_width": BUDGET + 1, "runner_width": BUDGET + 1, "resolved": BUDGET + 1}, got


def test_dflash_widths_are_unchanged(run_check):
    got = run_check("widths")["DFLASH"]
    assert got["num_draft_tokens"] == BLOCK, got
    for role in ("draft", "target"):
        assert got[role] == {"graph_width": BLOCK, "runner_width": BLOCK, "resolved": BLOCK}, got


def test_ddtree_builds_no_in_graph_draft_head_while_dflash_still_does(run_check):
    """F1: DFlash's greedy head views the draft graph's hidden states as [bs, block, H]; DDTree reads
    the hidden states itself, so it folds no head into the graph (and says so)."""
    got = run_check("draft_sampler")
    assert got["DDTREE"] == {"sampler": None, "logged": [got["DDTREE"].get("logged", [""])[0]]}, got
    assert "no DFlash draft greedy head" in got["DDTREE"]["logged"][0], got
    assert got["DFLASH"]["sampler"] == "_DflashDraftSampler", got
    assert any("folded into the draft cuda graph" in m for m in got["DFLASH"]["logged"]), got


def test_ddtree_target_verify_graphs_capture_the_tree_mask(run_check):
    """F2: the captured target verify kernels read the tree's custom mask; the width is budget + 1."""
    got = run_check("capture_mask")["DDTREE/target"]
    assert got["capture_mask_is_buffer"] and got["metadata_mask_is_verify_buffer"], got
    assert got["draft_token_num"] == BUDGET + 1 and got["max_extend_len"] == BUDGET + 1, got


def test_dflash_verify_graphs_and_ddtree_draft_graphs_stay_mask_free(run_check):
    got = run_check("capture_mask")
    for key in ("DFLASH/target", "DFLASH/draft", "DDTREE/draft"):
        assert got[key]["capture_mask_none"] and got[key]["metadata_mask_none"], (key, got[key])
    assert got["DDTREE/draft"]["draft_token_num"] == got["DDTREE/draft"]["max_extend_len"] == BLOCK, got


def test_forward_decode_sizes_the_tree_mask_from_host_lengths(run_check):
    """F3: with seq_lens_sum None and host seq_lens_cpu, no device read, and the exact mask."""
    got = run_check("mask_sizing")["seq_lens_cpu"]
    assert "device_read" not in got and "error" not in got, got
    assert got["seq_lens_sum"] == 5 + 9, got
    assert got["numel"] == got["exact_numel"] == (5 + 9 + 2 * 4) * 4 and got["head_is_exact"], got


def test_forward_decode_without_host_lengths_takes_the_reserved_upper_bound(run_check):
    """F3, GPU-only scheduling (no seq_lens_cpu): still no device read; a longer mask, exact at its head."""
    got = run_check("mask_sizing")["gpu_only"]
    assert "device_read" not in got and "error" not in got, got
    assert got["seq_lens_sum"] == (5 + 9) + 2 * (2 * 4 + 1), got
    assert got["numel"] > got["exact_numel"] and got["head_is_exact"] and got["tail_all_true"], got


def test_a_scheduled_step_builds_and_masks_the_tree_of_its_batch_sizes_budget(run_check):
    """Patch 0005: the largest budget is 8, the schedule gives a batch of 2 the budget 3; the step passes 3 to the tree
    builder and its verify input and mask are 3 + 1 wide (as the fixed budget 3's), with no device read."""
    got = run_check("mask_sizing")["schedule"]
    assert "device_read" not in got and "error" not in got, got
    assert got["budget"] == 3 and got["width"] == 4, got
    assert got["numel"] == got["exact_numel"] == (5 + 9 + 2 * 4) * 4 and got["head_is_exact"], got
