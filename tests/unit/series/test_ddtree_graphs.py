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

    def execute(self, fb, **kw):
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
        assert d.execute(batch(width), pp_proxy_tensors=None) == f"replayed at {width}"
        assert runner.ran == [(4, {"pp_proxy_tensors": None})]


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
    d.execute(batch(65, bs=3))
    assert d.bs == 3  # eagle_worker_common reads decode_cuda_graph_runner.bs after a replay


def test_install_leaves_a_server_without_graphs_or_with_the_switch_off_alone(graphs, monkeypatch):
    mr = SimpleNamespace(decode_cuda_graph_runner=None)
    assert graphs.install(mr, (15, 32, 64), 64) is None and mr.decode_cuda_graph_runner is None
    mr.decode_cuda_graph_runner = base = Runner(65)
    monkeypatch.setenv(graphs.ENV_SWITCH, "0")
    assert graphs.install(mr, (15, 32, 64), 64) is None and mr.decode_cuda_graph_runner is base
    monkeypatch.delenv(graphs.ENV_SWITCH)
    assert graphs.install(mr, (64,), 64) is None and mr.decode_cuda_graph_runner is base  # one budget: nothing to add
    mr.decode_cuda_graph_runner = Runner(33)  # not captured at the largest width: not ours to extend
    assert graphs.install(mr, (15, 32, 64), 64) is None
