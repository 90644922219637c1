"""Gates: verdicts and reasons on measured values, against the simulator and a scripted stub engine."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from engine_stub import ROOT, StubEngine, free_port, simulator

from sgdeploy import bench, gate, records

FAST = {"bench_requests": 6, "bench_concurrency": 3, "bench_max_tokens": 48, "smoke_max_tokens": 16}
DIGEST = bench.prompts_digest(bench.load_prompts())


def thresholds(**kw) -> gate.GateThresholds:
    return gate.GateThresholds.from_mapping({**FAST, **kw})


def bench_dict(**kw) -> dict:
    """A bench result as the gates see it (a finished run of 6 requests)."""
    d = {"requests": 6, "completed": 6, "completed_fraction": 1.0, "concurrency": 3, "max_new_tokens": 48,
         "prompts_digest": DIGEST, "tokens_per_s": 170.0, "accept_length_mean": 15.0, "accept_length_stdev": 0.5,
         "accept_length_requests": 6, "step_time_ms_mean": 87.0, "errors": []}
    d.update(kw)
    return d


def record_with(bench_d: dict, **kw) -> dict:
    gates = [{"gate": g, "metric": "m", "value": 1.0, "threshold": None, "baseline": None, "verdict": "pass",
              "reason": "", "details": {}} for g in gate.GATES]
    return records.build_record(config="ddtree-b15", host="lab1", release="ddtree.fork.topk.abcdef12",
                                outcome="deployed", started="2026-01-01T00:00:00Z",
                                finished="2026-01-01T00:05:00Z", report={"gates": gates, "bench": bench_d}, **kw)


# --- thresholds -------------------------------------------------------------------------------------------

def test_thresholds_default_like_the_config_schema():
    t = gate.GateThresholds.from_mapping({})
    assert t.min_accept_length is None and t.min_tokens_per_s is None
    assert (t.max_regression_pct, t.bench_requests, t.min_completed_fraction) == (10.0, 16, 0.9)
    assert gate.GateThresholds.from_mapping({"min_accept_length": 5}).min_accept_length == 5.0


@pytest.mark.parametrize("mapping, message", [
    ({"min_accept": 5}, "gates.min_accept: unknown setting; allowed: min_accept_length"),
    ({"min_accept_length": "high"}, "gates.min_accept_length: 'high' is not allowed; give a number"),
    ({"max_regression_pct": 150}, "gates.max_regression_pct: 150 is not allowed; give a percentage between 0"),
    ({"bench_requests": 0}, "gates.bench_requests: 0 is not allowed; give a whole number of 1 or more"),
    ({"bench_concurrency": True}, "gates.bench_concurrency: True is not allowed"),
    ({"min_completed_fraction": 0}, "gates.min_completed_fraction: 0 is not allowed; give a fraction"),
])
def test_thresholds_name_the_key_the_value_and_what_is_allowed(mapping, message):
    with pytest.raises(gate.GateError) as err:
        gate.GateThresholds.from_mapping(mapping)
    assert message in str(err.value)


def test_the_gate_and_the_config_schema_define_the_thresholds_once(tmp_path):
    # Same keys, same defaults: the config schema's gates section and GateThresholds must never diverge.
    from sgdeploy import spec

    schema = spec.SCHEMA["gates"]
    assert list(gate.GateThresholds().to_dict()) == list(schema)
    assert gate.GateThresholds().to_dict() == {k: v[1] for k, v in schema.items()}
    bare = tmp_path / "bare.yml"  # a config that sets no gate: it gets exactly the gate's defaults
    bare.write_text(json.dumps({"model": {"path": "a/b", "revision": "main", "recurrent_layers": False},
                                "serving": {"attention_backend": "triton"}}))
    assert spec.load(bare).gates.as_mapping() == gate.GateThresholds().to_dict()


def test_one_change_to_the_gates_definition_reaches_the_config_schema_and_the_gate():
    # Change a default and a bound in sgdeploy.gate_schema only, before anything else is imported: the
    # config schema and GateThresholds both follow (they read the one definition, they do not copy it).
    code = ("import dataclasses, sgdeploy.gate_schema as s\n"
            "s.FIELDS['bench_requests'] = dataclasses.replace(s.FIELDS['bench_requests'], default=7, "
            "ok=lambda v: v >= 5, allowed='give 5 or more')\n"
            "s.DEFAULTS['bench_requests'] = 7\n"
            "from sgdeploy import gate, spec\n"
            "assert spec.SCHEMA['gates']['bench_requests'] == ('int', 7)\n"
            "assert gate.GateThresholds().bench_requests == 7\n"
            "try:\n    gate.GateThresholds.from_mapping({'bench_requests': 4})\nexcept gate.GateError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "gates.bench_requests: 4 is not allowed; give 5 or more"


@pytest.mark.parametrize("key, value", [
    ("max_regression_pct", 150), ("max_regression_pct", -1), ("max_regression_pct", 0), ("min_accept_length", -0.5),
    ("min_completed_fraction", 0), ("min_completed_fraction", 1), ("bench_requests", 0), ("warmup_requests", 0),
    ("warmup_requests", -1), ("smoke_prompt", "  "), ("exactness_tie_tolerance", 0), ("exactness_tie_tolerance", 0.05),
    ("exactness_tie_tolerance", 6), ("exactness_concurrency", 0), ("exactness_require_reference", True),
    ("exactness_inconclusive", "maybe"), ("exactness_inconclusive", "warn"),
])
def test_the_gate_and_a_config_accept_and_refuse_the_same_values(tmp_path, key, value):
    from sgdeploy import spec

    path = tmp_path / "c.yml"
    path.write_text(json.dumps({"extends": "ddtree-b15", "gates": {key: value}}))
    try:
        spec.load(path)
        config_ok = True
    except spec.ConfigError as err:
        config_ok = False
        assert f"gates.{key}" in str(err)
    try:
        gate.GateThresholds.from_mapping({key: value})
        gate_ok = True
    except gate.GateError:
        gate_ok = False
    assert config_ok == gate_ok


# --- throughput and acceptance on given values ---------------------------------------------------------------

def test_acceptance_fails_below_the_minimum_naming_value_and_threshold():
    r = gate.acceptance(bench_dict(accept_length_mean=4.1), thresholds(min_accept_length=10))
    assert (r.verdict, r.value, r.threshold, r.baseline) == ("fail", 4.1, 10.0, None)
    assert "accept_length 4.1 is below the minimum 10 (59.0% short)" in r.reason


def test_acceptance_fails_on_regression_against_the_last_good_deploy():
    base = record_with(bench_dict(accept_length_mean=15.1))
    r = gate.acceptance(bench_dict(accept_length_mean=4.1), thresholds(min_accept_length=2), base)
    assert r.verdict == "fail" and r.baseline == 15.1
    assert r.reason == "accept_length 4.1 is 72.8% below the last good deploy (15.1); allowed 10%"


def test_regression_within_the_allowance_passes_and_says_by_how_much():
    r = gate.throughput(bench_dict(tokens_per_s=160.0), thresholds(max_regression_pct=10),
                        bench_dict(tokens_per_s=170.0))
    assert r.verdict == "pass" and r.baseline == 170.0
    assert "5.9% below the last good deploy (170); allowed 10% below" in r.reason


def test_throughput_fails_on_both_counts_and_names_both():
    r = gate.throughput(bench_dict(tokens_per_s=90.0), thresholds(min_tokens_per_s=100),
                        bench_dict(tokens_per_s=173.4))
    assert r.verdict == "fail"
    assert "tokens_per_s 90 is below the minimum 100 (10.0% short)" in r.reason
    assert "48.1% below the last good deploy (173.4)" in r.reason


def test_a_baseline_measured_differently_is_not_compared():
    r = gate.throughput(bench_dict(tokens_per_s=90.0), thresholds(),
                        bench_dict(tokens_per_s=173.4, concurrency=8))
    assert r.verdict == "pass" and r.baseline is None
    assert "measured differently (concurrency 8 vs 3): not compared" in r.reason


def test_too_few_completed_requests_is_inconclusive():
    b = bench_dict(completed=3, completed_fraction=0.5,
                   errors=[{"message": "/generate failed: Connection refused", "count": 3}])
    for result in (gate.throughput(b, thresholds()), gate.acceptance(b, thresholds())):
        assert result.verdict == "inconclusive" and result.value is None
        assert "only 3 of 6 bench requests completed (50%); the gate needs 90%" in result.reason
        assert "Connection refused (x3)" in result.reason


def test_acceptance_of_a_non_speculative_config_passes_as_not_speculative():
    r = gate.acceptance(bench_dict(accept_length_requests=0, accept_length_mean=None), thresholds(), None,
                        speculative=False)
    assert r.verdict == "pass" and r.value is None and r.reason.startswith("not speculative")


def test_acceptance_fails_when_a_speculative_config_reports_no_spec_metrics():
    r = gate.acceptance(bench_dict(accept_length_requests=0, accept_length_mean=None), thresholds())
    assert r.verdict == "fail" and "speculative decoding is not running" in r.reason


# --- smoke against a scripted stub -----------------------------------------------------------------------------

@pytest.mark.parametrize("stub_kw, speculative, verdict, words", [
    ({}, True, "pass", "answered 16 tokens twice, identically; spec_verify_ct 4, accept length 4"),
    ({"text": "   "}, True, "fail", "answer 1 of 2 is empty"),
    ({"text": " Par\ufffd\x00\x07is"}, True, "fail", "answer 1 of 2 is garbled: 3 replacement or control"),
    ({"text": lambda n: f" answer number {n}"}, True, "fail", "two identical greedy requests gave different"),
    ({"verify_ct": None}, True, "fail", "spec_verify_ct None: no speculative metrics"),
    ({"verify_ct": None}, False, "pass", "answered 16 tokens twice, identically"),
    ({"status": 500}, True, "fail", "request 1 of 2 failed: /generate answered HTTP 500"),
])
def test_smoke(stub_kw, speculative, verdict, words):
    with StubEngine(**stub_kw) as stub:
        r = gate.smoke(stub.url, thresholds(), speculative)
    assert r.gate == "smoke" and r.verdict == verdict
    assert words in r.reason


def test_smoke_fails_when_nothing_answers():
    r = gate.smoke(f"http://127.0.0.1:{free_port()}", thresholds(), True, timeout=5)
    assert r.verdict == "fail" and "Connection refused" in r.reason


def test_a_failed_smoke_skips_the_other_gates_as_inconclusive():
    with StubEngine(text="") as stub:
        report = gate.run_all(stub.url, thresholds(), True)
        assert stub.calls == 2  # the smoke gate's two requests, and no bench traffic after it failed
    assert [(r.gate, r.verdict) for r in report.results] == [
        ("smoke", "fail"), ("throughput", "inconclusive"), ("acceptance", "inconclusive")]
    assert report.results[1].reason == "skipped: the smoke gate failed"
    assert not report.passed and report.failed_gates == ["smoke", "throughput", "acceptance"]
    assert report.bench is None


# --- all gates against the simulator ----------------------------------------------------------------------------

def test_a_healthy_ddtree_engine_passes_every_gate(tmp_path):
    with simulator(tmp_path) as sim:
        report = gate.run_all(sim.url, thresholds(min_accept_length=5, min_tokens_per_s=50), True)
    assert [r.gate for r in report.results] == ["smoke", "throughput", "acceptance"]
    assert report.passed, report.summary()
    assert report.failed_gates == []
    assert report.results[2].value > 5 and report.results[1].value > 50
    lines = report.summary().splitlines()
    assert len(lines) == 3 and lines[0].startswith("smoke") and "PASS" in lines[0]


@pytest.mark.slow  # several seconds: `make test-slow`
def test_collapsed_acceptance_fails_the_acceptance_gate(tmp_path):
    with simulator(tmp_path, env={"SGLANG_SIM_ACCEPT_OVERRIDE": "2"}) as sim:
        report = gate.run_all(sim.url, thresholds(min_accept_length=5), True)
    smoke_r, _, acc = report.results
    assert smoke_r.verdict == "pass"
    assert acc.verdict == "fail" and acc.value < 3 and acc.threshold == 5.0
    assert f"accept_length {gate._num(acc.value)} is below the minimum 5" in acc.reason
    assert report.failed_gates == ["acceptance"]


@pytest.mark.slow  # several seconds: `make test-slow`
def test_regression_against_a_measured_baseline_fails_with_the_percentage(tmp_path):
    t = thresholds(min_accept_length=1.5)
    with simulator(tmp_path) as sim:
        good = gate.run_all(sim.url, t, True)
    assert good.passed
    baseline = record_with(good.bench.to_dict())
    with simulator(tmp_path, env={"SGLANG_SIM_ACCEPT_OVERRIDE": "4", "SGLANG_SIM_SLOWDOWN": "2"}) as sim:
        bad = gate.run_all(sim.url, t, True, baseline)
    thr, acc = bad.results[1], bad.results[2]
    base_acc = good.bench.accept_length_mean
    assert acc.verdict == "fail" and acc.baseline == pytest.approx(base_acc)
    drop = 100 * (base_acc - acc.value) / base_acc
    assert f"is {drop:.1f}% below the last good deploy ({gate._num(base_acc)}); allowed 10%" in acc.reason
    assert thr.verdict == "fail" and "below the last good deploy" in thr.reason
    assert bad.baseline == {"config": "ddtree-b15", "host": "lab1", "release": "ddtree.fork.topk.abcdef12",
                            "finished": "2026-01-01T00:05:00Z"}


def test_requests_failing_mid_bench_make_the_bench_gates_inconclusive(tmp_path):
    # The smoke gate's two requests complete; the engine dies after the fourth completed request.
    with simulator(tmp_path, env={"SGLANG_SIM_CRASH_AFTER": "4"}) as sim:
        report = gate.run_all(sim.url, thresholds(bench_concurrency=1), True)
    assert [r.verdict for r in report.results] == ["pass", "inconclusive", "inconclusive"]
    assert "only 2 of 6 bench requests completed (33%)" in report.results[1].reason
    assert report.failed_gates == ["throughput", "acceptance"]


# --- command line -----------------------------------------------------------------------------------------------

def gate_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sgdeploy.gate", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


REPORT_KEYS = {"schema", "url", "speculative", "passed", "all_passed", "verdict_line", "failed_gates", "gates",
               "exactness", "bench", "baseline",
               "same_window", "thresholds", "started", "finished"}
RESULT_KEYS = {"gate", "metric", "value", "threshold", "baseline", "verdict", "reason", "details"}


@pytest.mark.slow  # several seconds: `make test-slow`
def test_cli_exit_0_and_1_with_the_json_report(tmp_path):
    config = tmp_path / "render.json"
    config.write_text(json.dumps({"config": "ddtree-b15", "speculative": True,
                                  "gates": {**FAST, "min_accept_length": 5}}))
    with simulator(tmp_path) as sim:
        ok = gate_cli("--url", sim.url, "--config-json", str(config), "--out", str(tmp_path / "ok.json"))
        smoke_only = gate_cli("--url", sim.url, "--config-json", str(config), "--only", "smoke", "--json")
    with simulator(tmp_path, env={"SGLANG_SIM_ACCEPT_OVERRIDE": "2"}) as sim:
        bad = gate_cli("--url", sim.url, "--thresholds-json", json.dumps({**FAST, "min_accept_length": 5}),
                       "--speculative", "--out", str(tmp_path / "bad.json"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.splitlines()[-1] == "gates passed"
    report = json.loads((tmp_path / "ok.json").read_text())
    assert set(report) == REPORT_KEYS and report["passed"] is True
    assert [g["gate"] for g in report["gates"]] == ["smoke", "throughput", "acceptance"]
    assert all(set(g) == RESULT_KEYS for g in report["gates"])
    assert bench.BenchResult.from_dict(report["bench"]).completed == 6

    assert smoke_only.returncode == 0
    assert [g["gate"] for g in json.loads(smoke_only.stdout)["gates"]] == ["smoke"]

    assert bad.returncode == 1
    assert "gates failed: acceptance" in bad.stdout and "below the minimum 5" in bad.stdout
    bad_report = json.loads((tmp_path / "bad.json").read_text())
    assert bad_report["failed_gates"] == ["acceptance"] and bad_report["gates"][2]["verdict"] == "fail"


def test_cli_uses_a_baseline_record_file(tmp_path):
    path = records.write_record(tmp_path, record_with(bench_dict(accept_length_mean=15.1, tokens_per_s=1.0)))
    with StubEngine(tokens=48, verify_ct=12) as stub:  # accept length 4
        out = gate_cli("--url", stub.url, "--thresholds-json", json.dumps(FAST), "--speculative",
                       "--baseline", str(path), "--json")
    assert out.returncode == 1
    acc = json.loads(out.stdout)["gates"][2]
    assert acc["verdict"] == "fail" and acc["baseline"] == 15.1
    assert acc["reason"].startswith("accept_length 4 is 73.5% below the last good deploy (15.1)")


@pytest.mark.parametrize("args, message", [
    (["--thresholds-json", '{"min_accept": 3}', "--speculative"], "gates.min_accept: unknown setting"),
    (["--thresholds-json", "{nope", "--speculative"], "--thresholds-json '{nope': not JSON"),
    (["--thresholds-json", "{}"], "say --speculative or --no-speculative"),
    (["--config-json", "/nonexistent.json", "--speculative"], "--config-json /nonexistent.json: cannot read it"),
    (["--thresholds-json", "{}", "--speculative", "--baseline", "/nonexistent.json"],
     "/nonexistent.json: cannot read it"),
    (["--thresholds-json", "{}", "--speculative", "--only", "bench"], "invalid choice: 'bench'"),
    (["--thresholds-json", "{}", "--speculative", "--out", "/nonexistent/dir/r.json"],
     "--out /nonexistent/dir/r.json: its folder does not exist"),
])
def test_cli_misuse_exits_2_with_one_line(args, message):
    out = gate_cli("--url", "http://127.0.0.1:1", *args)
    assert out.returncode == 2, out.stdout
    assert message in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_cli_rejects_a_bad_url():
    out = gate_cli("--url", "127.0.0.1:30000", "--thresholds-json", "{}", "--speculative")
    assert out.returncode == 2 and "--url '127.0.0.1:30000' is not a service address" in out.stderr
