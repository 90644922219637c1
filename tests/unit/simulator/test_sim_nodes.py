"""The simulated engine over several hosts (tests/sim/sim_nodes.py; test equipment): rank 0 serves only when every
rank joined, a rank dying takes rank 0 down with a non-zero exit, a clean stop lets the ranks exit 0."""

from __future__ import annotations

import signal
import socket
import time

import pytest

from tests.unit.simulator.test_sim import Sim, free_port


@pytest.fixture
def engine(tmp_path):
    made: list[Sim] = []

    def start(rank: int, nnodes: int = 2, dist_port: int | None = None, **kw) -> Sim:
        port = dist_port or kw.pop("dist", None)
        sim = Sim(tmp_path, f"rank{rank}-{len(made)}", None,
                  ["--model-path", "org/m", "--nnodes", str(nnodes), "--node-rank", str(rank),
                   "--dist-init-addr", f"127.0.0.1:{port}"], **kw)
        made.append(sim)
        return sim

    yield start
    for sim in made:
        sim.stop()


def _no_http(sim: Sim, within: float = 1.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", sim.port), timeout=0.2).close()
        time.sleep(0.1)


def test_rank_0_serves_only_when_every_rank_joined(engine):
    dist = free_port()
    r0 = engine(0, nnodes=3, dist_port=dist)
    assert r0.first_answer() == 503  # listening, waiting for ranks 1 and 2
    r1 = engine(1, nnodes=3, dist_port=dist)
    time.sleep(1.0)
    assert r0.first_answer() == 503
    _no_http(r1)  # ranks above 0 serve no HTTP
    engine(2, nnodes=3, dist_port=dist)
    r0.wait_ready()
    assert "dist-init: all 3 ranks joined" in r0.log
    assert r0.generate("hello", 4)["meta_info"]["completion_tokens"] == 4


def test_a_rank_that_dies_takes_rank_0_down_non_zero(engine):
    dist = free_port()
    r0 = engine(0, dist_port=dist)
    r1 = engine(1, dist_port=dist)
    r0.wait_ready()
    r1.proc.kill()
    assert r0.wait_exit() == 1
    assert "ERROR: rank 1 left the engine" in r0.log


def test_rank_0_dying_takes_the_ranks_down_and_a_clean_stop_does_not(engine):
    dist = free_port()
    r0 = engine(0, dist_port=dist)
    r1 = engine(1, dist_port=dist)
    r0.wait_ready()
    r0.proc.kill()
    assert r1.wait_exit() == 1
    assert "ERROR: rank 0 went away" in r1.log
    dist = free_port()
    r0 = engine(0, dist_port=dist)
    r1 = engine(1, dist_port=dist)
    r0.wait_ready()
    r0.proc.send_signal(signal.SIGTERM)
    assert r0.wait_exit() == 0 and r1.wait_exit() == 0
    assert "rank 0 stopped cleanly" in r1.log


def test_a_rank_that_cannot_join_gives_up_non_zero(engine):
    r1 = engine(1, dist_port=free_port(), env={"SGLANG_SIM_JOIN_TIMEOUT_S": "1"})
    assert r1.wait_exit() == 1
    assert "cannot join rank 0" in r1.log


@pytest.mark.parametrize("args,message", [
    (["--nnodes", "2", "--node-rank", "2", "--dist-init-addr", "127.0.0.1:1"], "argument --node-rank: invalid value 2"),
    (["--nnodes", "2"], "--dist-init-addr is required with --nnodes above 1"),
    (["--nnodes", "2", "--dist-init-addr", "nohost"], "--dist-init-addr 'nohost': give HOST:PORT"),
])
def test_bad_rank_flags_are_refused_like_argparse(args, message, tmp_path):
    sim = Sim(tmp_path, "bad", None, ["--model-path", "org/m", *args])
    try:
        assert sim.wait_exit() == 2
        assert message in sim.log
    finally:
        sim.stop()


def test_a_joined_rank_above_0_ignores_sigterm_until_rank_0_stops_cleanly(engine):
    # As SGLang 0.5.23 (entrypoints/engine.py, node_rank >= 1): SIGTERM only logs; rank 0's clean stop ends the rank.
    dist = free_port()
    r0 = engine(0, dist_port=dist)
    r1 = engine(1, dist_port=dist)
    r0.wait_ready()
    r1.proc.send_signal(signal.SIGTERM)
    time.sleep(1.5)
    assert r1.proc.poll() is None, r1.log
    assert "SIGTERM received on node_rank 1; waiting for the rank-0 ShutdownReq broadcast" in r1.log
    assert r0.first_answer() == 200  # the engine still serves
    r0.proc.send_signal(signal.SIGTERM)
    assert r0.wait_exit() == 0 and r1.wait_exit() == 0
    assert "rank 0 stopped cleanly" in r1.log


def test_a_rank_above_0_that_has_not_joined_exits_on_sigterm(engine):
    r1 = engine(1, dist_port=free_port())
    time.sleep(1.0)
    r1.proc.send_signal(signal.SIGTERM)
    assert r1.wait_exit() == 0
    assert "Received SIGTERM before joining" in r1.log
