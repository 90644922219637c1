"""The Prometheus rules rendered from the configs' gates (issue 36, deliver 2), checked with the real promtool
(`make promtool`: Debian's prometheus package, sha256-pinned, unpacked into build/tools/).

`promtool check rules` on the rules of every config in configs/; `promtool test rules` on the series of
tests/unit/tool/promtool/alerts.test.yml, where every alert fires on one engine and holds on the others
(a collapse under traffic, healthy traffic, an idle engine, a dip shorter than the window, a config without a
minimum...); and each of those cases is shown to matter: a rule changed the wrong way makes promtool fail."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from sgdeploy import cli, monitoring_rules, spec

REPO = Path(__file__).resolve().parents[3]
PROMTOOL = REPO / "build" / "tools" / "promtool"
CASES = Path(__file__).parent / "promtool"
# The configs alerts.test.yml's series belong to (its header says why each).
TEST_CONFIGS = ("ddtree-b15", "dflash-b16", "ar", str(CASES / "nominimum.yml"))


@pytest.fixture(scope="module")
def promtool() -> Path:
    """build/tools/promtool; `make test-unit` fetches it first, a bare pytest run asks make for it here."""
    if not PROMTOOL.exists():
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
        proc = subprocess.run(["make", "-s", "--no-print-directory", "promtool"], cwd=REPO, capture_output=True,
                              text=True, env=env, check=False, timeout=600)
        if proc.returncode != 0 or not PROMTOOL.exists():
            pytest.fail(f"`make promtool` could not fetch promtool: {proc.stderr.strip() or proc.stdout.strip()}")
    return PROMTOOL


def load(*names: str) -> dict[str, spec.Config]:
    configs = [spec.load(n) for n in names]
    return {c.name: c for c in configs}


def run(promtool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(promtool), *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=120)


def promtool_test(promtool: Path, folder: Path, rules_text: str) -> subprocess.CompletedProcess:
    """`promtool test rules` of alerts.test.yml against these rules, in a fresh folder."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(CASES / "alerts.test.yml", folder / "alerts.test.yml")
    (folder / "rules.yml").write_text(rules_text)
    return run(promtool, "test", "rules", "alerts.test.yml", cwd=folder)


def alerts(groups: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in groups["groups"] for r in g["rules"] if "alert" in r]


# ---- promtool check rules ----

@pytest.mark.parametrize("name", spec.available())
def test_promtool_accepts_the_rules_of_every_config(promtool, tmp_path, name):
    (tmp_path / "rules.yml").write_text(monitoring_rules.render_rules(load(name)))
    proc = run(promtool, "check", "rules", "rules.yml", cwd=tmp_path)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr


def test_promtool_accepts_the_rules_of_all_configs_at_once_without_duplicates(promtool, tmp_path):
    out = tmp_path / "sub" / "rules.yml"
    assert cli.main(["rules", "-o", str(out)]) == 0
    proc = run(promtool, "check", "rules", str(out), cwd=tmp_path)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr  # lint: no duplicate rules
    rules = alerts(yaml.safe_load(out.read_text()))
    configs = [spec.load(n) for n in spec.available()]
    judged = sorted(c.name for c in configs if c.speculative_enabled and c.gates.min_accept_length is not None)
    assert sorted(r["labels"]["config"] for r in rules if r["alert"] == "SGLangAcceptLengthLow") == judged


# ---- promtool test rules: series that fire and series that must not ----

def test_promtool_unit_tests_of_the_alerts_pass(promtool, tmp_path):
    proc = promtool_test(promtool, tmp_path, monitoring_rules.render_rules(load(*TEST_CONFIGS)))
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr


def test_every_alert_fires_in_the_promtool_tests():
    cases = yaml.safe_load((CASES / "alerts.test.yml").read_text())
    firing = {t["alertname"] for test in cases["tests"] for t in test["alert_rule_test"] if t["exp_alerts"]}
    rendered = {r["alert"] for r in alerts(monitoring_rules.rule_groups(load(*TEST_CONFIGS)))}
    assert firing == rendered


def _edit(field: str, old: str, new: str, alert: str | None = None, record: str | None = None,
          config: str | None = None) -> Callable[[dict[str, Any]], None]:
    """A change of one rule's field (expr, for) that a correct test suite must catch."""
    def apply(groups: dict[str, Any]) -> None:
        hits = [r for g in groups["groups"] for r in g["rules"]
                if (alert and r.get("alert") == alert or record and r.get("record") == record)
                and (config is None or r.get("labels", {}).get("config") == config)]
        assert hits and all(old in str(r[field]) for r in hits), (alert or record, field, old)
        for r in hits:
            r[field] = str(r[field]).replace(old, new)
    return apply


def _add_nominimum_accept_alert(groups: dict[str, Any]) -> None:
    rule = copy.deepcopy(next(r for r in alerts(groups) if r.get("alert") == "SGLangAcceptLengthLow"))
    rule["expr"] = rule["expr"].replace('config="ddtree-b15"', 'config="nominimum"')
    rule["labels"]["config"] = "nominimum"
    groups["groups"][0]["rules"].append(rule)


MUTATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    # healthy traffic (accept length 10) must not fire
    "accept threshold above the healthy engine's": _edit("expr", "< 8", "< 12", alert="SGLangAcceptLengthLow",
                                                           config="ddtree-b15"),
    # the 5m dip (below the minimum about 8m) must not fire
    "accept window shorter than the dip": _edit("for", "10m", "5m", alert="SGLangAcceptLengthLow"),
    # one request per 5m is too little traffic to judge
    "no traffic floor": _edit("expr", " * 300 >= 3", " * 300 >= 0", alert="SGLangAcceptLengthLow"),
    # the collapse must fire at all
    "accept threshold below the collapse": _edit("expr", "< 8", "< 1.5", alert="SGLangAcceptLengthLow",
                                                 config="ddtree-b15"),
    # an idle engine has no accept length (not 0/0)
    "idle engine gets an accept length": _edit("expr", "(sglang:spec_verify_calls:rate5m > 0)",
                                               "sglang:spec_verify_calls:rate5m",
                                               record="sglang:accept_length:ratio_rate5m"),
    # each config is judged by its own minimum (dflash-b16 at 5 is above its 4), none by another's
    "accept selects no config": _edit("expr", '{config="ddtree-b15"}', "", alert="SGLangAcceptLengthLow",
                                      config="ddtree-b15"),
    "throughput selects no config": _edit("expr", '{config="ddtree-b15"}', "", alert="SGLangThroughputLow",
                                          config="ddtree-b15"),
    # a config without a minimum gets no accept-length alert
    "config without a minimum alerts": _add_nominimum_accept_alert,
    # throughput is judged only at the gate bench's concurrency or more
    "throughput without the load condition": _edit("expr", ">= 4", ">= 0", alert="SGLangThroughputLow",
                                                   config="ddtree-b15"),
    "throughput load above the engine's": _edit("expr", ">= 4", ">= 8", alert="SGLangThroughputLow",
                                                config="ddtree-b15"),
    "throughput threshold below the slow engine's": _edit("expr", "< 100", "< 40", alert="SGLangThroughputLow",
                                                          config="ddtree-b15"),
    "aborted threshold below the 1% engine's": _edit("expr", "> 0.05", "> 0.005", alert="SGLangRequestsAborted"),
    # the engine's own scrapes are not its API's answers
    "5xx ratio counts /metrics": _edit("expr", 'endpoint!~"/metrics|/health.*"', 'endpoint!=""',
                                       record="sglang:http_5xx:ratio_rate5m"),
    "router 5xx threshold below the 1% router's": _edit("expr", "> 0.05", "> 0.005", alert="SGLangHTTPErrors"),
    # a stable queue is not growth; a 5m burst is not sustained
    "queue growth without a rising slope": _edit("expr", "[10m])) > 0", "[10m])) >= 0", alert="SGLangQueueGrowing"),
    "queue window shorter than the burst": _edit("for", "10m", "3m", alert="SGLangQueueGrowing"),
    # a host whose exporter is down is one alert, not one per engine
    "engine down when the whole host is": _edit("expr", '\nunless on (host) up{job="sgdeploy-host"} == 0', "",
                                                alert="SGLangEngineDown"),
    "engine down on one failed scrape": _edit("for", "2m", "0s", alert="SGLangEngineDown"),
    "router down on one failed scrape": _edit("for", "2m", "0s", alert="SGLangRouterDown"),
    "exporter down never": _edit("expr", "== 0", "== 2", alert="SgdeployHostExporterDown"),
    # NRestarts that stays, or is flushed by a manual start, is no restart
    "restarts counted, not their increase": _edit(
        "expr", 'increase(sgdeploy_unit_restarts_total{job="sgdeploy-host"}[15m])',
        'sgdeploy_unit_restarts_total{job="sgdeploy-host"}', alert="SgdeployUnitRestarted"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_wrong_rule_fails_the_promtool_tests(promtool, tmp_path, mutation):
    groups = monitoring_rules.rule_groups(load(*TEST_CONFIGS))
    MUTATIONS[mutation](groups)
    proc = promtool_test(promtool, tmp_path, yaml.safe_dump(groups, sort_keys=False))
    assert proc.returncode != 0 and "FAILED" in proc.stdout + proc.stderr, proc.stdout


def test_a_time_scale_divides_every_window_and_promtool_accepts_it(promtool, tmp_path):
    assert monitoring_rules.windows(1) == monitoring_rules.DEFAULT_WINDOWS
    assert monitoring_rules.DEFAULT_WINDOWS.rate == monitoring_rules.RATE_WINDOW == "5m"
    win = monitoring_rules.windows(10)
    assert (win.rate, win.rate_s, win.accept_for, win.down_for, win.restarts) == ("30s", 30, "1m", "12s", "90s")
    text = monitoring_rules.render_rules(load("ddtree-b15"), time_scale=10)
    assert "[5m]" not in text and "for: 10m" not in text and "sglang:requests:rate30s * 30 >= 3" in text
    (tmp_path / "rules.yml").write_text(text)
    proc = run(promtool, "check", "rules", "rules.yml", cwd=tmp_path)
    assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("scale", [0, -1, 1.5, True])
def test_a_bad_time_scale_is_refused(scale):
    with pytest.raises(ValueError, match="give a whole number of 1 or more"):
        monitoring_rules.windows(scale)


# ---- what the rendered rules say ----

def test_thresholds_come_from_each_configs_gates():
    rules = alerts(monitoring_rules.rule_groups(load("ddtree-b15", "dflash-b16")))
    by = {(r["alert"], r["labels"].get("config")): r for r in rules}
    assert 'sglang:accept_length:ratio_rate5m{config="ddtree-b15"} < 8\n' in by[("SGLangAcceptLengthLow",
                                                                                 "ddtree-b15")]["expr"]
    assert 'sglang:accept_length:ratio_rate5m{config="dflash-b16"} < 4\n' in by[("SGLangAcceptLengthLow",
                                                                                 "dflash-b16")]["expr"]
    assert 'sglang:generation_tokens:rate5m{config="dflash-b16"} < 60\n' in by[("SGLangThroughputLow",
                                                                                "dflash-b16")]["expr"]
    assert "the minimum 8 " in by[("SGLangAcceptLengthLow", "ddtree-b15")]["annotations"]["summary"]


def test_a_config_without_a_minimum_or_speculation_gets_no_such_alert():
    names = {(r["alert"], r["labels"].get("config"))
             for r in alerts(monitoring_rules.rule_groups(load("ar", str(CASES / "nominimum.yml"))))}
    assert ("SGLangThroughputLow", "ar") in names  # ar: min_tokens_per_s 15
    assert ("SGLangAcceptLengthLow", "ar") not in names  # not speculative: its gate passes it by construction
    assert not {n for n in names if n[1] == "nominimum"}


def test_every_alert_has_a_severity_and_says_where_what_and_the_threshold():
    rules = alerts(monitoring_rules.rule_groups(load(*TEST_CONFIGS)))
    for r in rules:
        assert r["labels"]["severity"] in ("critical", "warning"), r["alert"]
        text = r["annotations"]["summary"] + r["annotations"]["description"]
        assert "{{ $labels.host }}" in r["annotations"]["summary"], r["alert"]
        if r["alert"] not in ("SgdeployHostExporterDown", "SgdeployUnitRestarted"):
            assert "{{ $labels.config }}" in r["annotations"]["summary"], r["alert"]
        if r["alert"] in ("SGLangAcceptLengthLow", "SGLangThroughputLow", "SGLangRequestsAborted", "SGLangHTTPErrors"):
            assert "$value" in r["annotations"]["summary"], r["alert"]
            assert any(t in text for t in (" 8 ", " 100 ", " 4 ", " 60 ", " 15 ", "5%")), r["alert"]


# ---- the command ----

def test_rules_command_writes_the_file_and_names_it(tmp_path, capsys):
    out = tmp_path / "rules.yml"
    assert cli.main(["rules", "ddtree-b15", "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    text = out.read_text()
    assert text.startswith("# Prometheus rules rendered by `sgdeploy rules` from the gates of: ddtree-b15.")
    assert 'config="ddtree-b15"' in text and 'config="ar"' not in text


def test_rules_command_without_configs_covers_configs_dir(capsys):
    assert cli.main(["rules"]) == 0
    text = capsys.readouterr().out
    for name in spec.available():
        assert f"CONFIG={name})" in text or not spec.load(name).speculative_enabled, name


@pytest.mark.parametrize("args, message", [
    (["rules", "no-such-config"], "no-such-config: no config of that name"),
    (["rules", "ddtree-b15", "-o", "/proc/no/rules.yml"], "sgdeploy rules: /proc/no/rules.yml: cannot write"),
    (["rules", "ddtree-b15", "--time-scale", "0"], "sgdeploy rules: time scale 0: give a whole number of 1 or more"),
])
def test_rules_command_refuses_bad_input_with_one_line(capsys, args, message):
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_rules_command_refuses_two_configs_of_one_name(tmp_path, capsys):
    other = tmp_path / "ddtree-b15.yml"
    other.write_text("extends: dflash-b16\n")
    assert cli.main(["rules", "ddtree-b15", str(other)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "two configs named ddtree-b15" in err[0], err
