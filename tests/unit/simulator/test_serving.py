"""Serving helpers the deploy runs on the host: wait for health, wait for the drain, warm up."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_units as units
from engine_stub import ROOT, StubEngine, free_port, simulator

from sgdeploy import serving


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sgdeploy.serving", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_host_modules_use_the_standard_library_only():
    # The playbook runs these modules on hosts with the system python3: no requests, yaml or matplotlib.
    code = ("import sys, sgdeploy.serving, sgdeploy.bench, sgdeploy.gate, sgdeploy.records; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'requests', 'urllib3', 'yaml', 'matplotlib'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("url", ["localhost:30000", "ftp://127.0.0.1:1", "http://", "http://127.0.0.1:99999"])
def test_check_url_rejects_what_is_not_a_service_address(url):
    with pytest.raises(serving.UsageError, match="expected http://HOST:PORT") as err:
        serving.check_url(url)
    assert repr(url) in str(err.value)


def test_parse_metrics_sums_label_sets_and_skips_comments():
    text = ("# HELP sglang:num_running_reqs The number of running requests.\n"
            "# TYPE sglang:num_running_reqs gauge\n"
            'sglang:num_running_reqs{model_name="a",tp_rank="0"} 2.0\n'
            'sglang:num_running_reqs{model_name="b",tp_rank="0"} 1\n'
            "sglang:num_queue_reqs 3\n")
    assert serving.parse_metrics(text) == {"sglang:num_running_reqs": 3.0, "sglang:num_queue_reqs": 3.0}


def test_wait_healthy_waits_through_503_until_the_model_is_loaded():
    with StubEngine(healthy_after=0.6) as stub:
        assert not serving.is_healthy(stub.url)
        result = serving.wait_healthy(stub.url, timeout=10, interval=0.1)
    assert result.ok and result.state == "healthy"
    assert result.waited_s >= 0.5


def test_wait_healthy_gives_up_at_the_timeout_naming_the_url():
    with StubEngine(healthy_after=60) as stub:
        start = time.monotonic()
        result = serving.wait_healthy(stub.url, timeout=0.5, interval=0.1)
    assert not result.ok and result.state == "timeout"
    assert time.monotonic() - start < 3
    assert f"{stub.url}/health" in result.detail and "0.5 s" in result.detail


def test_wait_drained_waits_for_the_request_in_flight(tmp_path):
    # Slow the engine so one request is in flight for about a second, then wait for the drain.
    with simulator(tmp_path, env={"SGLANG_SIM_SLOWDOWN": "2"}) as sim:
        finished = {}

        def slow_request():
            serving.generate(sim.url, "a long request", 128, timeout=30)
            finished["at"] = time.monotonic()

        t = threading.Thread(target=slow_request)
        t.start()
        deadline = time.monotonic() + 10
        while not serving.in_flight(sim.url) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert serving.in_flight(sim.url) == 1
        result = serving.wait_drained(sim.url, timeout=30, interval=0.1)
        returned = time.monotonic()
        t.join(30)
    assert result.ok and result.state == "drained"
    assert "at" in finished and finished["at"] <= returned
    assert result.waited_s > 0.2


def test_wait_drained_reports_a_service_that_is_gone():
    result = serving.wait_drained(f"http://127.0.0.1:{free_port()}", timeout=5)
    assert result.ok and result.state == "gone"


def test_wait_drained_times_out_while_requests_run():
    with StubEngine(delay=3) as stub:
        threading.Thread(target=serving.generate, args=(stub.url, "x", 8, 10), daemon=True).start()
        time.sleep(0.2)
        result = serving.wait_drained(stub.url, timeout=0.6, interval=0.1)
    assert not result.ok and result.state == "timeout"
    assert "1 requests still in flight" in result.detail and result.in_flight == 1


def test_wait_drained_fails_at_once_without_metrics():
    with StubEngine(metrics=False) as stub:
        start = time.monotonic()
        result = serving.wait_drained(stub.url, timeout=30)
    assert not result.ok and result.state == "no-metrics"
    assert "--enable-metrics" in result.detail
    assert time.monotonic() - start < 5


def test_warmup_waits_until_every_request_finished():
    with StubEngine(delay=0.3) as stub:
        result = serving.warmup(stub.url, requests=3, max_tokens=8, timeout=10)
        assert stub.running == 0 and stub.calls == 3
    assert result.ok and result.completed == 3 and result.failed == 0
    assert result.wall_s >= 0.3


def test_warmup_counts_failed_requests():
    with StubEngine(status=500) as stub:
        result = serving.warmup(stub.url, requests=2, max_tokens=8, timeout=10)
    assert not result.ok and result.failed == 2
    assert any("HTTP 500" in e for e in result.errors)


def test_cli_wait_healthy_and_warmup_against_the_simulator(tmp_path):
    with simulator(tmp_path) as sim:
        healthy = cli("wait-healthy", "--url", sim.url, "--timeout", "10")
        warm = cli("warmup", "--url", sim.url, "--requests", "2", "--max-tokens", "16", "--json")
        drained = cli("wait-drained", "--url", sim.url, "--timeout", "10", "--json")
    assert healthy.returncode == 0 and "service is healthy" in healthy.stdout
    assert warm.returncode == 0, warm.stderr
    data = json.loads(warm.stdout)
    assert data["command"] == "warmup" and data["ok"] is True and data["completed"] == 2
    assert set(data) == {"command", "url", "ok", "requests", "completed", "failed", "wall_s", "errors"}
    assert drained.returncode == 0 and json.loads(drained.stdout)["state"] == "drained"


def test_cli_exit_1_when_nothing_answers():
    url = f"http://127.0.0.1:{free_port()}"
    healthy = cli("wait-healthy", "--url", url, "--timeout", "0.5")
    warm = cli("warmup", "--url", url, "--requests", "1", "--max-tokens", "4", "--timeout", "5")
    assert healthy.returncode == 1 and "did not answer 200 within 0.5 s" in healthy.stderr
    assert warm.returncode == 1 and "0/1 requests finished" in warm.stderr


@pytest.mark.parametrize("args, message", [
    (["wait-healthy", "--url", "localhost:30000", "--timeout", "5"], "--url 'localhost:30000'"),
    (["wait-healthy", "--url", "http://127.0.0.1:1", "--timeout", "-1"], "'-1' must be greater than 0"),
    (["warmup", "--url", "http://127.0.0.1:1", "--requests", "two", "--max-tokens", "4"], "'two' is not a number"),
    (["wait-drained", "--url", "http://127.0.0.1:1"], "--timeout"),
    (["restart", "--url", "http://127.0.0.1:1"], "invalid choice: 'restart'"),
])
def test_cli_misuse_exits_2_with_one_line(args, message):
    out = cli(*args)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_a_unit_that_restarted_before_the_wait_is_not_judged_restarted(monkeypatch):
    """Issue 20: NRestarts is cumulative; a unit that auto-restarted once is not failing now. The controller's
    wait takes its baseline at its start and judges the unit as the deploy's wait does (sglang_http)."""
    props = {"ActiveState": "activating", "NRestarts": "1"}
    monkeypatch.setattr(units, "show", lambda unit, *names: dict(props))
    url = f"http://127.0.0.1:{free_port()}"
    result = serving.wait_healthy(url, timeout=0.3, interval=0.1, unit="u.service")
    assert result.state == "timeout", result  # restarted before the wait: not judged restarted
    seen = []

    def show(unit, *names):  # the baseline read sees 1, every later read 2: it crashed during the wait
        seen.append(unit)
        return {"ActiveState": "activating", "NRestarts": "1" if len(seen) == 1 else "2"}

    monkeypatch.setattr(units, "show", show)
    result = serving.wait_healthy(url, timeout=5, interval=0.1, unit="u.service")
    assert not result.ok and result.state == "exited"
    assert result.detail == (f"u.service restarted 1 time(s) since this start before {url}/health answered 200 "
                             "(see journalctl -u u.service)")


def test_parse_metrics_refuses_what_is_not_prometheus_text():
    with pytest.raises(serving.ServingError, match="not Prometheus text"):
        serving.parse_metrics('sglang:num_running_reqs{model_name="a" 2\n')


def test_parse_metrics_keeps_a_counters_sample_name():
    text = ("# TYPE sglang:num_requests_total counter\n"
            'sglang:num_requests_total{model_name="a"} 4\n'
            "# TYPE sglang:gen_throughput gauge\nsglang:gen_throughput 12.5\n")
    assert serving.parse_metrics(text) == {"sglang:num_requests_total": 4.0, "sglang:gen_throughput": 12.5}
