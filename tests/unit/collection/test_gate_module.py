"""The gates as the Ansible module sgdeploy.host.sglang_gate (issue 19), run the way Ansible runs a module
on a host, against the stub engine; the same code as the controller's `sgdeploy gate`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from engine_stub import StubEngine
from test_models import run_module

from sgdeploy import gate, records

ROOT = Path(__file__).resolve().parents[3]
FAST = {"bench_requests": 6, "bench_concurrency": 3, "bench_max_tokens": 48, "smoke_max_tokens": 16}


def thresholds(**kw) -> dict:
    return gate.GateThresholds.from_mapping({**FAST, **kw}).to_dict()


def test_the_gate_module_runs_the_gates_and_returns_the_verdicts(tmp_path):
    report = tmp_path / "staged" / "gates.json"
    with StubEngine(tokens=48, verify_ct=12) as stub:  # accept length 4
        rc, result = run_module("sglang_gate", {
            "url": stub.url, "speculative": True, "thresholds": thresholds(min_accept_length=3.0),
            "config": "c", "host": "h", "records_dir": str(tmp_path / "records"), "report_path": str(report)},
            tmp_path)
    assert rc == 0, result
    assert result["passed"] is True and result["failed_gates"] == []
    assert [g["gate"] for g in result["report"]["gates"]] == ["smoke", "throughput", "acceptance"]
    assert result["summary"][-1] == "gates passed" and result["summary"][-2].startswith("bench      ")
    assert json.loads(report.read_text()) == result["report"]
    assert result["baseline_path"] is None


def test_a_failing_gate_is_a_return_value_and_the_baseline_is_the_last_good_record(tmp_path):
    with StubEngine(tokens=48, verify_ct=12) as stub:
        rc, first = run_module("sglang_gate", {"url": stub.url, "speculative": True, "thresholds": thresholds()},
                               tmp_path)
    good = records.build_record(config="c", host="h", release="r", outcome="deployed", started="2026-01-01T00:00:00Z",
                                report=first["report"])
    path = records.write_record(tmp_path / "records", good)
    with StubEngine(tokens=48, verify_ct=24) as stub:  # accept length 2: half the baseline's
        rc, result = run_module("sglang_gate", {
            "url": stub.url, "speculative": True, "thresholds": thresholds(), "config": "c", "host": "h",
            "records_dir": str(tmp_path / "records"), "gates": ["smoke", "acceptance"]}, tmp_path)
    assert rc == 0, result
    assert result["passed"] is False and result["failed_gates"] == ["acceptance"]
    assert result["baseline_path"] == str(path)
    assert "below the last good deploy" in result["report"]["gates"][1]["reason"]


def test_a_canary_benched_beside_an_old_replica_fails_below_it_and_the_record_keeps_both(tmp_path):
    """peer_url (the role sglang_replicas passes replica 1 for the canary): the same-window bench of the old
    replica is a second baseline; the record built from the report holds both numbers."""
    report = tmp_path / "gates.json"
    with StubEngine(tokens=48, verify_ct=24) as canary, StubEngine(tokens=48, verify_ct=12) as old:
        rc, result = run_module("sglang_gate", {
            "url": canary.url, "peer_url": old.url, "speculative": True,
            "thresholds": thresholds(min_accept_length=1.5), "config": "c-r0", "host": "h",
            "records_dir": str(tmp_path / "records"), "report_path": str(report),
            "gates": ["smoke", "acceptance"]}, tmp_path)
        assert old.calls == 6  # the bench only: no smoke on the old replica
    assert rc == 0, result
    assert result["passed"] is False and result["failed_gates"] == ["acceptance"]
    acc = result["report"]["gates"][1]
    assert acc["reason"] == (f"accept_length 2 is 50.0% below the old replica in the same window ({old.url}) (4); "
                             "allowed 10%")
    assert any(line.startswith(f"same window, old replica {old.url}: ") for line in result["summary"])
    rec = records.build_record(config="c-r0", host="h", release="r", outcome="rolled_back",
                               started="2026-01-01T00:00:00Z", report=json.loads(report.read_text()))
    assert rec["same_window"]["url"] == old.url and rec["same_window"]["bench"]["accept_length_mean"] == 4.0
    assert rec["gates"][1]["details"]["same_window"]["value"] == 4.0


def test_check_mode_measures_and_writes_nothing(tmp_path):
    rc, result = run_module("sglang_gate", {"url": "http://127.0.0.1:9", "speculative": True,
                                            "thresholds": thresholds(), "report_path": str(tmp_path / "r.json")},
                            tmp_path, check_mode=True)
    assert rc == 0 and result["changed"] is False and result["passed"] is None
    assert not (tmp_path / "r.json").exists()


def test_an_incomplete_thresholds_mapping_is_refused_in_one_line(tmp_path):
    with StubEngine() as stub:
        rc, result = run_module("sglang_gate", {"url": stub.url, "speculative": False,
                                                "thresholds": {"smoke_max_tokens": 8}}, tmp_path)
    assert rc == 1 and result["failed"]
    assert result["msg"].startswith("gates: gates.smoke_prompt: not given;"), result["msg"]


def test_the_controller_gate_is_the_module_code():
    from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_gate

    for name in ("smoke", "throughput", "acceptance", "run_all", "GateReport", "exactness_gate"):
        assert getattr(gate, name) is getattr(sglang_gate, name), name
    assert issubclass(gate.GateThresholds, sglang_gate.GateThresholds)


def test_render_takes_a_non_default_models_root(tmp_path):
    out = subprocess.run([sys.executable, "-m", "sgdeploy", "render", "ddtree-b15", "--release", "x", "--out",
                          str(tmp_path), "--no-verify", "--json", "--models-root", "/srv/m"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert [m["local_dir"] for m in d["models"]] == ["/srv/m/Qwen--Qwen3.6-27B/main",
                                                      "/srv/m/z-lab--Qwen3.6-27B-DFlash/main"]
    argv = d["argv"]
    assert argv[argv.index("--model-path") + 1] == "/srv/m/Qwen--Qwen3.6-27B/main"
    assert argv[argv.index("--speculative-draft-model-path") + 1] == "/srv/m/z-lab--Qwen3.6-27B-DFlash/main"
    bad = subprocess.run([sys.executable, "-m", "sgdeploy", "render", "ddtree-b15", "--release", "x", "--out",
                          str(tmp_path), "--no-verify", "--models-root", "srv/../m"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2 and "--models-root 'srv/../m': give an absolute folder" in bad.stderr
    assert "Traceback" not in bad.stderr
