"""Sweep planning and its restore guarantee, without hosts (issue 10).

The variant configs are written and validated for real; the ansible deploys, the bench and the SSH
calls are replaced by fakes that record what the sweep asked for, so that the order of deploys,
the exit codes and the restore after a failure, Ctrl-C or SIGTERM can be checked in a second.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import types
from pathlib import Path

import pytest
import yaml

from sgdeploy import bench, gate, serving, spec, sweep, tunnel

REPO = Path(__file__).resolve().parents[3]


def inventory(tmp_path, hosts=("gpu-a", "gpu-b")) -> Path:
    inv = tmp_path / "inv.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {
        "gpu_hosts": {"hosts": {h: {"ansible_host": f"127.0.9.{i}", "ansible_user": "root", "gpu_count": 8}
                                for i, h in enumerate(hosts, 1)}},
        "other": {"hosts": {"db-1": {"ansible_host": "127.0.9.99"}}}}}}))
    return inv


# --------------------------------------------------------------------------------------------------
# Variant configs


def test_variant_names_files_and_budgets(tmp_path):
    base = spec.load("ddtree-b15")
    variants = sweep.plan_variants(base, [8, 32], [4, 8], tmp_path)
    assert [v.name for v in variants] == ["ddtree-b15-b8-k4", "ddtree-b15-b8-k8", "ddtree-b15-b32-k4",
                                          "ddtree-b15-b32-k8"]
    for v in variants:
        assert v.path == tmp_path / f"{v.name}.yml"
        data = yaml.safe_load(v.path.read_text())
        assert data["extends"] == "ddtree-b15"
        loaded = spec.load(v.path)
        assert (loaded.name, loaded.speculative.budget, loaded.speculative.topk_cap) == (v.name, v.budget, v.topk_cap)
        # Everything else comes from the base: same GPU and port, so each deploy replaces the previous one.
        assert loaded.serving == base.serving and loaded.speculative.state_forking is True


def test_state_leak_is_set_only_above_block_size_minus_one_without_forking(tmp_path):
    nofork = sweep.plan_variants(spec.load("ddtree-b15-nofork"), [8, 15, 16, 64], None, tmp_path / "a")
    assert [(v.budget, v.reproduce_state_leak) for v in nofork] == [(8, False), (15, False), (16, True), (64, True)]
    for v in nofork:
        raw = yaml.safe_load(v.path.read_text())["speculative"]
        assert raw.get("reproduce_state_leak", False) is v.reproduce_state_leak
        assert spec.load(v.path).speculative.reproduce_state_leak is v.reproduce_state_leak
    fork = sweep.plan_variants(spec.load("ddtree-b15"), [8, 64], None, tmp_path / "b")
    assert [v.reproduce_state_leak for v in fork] == [False, False]
    assert all("reproduce_state_leak" not in yaml.safe_load(v.path.read_text())["speculative"] for v in fork)


def test_a_base_that_opts_into_the_leak_is_switched_off_where_it_is_not_needed(tmp_path):
    variants = sweep.plan_variants(spec.load("ddtree-b64-nofork"), [8, 64], None, tmp_path)
    assert [spec.load(v.path).speculative.reproduce_state_leak for v in variants] == [False, True]


def test_without_caps_the_base_cap_is_kept_but_never_above_the_budget(tmp_path):
    variants = sweep.plan_variants(spec.load("ddtree-b15"), [4, 15], None, tmp_path)
    assert [(v.budget, v.topk_cap, v.name) for v in variants] == [(4, 4, "ddtree-b15-b4-k4"),
                                                                  (15, 8, "ddtree-b15-b15-k8")]


def test_a_base_outside_configs_is_found_by_its_variants(tmp_path):
    base = spec.load(REPO / "tests" / "lab" / "configs" / "lab-port-31000.yml")
    (v,) = sweep.plan_variants(base, [32], None, tmp_path)
    assert spec.load(v.path).serving.port == 31000
    assert (tmp_path / "lab-port-31000.yml").is_file()


# --------------------------------------------------------------------------------------------------
# Bad input: exit 2, one line, nothing deployed


@pytest.fixture
def no_deploys(monkeypatch):
    calls = []

    def fail(*a, **k):
        calls.append(a)
        raise AssertionError("nothing may be deployed or contacted")

    monkeypatch.setattr(sweep.Sweep, "deploy", fail)
    monkeypatch.setattr(sweep.Sweep, "running_before", fail)
    monkeypatch.setattr(sweep, "BUILD_DIR", Path("/nonexistent-sweep-build"))
    return calls


def run_main(capsys, *argv):
    try:
        code = sweep.main(list(argv))
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_a_non_ddtree_base_is_rejected(tmp_path, capsys, no_deploys):
    code, out, err = run_main(capsys, "--config", "dflash-b16", "--budgets", "8 15", "--inventory",
                              str(inventory(tmp_path)))
    assert code == 2 and out == ""
    assert err.strip() == ("python -m sgdeploy.sweep: --config dflash-b16: speculative.algorithm is DFLASH; "
                           "a budget sweep needs a DDTREE config (e.g. ddtree-b15)")
    assert "Traceback" not in err and no_deploys == []


def test_a_config_with_replicas_behind_the_router_is_refused_with_what_to_sweep_instead(tmp_path, capsys,
                                                                                        no_deploys):
    config = sweep.REPO_ROOT / "tests" / "lab" / "configs" / "lab-replicas-b15.yml"
    code, out, err = run_main(capsys, "--config", str(config), "--budgets", "8 15", "--inventory",
                              str(inventory(tmp_path)))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"python -m sgdeploy.sweep: --config {config}: serving.replicas 2 behind the router on "
                          "port 31200 is not swept"), err
    assert ("sweep one engine instead: a config with 'extends: lab-replicas-b15' and serving: {replicas: 1, "
            "router: false, gpus: [<1 free GPU(s)>], port: <a free port>}") in err
    assert "Traceback" not in err and no_deploys == []


def test_a_bad_budget_fails_before_any_deploy(tmp_path, capsys, no_deploys, monkeypatch):
    monkeypatch.setattr(sweep, "BUILD_DIR", tmp_path / "build")
    code, out, err = run_main(capsys, "--config", "ddtree-b15", "--budgets", "8 15 300", "--inventory",
                              str(inventory(tmp_path)), "--out", str(tmp_path / "reports"))
    assert code == 2 and no_deploys == []
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert "budget 300 cap 8:" in lines[0] and "speculative.budget: 300: must be between 1 and 256" in lines[0]
    assert not (tmp_path / "reports").exists()


@pytest.mark.parametrize("args, message", [
    (["--budgets", "8 x"], "--budgets '8 x': 'x' is not a whole number"),
    (["--budgets", "8 8"], "--budgets '8 8': budget 8 is given twice"),
    (["--budgets", " "], "--budgets ' ': give at least one budget"),
    (["--budgets", "8", "--topk-caps", "4 20"], "speculative.topk_cap: 20: must be between 1 and 16"),
    (["--budgets", "8", "--cliff-drop", "1.5"], "argument --cliff-drop: '1.5': must be a fraction above 0 and below 1"),
    (["--budgets", "8", "--tie-tolerance", "0.5"],
     "argument --tie-tolerance: '0.5': must be a fraction from 0 up to below 0.5"),
    (["--budgets", "8", "--requests", "0"], "argument --requests: '0' must be greater than 0"),
    (["--budgets", "8", "--host", "db-1"], "--host db-1: not in group gpu_hosts of"),
    (["--budgets", "8", "--batches", "1 0"], "--batches '1 0': batch size 0 must be 1 or more"),
    (["--budgets", "8", "--batches", "1 x"], "--batches '1 x': 'x' is not a whole number"),
    (["--budgets", "8", "--topk-caps", "4 8", "--batches", "1 4"],
     "--batches with --topk-caps 4 8: a budget schedule keeps one top-k cap; give one cap"),
])
def test_bad_arguments_name_the_option_and_value(tmp_path, capsys, no_deploys, monkeypatch, args, message):
    monkeypatch.setattr(sweep, "BUILD_DIR", tmp_path / "build")
    code, out, err = run_main(capsys, "--config", "ddtree-b15", "--inventory", str(inventory(tmp_path)), *args)
    assert code == 2, err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_missing_inventory_and_an_empty_group(tmp_path, capsys, no_deploys):
    code, _, err = run_main(capsys, "--config", "ddtree-b15", "--budgets", "8", "--inventory",
                            str(tmp_path / "nope.yml"))
    assert code == 2 and f"--inventory {tmp_path / 'nope.yml'}: no such file" in err
    empty = tmp_path / "empty.yml"
    empty.write_text(yaml.safe_dump({"all": {"children": {"web": {"hosts": {"w1": {}}}}}}))
    code, _, err = run_main(capsys, "--config", "ddtree-b15", "--budgets", "8", "--inventory", str(empty))
    assert code == 2 and "group gpu_hosts has no hosts" in err


def test_the_host_defaults_to_the_first_gpu_host(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "BUILD_DIR", tmp_path / "build")
    args = sweep.build_parser().parse_args(["--config", "ddtree-b15", "--budgets", "8 32", "--inventory",
                                            str(inventory(tmp_path)), "--out", str(tmp_path / "r")])
    s = sweep.prepare(args)
    assert s.host == "gpu-a" and s.hostvars["ansible_host"] == "127.0.9.1"
    assert s.target.address == "127.0.9.1" and s.target.user == "root"
    assert s.requests == 12 and s.max_tokens == 96  # the config's bench settings
    assert s.report_dir.parent == (tmp_path / "r").resolve() and s.report_dir.name.startswith("ddtree-b15-")
    assert [v.path.parent for v in s.variants] == [tmp_path / "build" / s.sweep_id / "configs"] * 2


# --------------------------------------------------------------------------------------------------
# The run: deploy order, exit codes and the restore, with fake deploys and benches


def fake_bench(url, acc, tps, completed=4):
    return bench.BenchResult(
        url=url, requests=4, concurrency=4, max_new_tokens=96, prompts_digest="x", started="", wall_s=2.0,
        completed=completed, failed=4 - completed, completed_fraction=completed / 4,
        total_completion_tokens=96 * completed, tokens_per_s=tps, accept_length_mean=acc, accept_length_stdev=0.2,
        accept_length_requests=completed, step_time_ms_mean=85.0, latency_s_mean=1.0)


class Fake:
    """Stands in for ansible-playbook, the SSH tunnel, the service and the host; records the calls. The gates
    are the real gate code (``gate.throughput``, ``gate.acceptance``, the config's thresholds) over a fake
    bench: accept length 15 up to budget 15, 7 above (``curve`` changes it), tokens/s 11.5 per accepted token."""

    def __init__(self, before=("ddtree-b15",), fail=(), interrupt_at=None, signal_at=None, restore_ok=True,
                 curve=None, exactness=None):
        self.before, self.fail, self.restore_ok = list(before), set(fail), restore_ok
        self.interrupt_at, self.signal_at = interrupt_at, signal_at
        self.curve = curve or (lambda b: (15.0 if b <= 15 else 7.0, (15.0 if b <= 15 else 7.0) * 11.5))
        # None: every variant's deploy recorded exactness pass (the deploy's gate always decides since issue 33)
        self.exactness = exactness
        self.calls: list[tuple] = []
        self.gate_calls: list[dict] = []
        self.deployed_budget = None

    def install(self, monkeypatch):
        fake = self

        def deploy(s, config, gate_mode, log, protect):
            name = Path(str(config)).stem
            fake.calls.append(("deploy", name, gate_mode))
            if gate_mode == "smoke":
                fake.deployed_budget = int(name.rsplit("-b", 1)[1].split("-k")[0])
            ok = name not in fake.fail and (gate_mode == "smoke" or fake.restore_ok)
            return sweep.DeployResult(ok, 1.0, "" if ok else f"DEPLOY FAILED on lab1: {name}", log)

        @contextlib.contextmanager
        def forward(target, remote_port, remote_host="127.0.0.1", local_port=None):
            yield "http://127.0.0.1:45678"

        def run_all(url, thresholds, speculative, baseline=None, only=None, prompts=None, bench_timeout=600.0,
                    **kw):
            budget = fake.deployed_budget
            fake.calls.append(("bench", budget))
            fake.gate_calls.append({"url": url, "speculative": speculative, "only": only, "kw": kw,
                                    "bench_requests": thresholds.bench_requests,
                                    "bench_max_tokens": thresholds.bench_max_tokens,
                                    "min_accept_length": thresholds.min_accept_length})
            if budget == fake.interrupt_at:
                raise KeyboardInterrupt("SIGINT")
            if budget == fake.signal_at:
                os.kill(os.getpid(), signal.SIGTERM)
            acc, tps = fake.curve(budget)
            b = fake_bench(url, acc, tps)
            smoke = gate.GateResult("smoke", "deterministic_answer", 32.0, None, None, "pass", "answered")
            return gate.GateReport(url, speculative, thresholds,
                                         [smoke, gate.throughput(b, thresholds),
                                          gate.acceptance(b, thresholds)], bench=b)

        def cleanup(s, stop):
            fake.calls.append(("cleanup", stop))
            return None

        monkeypatch.setattr(sweep.Sweep, "deploy", deploy)
        monkeypatch.setattr(tunnel, "forward", forward)
        monkeypatch.setattr(gate, "run_all", run_all)
        monkeypatch.setattr(serving, "wait_drained",
                            lambda url, timeout: types.SimpleNamespace(ok=True, state="drained", detail=""))
        monkeypatch.setattr(sweep.Sweep, "exactness_of",
                            lambda s, v, seen=None: ({"verdict": "pass", "reason": "ok"} if fake.exactness is None
                                                     else fake.exactness.get(v.budget)))
        monkeypatch.setattr(sweep.Sweep, "running_before", lambda s: list(fake.before))
        monkeypatch.setattr(sweep.Sweep, "cleanup_variants", cleanup)


def start(tmp_path, monkeypatch, fake, budgets="8 15 32", *options, config="ddtree-b15-nofork"):
    fake.install(monkeypatch)
    monkeypatch.setattr(sweep, "BUILD_DIR", tmp_path / "build")
    args = sweep.build_parser().parse_args(["--config", config, "--budgets", budgets, *options,
                                            "--inventory", str(inventory(tmp_path)), "--out", str(tmp_path / "r")])
    s = sweep.prepare(args)
    code, results = s.run()
    return code, results, s


def test_a_complete_sweep_deploys_one_variant_at_a_time_then_restores(tmp_path, monkeypatch, capsys):
    fake = Fake()
    code, results, s = start(tmp_path, monkeypatch, fake)
    assert code == 0
    assert fake.calls == [
        ("deploy", "ddtree-b15-nofork-b8-k8", "smoke"), ("bench", 8),
        ("deploy", "ddtree-b15-nofork-b15-k8", "smoke"), ("bench", 15),
        ("deploy", "ddtree-b15-nofork-b32-k8", "smoke"), ("bench", 32),
        ("deploy", "ddtree-b15", "full"), ("cleanup", False)]
    assert results["restored"] == "ddtree-b15" and results["cliff"]["budget"] == 32
    out = capsys.readouterr().out
    assert "[2/3] budget 15 cap 8: accept 15.0 (sd 0.2), 172.5 tok/s, step 85 ms, 4/4 requests" in out
    on_disk = json.loads((s.report_dir / "results.json").read_text())
    assert on_disk["restored"] == "ddtree-b15" and len(on_disk["variants"]) == 3


def test_a_failed_variant_is_a_failed_row_exit_1_and_the_host_is_restored(tmp_path, monkeypatch):
    fake = Fake(fail={"ddtree-b15-nofork-b15-k8"})
    code, results, _ = start(tmp_path, monkeypatch, fake)
    assert code == 1
    assert [r["status"] for r in results["variants"]] == ["ok", "failed", "ok"]
    assert results["variants"][1]["error"].startswith("deploy failed: DEPLOY FAILED on lab1")
    assert fake.calls[-2:] == [("deploy", "ddtree-b15", "full"), ("cleanup", False)]


def test_ctrl_c_stops_the_sweep_restores_and_exits_130(tmp_path, monkeypatch):
    fake = Fake(interrupt_at=15)
    code, results, s = start(tmp_path, monkeypatch, fake)
    assert code == 130
    assert ("deploy", "ddtree-b15-nofork-b32-k8", "smoke") not in fake.calls
    assert fake.calls[-2:] == [("deploy", "ddtree-b15", "full"), ("cleanup", False)]
    assert results["interrupted"] is True and len(results["variants"]) == 1
    assert (s.report_dir / "sweep.png").is_file()


def test_sigterm_is_handled_like_ctrl_c(tmp_path, monkeypatch):
    fake = Fake(signal_at=8)
    handler_before = signal.getsignal(signal.SIGTERM)
    code, results, _ = start(tmp_path, monkeypatch, fake)
    assert code == 130 and results["interrupted"] is True
    assert fake.calls[-2:] == [("deploy", "ddtree-b15", "full"), ("cleanup", False)]
    assert signal.getsignal(signal.SIGTERM) == handler_before  # the sweep's handler is gone again


def test_nothing_ran_before_so_the_variants_are_stopped_and_disabled(tmp_path, monkeypatch):
    fake = Fake(before=())
    code, results, _ = start(tmp_path, monkeypatch, fake, budgets="8")
    assert code == 0 and results["restored"] is None
    assert fake.calls[-1] == ("cleanup", True)
    assert not any(c[0] == "deploy" and c[2] == "full" for c in fake.calls)


def test_a_failed_restore_exits_1_and_leaves_the_variant_units_alone(tmp_path, monkeypatch, capsys):
    fake = Fake(restore_ok=False)
    code, results, _ = start(tmp_path, monkeypatch, fake, budgets="8")
    assert code == 1 and results["restored"] is None and results["restore"]["ok"] is False
    assert ("cleanup", False) not in fake.calls
    assert "RESTORE FAILED on gpu-a: deploying ddtree-b15 again failed" in capsys.readouterr().out


def test_an_unexpected_bench_error_fails_the_row_and_still_restores(tmp_path, monkeypatch):
    fake = Fake()
    fake.install(monkeypatch)

    def broken(s, v):
        raise RuntimeError("tunnel thread died")

    monkeypatch.setattr(sweep.Sweep, "measure", broken)
    monkeypatch.setattr(sweep, "BUILD_DIR", tmp_path / "build")
    args = sweep.build_parser().parse_args(["--config", "ddtree-b15", "--budgets", "8", "--inventory",
                                            str(inventory(tmp_path)), "--out", str(tmp_path / "r")])
    code, results = sweep.prepare(args).run()
    assert code == 1
    assert results["variants"][0]["status"] == "failed"
    assert results["variants"][0]["error"] == "bench failed: tunnel thread died"
    assert fake.calls[-2:] == [("deploy", "ddtree-b15", "full"), ("cleanup", False)]


def test_an_unreachable_host_deploys_nothing(tmp_path, monkeypatch, capsys):
    fake = Fake()
    fake.install(monkeypatch)

    def unreachable(s):
        raise sweep.tunnel.TunnelError("ssh root@127.0.9.1: NoValidConnectionsError: Unable to connect")

    monkeypatch.setattr(sweep.Sweep, "running_before", unreachable)
    monkeypatch.setattr(sweep, "BUILD_DIR", tmp_path / "build")
    handler_before = signal.getsignal(signal.SIGINT)
    args = sweep.build_parser().parse_args(["--config", "ddtree-b15", "--budgets", "8", "--inventory",
                                            str(inventory(tmp_path)), "--out", str(tmp_path / "r")])
    code, results = sweep.prepare(args).run()
    assert code == 1 and fake.calls == []
    assert "cannot read what runs on gpu-a: ssh root@127.0.9.1" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGINT) == handler_before


# --------------------------------------------------------------------------------------------------
# Issue 33 item 3: the sweep tells the whole truth. The fake curve has the shape of the simulator's (whose
# numbers prove the plumbing, not how SGLang behaves): budget 16 without forking leaks yet is a hair faster
# than 15, as `make sweep CONFIG=ddtree-b15-nofork BUDGETS="8 15 16 32 64"` measured when it recommended 16.

NOFORK_CURVE = {8: (9.0, 112.9), 15: (15.0, 172.8), 16: (14.4, 173.5), 32: (7.2, 92.2), 64: (4.8, 63.4)}


def test_the_leak_rule_is_asked_of_spec_not_restated(monkeypatch, tmp_path):
    """needs_state_leak follows spec.validate: a stand-in rule that refuses budgets above 20 without
    reproduce_state_leak moves the line from 16 to 21."""
    base = spec.load("ddtree-b15-nofork")

    def validate(merged, source, name):
        s = merged.get("speculative") or {}
        if s.get("budget", 0) > 20 and not s.get("reproduce_state_leak"):
            raise spec.ConfigError([f"{source}: speculative.budget: {s['budget']}: stand-in rule"])

    monkeypatch.setattr(spec, "validate", validate)
    assert [sweep.needs_state_leak(base, b) for b in (15, 16, 20, 21, 64)] == [False, False, False, True, True]


def test_every_variant_runs_the_deploys_gates_and_a_leaking_budget_is_never_recommended(tmp_path, monkeypatch,
                                                                                       capsys):
    fake = Fake(curve=NOFORK_CURVE.__getitem__,
                exactness={8: {"verdict": "pass", "reason": "ok"}, 15: {"verdict": "pass", "reason": "ok"},
                           16: {"verdict": "fail", "reason": "prompt x01 differs at token 3"}})
    code, results, s = start(tmp_path, monkeypatch, fake, budgets="8 15 16 32")
    assert code == 0
    # The gate code ran on every variant, every gate it runs (only=None), with the sweep's bench size.
    assert len(fake.gate_calls) == 4
    for call in fake.gate_calls:
        assert call["only"] is None and call["speculative"] is True and call["url"] == "http://127.0.0.1:45678"
        assert (call["bench_requests"], call["bench_max_tokens"], call["min_accept_length"]) == (12, 96, 8.0)
    rows = {v["budget"]: v for v in results["variants"]}
    for v in rows.values():
        assert set(v["gates"]) == {"smoke", "exactness", "throughput", "acceptance"}
        assert all(g["verdict"] in ("pass", "fail", "inconclusive") for g in v["gates"].values()), v["gates"]
    assert [rows[b]["leaks"] for b in (8, 15, 16, 32)] == [False, False, True, True]
    assert rows[16]["gates"]["exactness"]["verdict"] == "fail" and rows[16]["gates_failed"] == ["exactness"]
    # No exactness verdict in a deploy record: inconclusive, which stops a deploy by default
    # (gates.exactness_inconclusive: fail), so it disqualifies the variant too.
    assert rows[32]["gates"]["exactness"] == {"verdict": "inconclusive",
                                              "reason": "the variant's deploy recorded no exactness verdict"}
    assert rows[32]["gates_failed"] == ["exactness", "throughput", "acceptance"]
    assert (results["best"]["budget"], results["fastest"]["budget"]) == (15, 15)
    assert "recommended: budget 15 cap 8" in results["recommendation"]
    assert "budget 16 cap 8 (leaks: no state forking above block_size - 1; exactness fail)" in results["recommendation"]
    out = capsys.readouterr().out
    assert ("[3/4] budget 16 cap 8: accept 14.4 (sd 0.2), 173.5 tok/s, step 85 ms, 4/4 requests; gates: smoke pass, "
            "exactness fail, throughput pass, acceptance pass; LEAKS (no state forking above block_size - 1)") in out
    # A gate that did not pass says why, under its variant's line (where a user reads why it is left out).
    assert "\n      exactness inconclusive: the variant's deploy recorded no exactness verdict\n" in out, out
    md = (s.report_dir / "results.md").read_text()
    assert "| leaks | smoke | exactness | throughput | acceptance | status |" in md
    assert ("| 16 | 8 | 14.40 | 0.20 | 173.5 | 85.0 | 4 | 0 | yes | pass | fail | pass | pass | ok (not "
            "recommended") in md


def test_a_leak_with_perfect_gates_is_still_never_recommended(tmp_path, monkeypatch):
    fake = Fake(curve={15: (15.0, 172.8), 16: (15.0, 180.0)}.__getitem__,
                exactness={15: {"verdict": "pass", "reason": "ok"}, 16: {"verdict": "pass", "reason": "ok"}})
    code, results, _ = start(tmp_path, monkeypatch, fake, budgets="15 16")
    assert code == 0
    assert results["variants"][1]["gates_failed"] == [] and results["variants"][1]["leaks"] is True
    assert (results["best"]["budget"], results["fastest"]["budget"]) == (15, 15)


def test_no_qualifying_variant_says_no_variant_recommended_and_exits_3(tmp_path, monkeypatch, capsys):
    fake = Fake(curve=NOFORK_CURVE.__getitem__)
    code, results, s = start(tmp_path, monkeypatch, fake, budgets="16 32")
    assert code == 3
    assert results["best"] is None and results["fastest"] is None
    assert results["recommendation"].startswith("no variant recommended: no measured variant qualifies; not "
                                                "recommended: budget 16 cap 8 (leaks")
    out = capsys.readouterr().out
    assert "recommendation: no variant recommended: no measured variant qualifies" in out
    assert fake.calls[-2:] == [("deploy", "ddtree-b15", "full"), ("cleanup", False)]  # still restored
    assert "no variant recommended" in (s.report_dir / "results.md").read_text()


# --------------------------------------------------------------------------------------------------
# Batches and the budget schedule (issue 38)


def test_a_batch_above_max_running_requests_is_refused(tmp_path, capsys, no_deploys, monkeypatch):
    monkeypatch.setattr(sweep, "BUILD_DIR", tmp_path / "build")
    base = tmp_path / "capped.yml"
    base.write_text("extends: ddtree-b15\nserving: {max_running_requests: 8}\n")
    code, out, err = run_main(capsys, "--config", str(base), "--inventory", str(inventory(tmp_path)),
                              "--budgets", "15 32", "--batches", "1 4 16")
    assert code == 2 and no_deploys == []
    assert err.strip() == ("python -m sgdeploy.sweep: --batches '1 4 16': batch size 16 is above "
                           "serving.max_running_requests (8) of capped: the engine never runs that many at once")


# tokens/s per (budget, batch): 64 best alone, 32 from 4 requests, 15 from 8; 8 never best
TABLE = {8: {1: 100, 4: 300, 8: 500}, 15: {1: 150, 4: 400, 8: 700}, 32: {1: 170, 4: 420, 8: 650},
         64: {1: 180, 4: 410, 8: 600}}


def batch_bench(fake, table, calls):
    def run(url, prompts, requests, concurrency, max_tokens, timeout):
        calls.append((fake.deployed_budget, requests, concurrency, max_tokens))
        return fake_bench(url, 14.0, table[fake.deployed_budget][concurrency])
    return run


def test_batches_bench_each_variant_in_flight_and_write_the_schedule_and_its_config(tmp_path, monkeypatch, capsys):
    fake = Fake(curve=lambda b: (14.0, 170.0))
    calls: list[tuple] = []
    monkeypatch.setattr(bench, "run", batch_bench(fake, TABLE, calls))
    code, results, s = start(tmp_path, monkeypatch, fake, "8 15 32 64", "--batches", "8 1 4", config="ddtree-b15")
    assert code == 0, results.get("recommendation")
    # every variant, each batch size ascending, B in flight and 2 x B requests of the bench's length
    assert calls == [(b, 2 * n, n, 96) for b in (8, 15, 32, 64) for n in (1, 4, 8)]
    assert results["batches"] == [1, 4, 8]
    sched = results["budget_schedule"]
    assert sched["flag"] == "1:64,4:32,8:15" and sched["schedule"] == [[1, 64], [4, 32], [8, 15]]
    assert [(b["batch"], b["budget"]) for b in sched["buckets"]] == [(1, 64), (4, 32), (8, 15)]
    assert sched["config_problems"] == []
    written = s.report_dir / "ddtree-b15-sched.yml"
    config = spec.load(written, spec.CONFIG_DIR)
    assert config.speculative.budget_schedule == ((1, 64), (4, 32), (8, 15)) and config.speculative.budget == 64
    assert config.speculative.topk_cap == 8
    md = (s.report_dir / "results.md").read_text()
    assert "## Budget schedule" in md and "| 15 | 8 | 150.0 (14.00) | 400.0 (14.00) | **700.0 (14.00)** |" in md
    assert "**Schedule**: `1:64,4:32,8:15`" in md and "ready to use" in md
    out = capsys.readouterr().out
    assert "    batch 4: accept 14.0, 420.0 tok/s, step 85 ms, 4/4 requests" in out
    assert f"budget schedule: 1:64,4:32,8:15 (config: {written})" in out
    assert json.loads((s.report_dir / "results.json").read_text())["budget_schedule"]["flag"] == "1:64,4:32,8:15"


def test_a_leaking_budget_is_never_scheduled_however_fast(tmp_path, monkeypatch):
    """Without forking, budget 32 leaks (the sweep opts it into the leak to measure it): fastest at every batch
    size in this table, never in the schedule."""
    fake = Fake(curve=lambda b: (14.0, 170.0))
    table = {8: {1: 100, 4: 300}, 15: {1: 150, 4: 400}, 32: {1: 900, 4: 2000}}
    monkeypatch.setattr(bench, "run", batch_bench(fake, table, []))
    code, results, _ = start(tmp_path, monkeypatch, fake, "8 15 32", "--batches", "1 4")
    assert code == 0
    assert results["budget_schedule"]["flag"] == "1:15"  # one budget best everywhere: one entry
    assert [c["qualifies"] for c in results["budget_schedule"]["buckets"][0]["candidates"]] == [True, True, False]


def test_a_failed_batch_bench_is_exit_1_and_never_chosen(tmp_path, monkeypatch):
    fake = Fake(curve=lambda b: (14.0, 170.0))
    good = batch_bench(fake, {15: {1: 150, 4: 400}, 32: {1: 170, 4: 420}}, [])

    def run(url, prompts, requests, concurrency, max_tokens, timeout):
        if fake.deployed_budget == 32 and concurrency == 4:
            raise bench.BenchError("connection refused")
        return good(url, prompts, requests, concurrency, max_tokens, timeout)

    monkeypatch.setattr(bench, "run", run)
    code, results, _ = start(tmp_path, monkeypatch, fake, "15 32", "--batches", "1 4", config="ddtree-b15")
    assert code == 1
    row = next(r for r in results["variants"] if r["budget"] == 32)
    assert row["by_batch"][1] == {"batch": 4, "accept_length_mean": None, "tokens_per_s": None, "step_time_ms": None,
                                  "requests": 8, "failures": 8, "status": "failed",
                                  "error": "bench failed: connection refused"}
    assert results["budget_schedule"]["flag"] == "1:32,4:15"
