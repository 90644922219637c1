"""The post-deploy watch (issue 36, docs/monitoring-watch.md): its interval rule against fake /metrics sequences, its
parser against prometheus_client's on the simulator's exposition, the module's arguments, the config section, and
what the record and `make status` show. The lab tests (tests/lab/test_replica_faults.py) prove the plumbing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_records as host_records
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_watch as w
from prometheus_client.parser import text_string_to_metric_families

from sgdeploy import records, spec

ROOT = Path(__file__).resolve().parents[3]
MODULE = ROOT / "collections/ansible_collections/sgdeploy/host/plugins/modules/sglang_watch.py"


def exposition(gen: float, verify: float, finished: float, aborted: float = 0.0) -> str:
    """SGLang 0.5.23's counters as the simulator writes them (split by is_streaming where 0.5.23 splits them)."""
    tok = 'model_name="m",engine_type="unified"'
    half = finished / 2
    return "\n".join([
        "# HELP sglang:num_running_reqs The number of running requests.",
        "# TYPE sglang:num_running_reqs gauge",
        f'sglang:num_running_reqs{{{tok},moe_ep_rank="0",pp_rank="0",tp_rank="0"}} 3.0',
        "# TYPE sglang:generation_tokens_total counter",
        f'sglang:generation_tokens_total{{{tok},is_streaming="true"}} {gen / 4}',
        f'sglang:generation_tokens_total{{{tok},is_streaming="false"}} {gen * 3 / 4}',
        "# TYPE sglang:spec_verify_calls_total counter",
        f"sglang:spec_verify_calls_total{{{tok}}} {verify}",
        "# TYPE sglang:num_requests_total counter",
        f'sglang:num_requests_total{{{tok},is_streaming="true"}} {half}',
        f'sglang:num_requests_total{{{tok},is_streaming="false"}} {finished - half}',
        "# TYPE sglang:num_aborted_requests_total counter",
        f"sglang:num_aborted_requests_total{{{tok}}} {aborted}",
        'odd_label{path="a } b",q="x\\"y"} 1e3',
        "",
    ])


class Fake:
    """A /metrics sequence: counters after each call (the first call is the window's start), and a clock."""

    def __init__(self, steps: list[tuple[float, float, float, float] | Exception]):
        self.steps = list(steps)
        self.t = 0.0
        self.calls = 0

    def fetch(self, url: str) -> dict[str, float]:
        step = self.steps[min(self.calls, len(self.steps) - 1)]
        self.calls += 1
        if isinstance(step, Exception):
            raise step
        return w.parse(exposition(*step))

    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def run(steps, window=20, interval=5, limit=2, speculative=True, **th):
    th = {"min_requests": 4, "min_accept_length": 6.0, "max_error_rate": 0.1} | th
    fake = Fake(steps)
    out = w.watch("http://127.0.0.1:30000", window, interval, limit, w.Thresholds(**th), speculative=speculative,
                  fetch=fake.fetch, clock=fake.clock, sleep=fake.sleep)
    return out, fake


def cumulative(rows: list[tuple[float, float, float, float]]) -> list[tuple[float, float, float, float]]:
    """Per-interval deltas (generated tokens, verify steps, finished, aborted) as counters from zero."""
    out, acc = [(0.0, 0.0, 0.0, 0.0)], [0.0, 0.0, 0.0, 0.0]
    for row in rows:
        acc = [a + b for a, b in zip(acc, row, strict=True)]
        out.append(tuple(acc))
    return out


HEALTHY = (800.0, 100.0, 10.0, 0.0)    # accept length 8, 10 requests, no errors
COLLAPSED = (240.0, 200.0, 10.0, 0.0)  # accept length 1.2
QUIET = (80.0, 10.0, 1.0, 0.0)         # one request: too little traffic


def test_the_parser_sums_what_prometheus_clients_parser_reads():
    text = exposition(1234.0, 150.0, 17.0, 2.0)
    ours = w.parse(text)
    theirs: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in w.COUNTERS:
                theirs[sample.name] = theirs.get(sample.name, 0.0) + sample.value
    assert ours == theirs and ours[w.GENERATION] == 1234.0 and ours[w.FINISHED] == 17.0


def test_the_parser_refuses_a_line_that_is_not_a_sample():
    assert w.parse('x{path="a } b"} 2\nx 3 1700000000\n') == {}
    assert w.parse('x{path="a } b"} 2\nx 3 1700000000\n', names=("x",)) == {"x": 5.0}
    with pytest.raises(w.WatchError, match="line 1 is not a Prometheus sample"):
        w.parse('sglang:num_requests_total{a="b" 1')


def test_steady_traffic_above_the_thresholds_passes_with_every_interval_numbered():
    out, _ = run(cumulative([HEALTHY] * 4))
    assert out["result"] == "passed", out
    assert [i["verdict"] for i in out["intervals"]] == ["pass"] * 4
    first = out["intervals"][0]
    assert first["accept_length"] == 8.0 and first["requests"] == 10 and first["tokens_per_s"] == 160.0
    assert first["error_rate"] == 0.0 and first["seconds"] == 5.0
    assert out["line"].startswith("watch passed over 20 s (4 interval(s) of 5 s: 4 passed, 0 failed")
    assert "accept length 8.00" in out["line"]


def test_failure_limit_consecutive_failures_fail_the_watch_and_stop_it_early():
    out, fake = run(cumulative([HEALTHY, COLLAPSED, COLLAPSED, HEALTHY]), limit=2)
    assert out["result"] == "failed"
    assert [i["verdict"] for i in out["intervals"]] == ["pass", "fail", "fail"]  # stopped after the 2nd failure
    assert fake.calls == 4 and out["seconds"] == 15.0
    assert out["intervals"][1]["reasons"] == ["accept length 1.20 below 6"]
    assert out["line"].startswith("watch FAILED after 3 interval(s) of 5 s: 2 consecutive failed interval(s) "
                                  "(failure_limit 2); interval 3: accept length 1.20 below 6")


def test_a_single_failure_then_recovery_passes():
    out, _ = run(cumulative([COLLAPSED, HEALTHY, COLLAPSED, HEALTHY]), limit=2)
    assert out["result"] == "passed"
    assert [i["verdict"] for i in out["intervals"]] == ["fail", "pass", "fail", "pass"]
    assert out["failed_intervals"] == 2 and out["consecutive_failures"] == 0


def test_too_little_traffic_everywhere_is_inconclusive_never_passed():
    out, _ = run(cumulative([QUIET] * 4))
    assert out["result"] == "inconclusive"
    assert all(i["verdict"] == "inconclusive" for i in out["intervals"])
    assert out["intervals"][0]["reasons"] == ["1 request(s) ended, fewer than min_requests 4"]
    assert "INCONCLUSIVE" in out["line"] and "kept, not passed" in out["line"] and "passed over" not in out["line"]


def test_no_traffic_at_all_is_inconclusive():
    out, _ = run([(0.0, 0.0, 0.0, 0.0)] * 5, window=12, interval=4)
    assert out["result"] == "inconclusive" and len(out["intervals"]) == 3
    assert out["intervals"][0]["requests"] == 0 and out["intervals"][0]["accept_length"] is None


def test_an_inconclusive_interval_neither_counts_nor_breaks_a_run_of_failures():
    out, _ = run(cumulative([COLLAPSED, QUIET, COLLAPSED, HEALTHY]), limit=2)
    assert out["result"] == "failed"
    assert [i["verdict"] for i in out["intervals"]] == ["fail", "inconclusive", "fail"]
    some, _ = run(cumulative([QUIET, HEALTHY, QUIET, QUIET]))
    assert some["result"] == "passed"  # one judged interval passed: not "inconclusive"


def test_errors_throughput_restarts_and_a_silent_metrics_endpoint_fail_intervals():
    errors, _ = run(cumulative([(800.0, 100.0, 8.0, 2.0)] * 4), limit=1)
    assert errors["result"] == "failed"
    assert errors["intervals"][0]["reasons"] == ["error rate 0.200 (2 of 10 aborted) above 0.1"]
    slow, _ = run(cumulative([HEALTHY] * 4), limit=1, min_tokens_per_s=500)
    assert slow["intervals"][0]["reasons"] == ["160.0 tokens/s below 500"]
    restarted, _ = run([(800.0, 100.0, 10.0, 0.0), (10.0, 2.0, 1.0, 0.0)], limit=1)
    assert restarted["intervals"][0]["reasons"] == ["the counters went back: the engine restarted during the interval"]
    down, _ = run([HEALTHY, w.WatchError("/metrics did not answer: Connection refused")], limit=2)
    assert down["result"] == "failed" and down["intervals"][0]["reasons"] == [
        "/metrics did not answer: Connection refused"]
    not_spec, _ = run(cumulative([(800.0, 0.0, 10.0, 0.0)] * 4), limit=1)
    assert not_spec["intervals"][0]["reasons"] == ["no verify steps counted: speculative decoding is not running"]
    ar, _ = run(cumulative([(800.0, 0.0, 10.0, 0.0)] * 4), limit=1, speculative=False)
    assert ar["result"] == "passed" and ar["intervals"][0]["accept_length"] is None


def test_no_accept_minimum_judges_errors_only():
    out, _ = run(cumulative([COLLAPSED] * 4), min_accept_length=None)
    assert out["result"] == "passed"


def _module(args: dict, check: bool = False) -> dict:
    payload = {"ANSIBLE_MODULE_ARGS": {**args, "_ansible_check_mode": check}}
    env = {"PYTHONPATH": str(ROOT / "collections")}
    proc = subprocess.run([sys.executable, str(MODULE)], input=json.dumps(payload), capture_output=True, text=True,
                          timeout=60, env=env)
    return json.loads(proc.stdout)


SETTINGS = {"window_s": 12, "interval_s": 4, "failure_limit": 2, "min_requests": 3, "min_accept_length": 6.0,
            "min_tokens_per_s": None, "max_error_rate": 0.05, "enabled": True}


def test_the_module_in_check_mode_says_what_it_would_watch_and_watches_nothing():
    out = _module({"url": "http://127.0.0.1:9", "settings": SETTINGS}, check=True)
    assert out["result"] == "check" and out["intervals"] == [] and not out.get("failed"), out
    assert out["line"] == ("would watch http://127.0.0.1:9/metrics for 12 s in intervals of 4 s "
                           "(failure_limit 2, min_requests 3)")


@pytest.mark.parametrize("settings, message", [
    ({**SETTINGS, "interval_s": 20}, "settings.interval_s 20 and window_s 12"),
    ({**SETTINGS, "failure_limit": 4}, "settings.failure_limit: 4: must be between 1 and the window's 3 intervals"),
    ({k: v for k, v in SETTINGS.items() if k != "window_s"}, "settings.window_s: missing"),
    ({**SETTINGS, "min_requests": "many"}, "settings.min_requests: 'many': must be a whole number"),
])
def test_the_module_refuses_bad_settings_with_one_line(settings, message):
    out = _module({"url": "http://127.0.0.1:9", "settings": settings})
    assert out.get("failed") and message in out["msg"], out


def _config(tmp_path: Path, watch: dict, name: str = "w") -> Path:
    path = tmp_path / f"{name}.yml"
    path.write_text(json.dumps({"extends": "ddtree-b15", "watch": watch}))
    return path


def test_the_config_section_has_documented_defaults_and_takes_the_gates_accept_minimum(tmp_path):
    config = spec.load(_config(tmp_path, {}), spec.CONFIG_DIR)
    assert config.watch.as_mapping() == {"enabled": False, "window_s": 300, "interval_s": 30, "failure_limit": 3,
                                         "min_requests": 10, "min_accept_length": None, "min_tokens_per_s": None,
                                         "max_error_rate": 0.05}
    resolved = config.watch.resolved(config.gates)
    assert resolved["min_accept_length"] == config.gates.min_accept_length == 8.0
    own = spec.load(_config(tmp_path, {"enabled": True, "min_accept_length": 0}), spec.CONFIG_DIR)
    assert own.watch.resolved(own.gates)["min_accept_length"] is None  # 0: no minimum


@pytest.mark.parametrize("watch, line", [
    ({"interval_s": 60, "window_s": 30}, "watch.interval_s: 60: must be at most watch.window_s (30)"),
    ({"window_s": 12, "interval_s": 4, "failure_limit": 4},
     "watch.failure_limit: 4: must be at most the window's 3 intervals (window_s 12 / interval_s 4), else the "
     "watch never fails"),
    ({"failure_limit": 0}, "watch.failure_limit: 0: must be 1 or more"),
    ({"min_requests": 0}, "watch.min_requests: 0: must be 1 or more"),
    ({"max_error_rate": 1.5}, "watch.max_error_rate: 1.5: must be between 0 and 1"),
    ({"window_s": 0}, "watch.window_s: 0: must be between 1 and 86400 seconds"),
    ({"enabled": "yes"}, "watch.enabled: 'yes': must be true or false"),
    ({"min_accept_length": -1.0}, "watch.min_accept_length: -1.0: must be a number of 0 or more"),
])
def test_the_config_section_refuses_bad_values_with_one_line_each(tmp_path, watch, line):
    with pytest.raises(spec.ConfigError) as err:
        spec.load(_config(tmp_path, watch), spec.CONFIG_DIR)
    assert len(err.value.problems) == 1 and line in err.value.problems[0], err.value.problems


def _record(outcome: str, watch: dict | None, rollback: dict | None = None) -> dict:
    return host_records.build_record(config="c", host="lab1", release="r", outcome=outcome,
                                     started="2026-01-01T00:00:00Z", finished="2026-01-01T00:01:00Z",
                                     rollback=rollback, watch=watch)


def test_the_record_and_status_show_the_watch():
    rolled = _record("rolled_back", {"result": "failed", "line": "watch FAILED ...", "intervals": []},
                     rollback={"cause": "watch", "reason": "WATCH FAILED on lab1 ...", "restored_healthy": True})
    kept = _record("deployed", {"result": "inconclusive", "line": "watch INCONCLUSIVE ...", "intervals": []})
    off = _record("deployed", {"result": "off", "line": "watch did not run: watch.enabled is false", "intervals": []})
    old = _record("deployed", None)
    assert [records.history_rows([r])[0]["watch"] for r in (rolled, kept, off, old)] == [
        "failed", "inconclusive", "off", "-"]
    assert records.what_of(rolled) == "deploy, rolled back by the post-deploy watch"
    table = records.history_table([rolled], every=True).splitlines()
    assert table[0].split()[7] == "watch" and " failed " in table[1]
    with pytest.raises(host_records.RecordError, match="watch 'x' must be an object or null"):
        _record("deployed", "x")  # type: ignore[arg-type]
