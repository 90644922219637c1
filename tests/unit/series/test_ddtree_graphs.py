"""The width dispatch of the budget schedule's verify graphs (patch 0005, speculative/ddtree_graphs.py), on stand-in
runners: a batch goes to the runner captured at its width, a width with no runner runs eagerly (can_run_graph
False), and the rest of the server keeps reading the largest width's runner. Loaded from the series' source."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import series_source


@pytest.fixture(scope="module")
def graphs():
    return series_source.load("speculative/ddtree_graphs.py")


class Runner:
    def __init__(self, width: int, max_bs: int = 16):
        self.captured_req_width, self.max_bs, self.bs, self.ran = width, max_bs, None, []

    def can_run_graph(self, fb):
        return fb.spec_info.num_tokens_per_req == self.captured_req_width and fb.batch_size <= self.max_bs

    def load_batch(self, fb, *args):
        # 0.5.23's load_batch copies the batch into this runner's buffers, sized for its captured width.
        width = fb.spec_info.num_tokens_per_req
        assert width == self.captured_req_width, (
            f"a batch of width {width} loaded into buffers of width {self.captured_req_width}")
        self.loaded = fb.batch_size

    def execute(self, fb, **kw):
        assert getattr(self, "loaded", None) == fb.batch_size, "replayed without its own load_batch"
        self.ran.append((fb.batch_size, kw))
        self.bs = fb.batch_size
        return f"replayed at {self.captured_req_width}"


def batch(width: int, bs: int = 4):
    return SimpleNamespace(spec_info=SimpleNamespace(num_tokens_per_req=width), batch_size=bs)


def test_each_width_replays_its_own_runner(graphs):
    big, mid, small = Runner(65), Runner(33), Runner(16)
    d = graphs.WidthDispatchRunner({65: big, 33: mid, 16: small}, big)
    assert d.widths == [16, 33, 65]
    for width, runner in ((65, big), (33, mid), (16, small)):
        assert d.can_run_graph(batch(width))
        d.load_batch(batch(width))  # as eagle_prepare_for_verify does before the replay
        assert d.execute(batch(width), pp_proxy_tensors=None) == f"replayed at {width}"
        assert runner.ran == [(4, {"pp_proxy_tensors": None})]
        assert d.bs == 4


def test_load_batch_and_bs_follow_the_width_of_the_batch(graphs):
    """On the H100 the scheduler died at the first step of a smaller budget: load_batch went to the largest width's
    runner ("The size of tensor a (520) must match the size of tensor b (128)")."""
    big, small = Runner(65), Runner(16)
    d = graphs.WidthDispatchRunner({65: big, 16: small}, big)
    d.load_batch(batch(16, bs=8))
    d.execute(batch(16, bs=8))
    assert small.ran == [(8, {})] and big.ran == [] and d.bs == 8
    d.load_batch(batch(65, bs=3))
    d.execute(batch(65, bs=3))
    assert d.bs == 3 and big.ran == [(3, {})]


def test_a_width_without_graphs_runs_eagerly_and_limits_still_hold(graphs):
    big = Runner(65, max_bs=8)
    d = graphs.WidthDispatchRunner({65: big}, big)
    assert not d.can_run_graph(batch(9))  # no runner at width 9: the model runner runs the verify eagerly
    assert not d.can_run_graph(batch(65, bs=9))  # the runner's own limit (batch above its largest graph)
    assert d.can_run_graph(batch(65, bs=8))


def test_other_readers_see_the_largest_widths_runner(graphs):
    big, small = Runner(65), Runner(16)
    d = graphs.WidthDispatchRunner({65: big, 16: small}, big)
    assert d.captured_req_width == 65 and d.max_bs == 16
    d.load_batch(batch(65, bs=3))
    d.execute(batch(65, bs=3))
    assert d.bs == 3  # eagle_worker_common reads decode_cuda_graph_runner.bs after a replay


def test_install_leaves_a_server_without_graphs_or_with_the_switch_off_alone(graphs, monkeypatch):
    mr = SimpleNamespace(decode_cuda_graph_runner=None)
    assert graphs.install(mr, (15, 32, 64), 64) is None and mr.decode_cuda_graph_runner is None
    mr.decode_cuda_graph_runner = base = Runner(65)
    monkeypatch.setenv(graphs.ENV_SWITCH, "0")  # on by default since its H200 run; 0 turns it off
    assert graphs.install(mr, (15, 32, 64), 64) is None and mr.decode_cuda_graph_runner is base
    monkeypatch.setenv(graphs.ENV_SWITCH, "1")
    assert graphs.install(mr, (64,), 64) is None and mr.decode_cuda_graph_runner is base  # one budget: nothing to add
    mr.decode_cuda_graph_runner = Runner(33)  # not captured at the largest width: not ours to extend
    assert graphs.install(mr, (15, 32, 64), 64) is None


def _worker_method_calls(method: str) -> list[str]:
    """The dotted names called in ``DDTreeWorker.<method>`` of the series' source, in order."""
    import ast

    tree = ast.parse((series_source.SRC / "speculative/ddtree_worker.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "DDTreeWorker")
    fn = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method), None)
    assert fn is not None, f"DDTreeWorker has no {method}"
    calls = sorted((n for n in ast.walk(fn) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
    return [ast.unparse(c.func) for c in calls]


def test_the_schedules_graphs_are_installed_after_the_targets_own_capture():
    """SGLang 0.5.23 builds every worker, then ``Scheduler.init_all_cuda_graphs`` captures the target's graphs
    (``tp_worker.init_cuda_graphs``) and then calls the speculative worker's ``init_cuda_graphs``. Installed from
    ``__init__`` (the first version), the target had no graph runner yet, install did nothing, and every step at a
    smaller budget verified eagerly (H100, 2026-12-05: about 40 % fewer tokens/s at batch 4 and 8)."""
    assert "ddtree_graphs.install" not in _worker_method_calls("__init__")
    calls = _worker_method_calls("init_cuda_graphs")
    assert "ddtree_graphs.install" in calls
    assert calls.index("super().init_cuda_graphs") < calls.index("ddtree_graphs.install")


def test_install_says_when_the_target_has_no_graphs_at_the_largest_width(graphs, caplog):
    import logging

    mr = SimpleNamespace(decode_cuda_graph_runner=None)
    with caplog.at_level(logging.WARNING, logger=graphs.logger.name):
        assert graphs.install(mr, (15, 32, 64), 64) is None
    assert "no target verify graphs at width 65 (none captured)" in caplog.text


def test_the_verify_of_a_step_runs_on_its_widths_backend_and_the_servers_own_comes_back(graphs):
    """The tree mask buffer, ForwardBatch.attn_backend and the recurrent-state commit (0.5.23's
    update_mamba_state_after_mtp_verify reads linear_attn_backend.forward_metadata) all read
    model_runner.attn_backend: for a step replayed by the width-16 graphs it must be that runner's backend, whose
    metadata its load_batch filled; prefill and eager steps keep the server's own."""
    big, small = Runner(65), Runner(16)
    big.attn_backend, small.attn_backend = "own", "width16"
    dispatch = graphs.WidthDispatchRunner({65: big, 16: small}, big)
    mr = SimpleNamespace(attn_backend="own", decode_cuda_graph_runner=dispatch)
    with graphs.step_backend(mr, 16) as backend:
        assert backend == mr.attn_backend == "width16"
    assert mr.attn_backend == "own"
    with graphs.step_backend(mr, 9) as backend:  # no graphs at width 9: the step verifies eagerly on the server's
        assert backend == "own"
    try:
        with graphs.step_backend(mr, 16):
            raise RuntimeError("the verify failed")
    except RuntimeError:
        pass
    assert mr.attn_backend == "own"
    plain = SimpleNamespace(attn_backend="own", decode_cuda_graph_runner=big)  # no schedule's graphs: nothing moves
    with graphs.step_backend(plain, 16) as backend:
        assert backend == "own"


class _Capturing:
    """Stands in for 0.5.23's DecodeCudaGraphRunner: records what install builds it with."""

    built: list = []

    def __init__(self, model_runner, *, attn_backend=None, speculative_num_draft_tokens=None):
        self.attn_backend, self.captured_req_width = attn_backend, speculative_num_draft_tokens
        _Capturing.built.append(self)


def test_install_captures_each_other_width_with_a_backend_of_its_own(graphs, monkeypatch):
    import sys
    import types

    module = types.ModuleType("decode_cuda_graph_runner")
    module.DecodeCudaGraphRunner = _Capturing
    monkeypatch.setitem(sys.modules, "sglang.srt.model_executor.runner.decode_cuda_graph_runner", module)
    monkeypatch.delenv(graphs.ENV_SWITCH, raising=False)  # on by default (the H200 run of 2026-12-05)
    _Capturing.built = []
    backends = iter(["b16", "b33"])
    base = Runner(65)
    base.attn_backend = "own"
    mr = SimpleNamespace(decode_cuda_graph_runner=base, attn_backend="own", gpu_id=0,
                         _get_attention_backend=lambda: next(backends))
    d = graphs.install(mr, (15, 32, 64), 64)
    assert mr.decode_cuda_graph_runner is d and d.widths == [16, 33, 65]
    assert [(r.captured_req_width, r.attn_backend) for r in _Capturing.built] == [(16, "b16"), (33, "b33")]
    assert [d.backend_for(w) for w in (16, 33, 65, 9)] == ["b16", "b33", "own", "own"]
