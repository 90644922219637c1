"""Prometheus recording and alert rules, rendered from the configs' own gate thresholds (issue 36).

``render_rules(configs)`` returns one rule file (YAML) for Prometheus's ``rule_files``; ``sgdeploy rules``
writes it. What each alert means, its expression, window and why: docs/monitoring.md ("Alert rules").

The series and labels are the ones the monitoring role's scrape config gives (docs/monitoring.md): SGLang
0.5.23's own metrics on job ``sglang-engine``, the router's (sglang-router 0.3.2, ``smg_*``) on job
``sglang-router``, the host exporter's ``sgdeploy_*`` on job ``sgdeploy-host``; every engine and router
series carries the target labels ``host``, ``config``, ``release`` and ``replica`` ("" for a single engine).

Live accept length is one definition everywhere (rules, dashboard, the post-deploy watch): over a window,
the increase of ``sglang:generation_tokens_total`` over the increase of ``sglang:spec_verify_calls_total``,
both counted by SGLang when a request finishes. An engine that finished no request in the window has no
accept length at all (no series), so an idle engine never alerts: no traffic is no signal, not a failure.

Per-config alerts (accept length, throughput) select their config by the ``config`` label and take the
threshold from its ``gates:``; a config whose threshold is null gets no such alert, a non-speculative config
no accept-length alert (its gate passes it: one token per step by construction). The other alerts (down,
errors, queue, restarts) hold for every scraped target whatever its config. The windows are the constants
below (documented defaults; docs/monitoring.md ("Alert rules") says why each).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from sgdeploy import spec

# The labels every engine series is summed by: one series per engine (a replica of a config on a host, of a
# release). ``instance`` and SGLang's own labels (model_name, engine_type, tp_rank, is_streaming...) go.
BY = "host, config, release, replica"

# Windows (PromQL durations) and limits: docs/monitoring.md, "Windows and limits".
RATE_WINDOW = "5m"            # every rate and ratio of the recording rules
ACCEPT_FOR = "10m"            # accept length below the minimum this long (after the 5m window) fires
ACCEPT_MIN_REQUESTS = 3       # requests finished in the window before an accept length counts as a signal
THROUGHPUT_FOR = "10m"        # generation tokens/s below the minimum under load this long fires
ERROR_RATIO_MAX = 0.05        # aborted requests, or 5xx responses, above this fraction of all ...
ERRORS_FOR = "5m"             # ... this long fires
QUEUE_WINDOW = "10m"          # the queue's slope is fitted over this window ...
QUEUE_FOR = "10m"             # ... and positive, with a non-empty queue, this long fires
DOWN_FOR = "2m"               # a target whose scrape fails this long is down
RESTARTS_WINDOW = "15m"       # a unit that systemd restarted in this window fires (and stays firing so long)

GROUP = "sglang"  # the rule group's name


@dataclass(frozen=True)
class Windows:
    """The rules' durations (PromQL): the constants above, each divided by a time scale (1: as documented)."""

    rate: str
    rate_s: int  # rate, in seconds
    accept_for: str
    throughput_for: str
    errors_for: str
    queue_window: str
    queue_for: str
    down_for: str
    restarts: str


_UNITS = {"s": 1, "m": 60, "h": 3600}


def _seconds(duration: str) -> int:
    return int(duration[:-1]) * _UNITS[duration[-1]]


def _duration(seconds: int) -> str:
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


def windows(time_scale: int = 1) -> Windows:
    """The durations with every one divided by ``time_scale`` (a whole number from 1), rounded to whole seconds:
    a lab test that cannot wait minutes renders its rules with 10 (5m windows become 30s)."""
    if isinstance(time_scale, bool) or not isinstance(time_scale, int) or time_scale < 1:
        raise ValueError(f"time scale {time_scale!r}: give a whole number of 1 or more")

    def scaled(duration: str) -> str:
        return _duration(max(1, round(_seconds(duration) / time_scale)))

    rate = scaled(RATE_WINDOW)
    return Windows(rate=rate, rate_s=_seconds(rate), accept_for=scaled(ACCEPT_FOR),
                   throughput_for=scaled(THROUGHPUT_FOR), errors_for=scaled(ERRORS_FOR),
                   queue_window=scaled(QUEUE_WINDOW), queue_for=scaled(QUEUE_FOR), down_for=scaled(DOWN_FOR),
                   restarts=scaled(RESTARTS_WINDOW))


DEFAULT_WINDOWS = windows()

_ENGINE_API = 'endpoint!~"/metrics|/health.*"'  # the engine's answers that are not its API (scrapes, probes)
_LABEL_VALUE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")  # a config name (spec.NAME_RE) needs no escaping

# Where an alert's text names the engine: "on gpu-01 (ddtree-b15 replica 1, release 0.5.23+abc)".
_WHERE = ("on {{ $labels.host }} ({{ $labels.config }}{{ if $labels.replica }} replica {{ $labels.replica }}"
          "{{ end }}, release {{ $labels.release }})")


def _record(name: str, expr: str) -> dict[str, str]:
    return {"record": name, "expr": expr}


def recording_rules(win: Windows = DEFAULT_WINDOWS) -> list[dict[str, str]]:
    """The recorded series the alerts (and the dashboard) read; one series per engine (``BY``)."""
    w = win.rate
    eng = '{job="sglang-engine"}'
    return [
        _record(f"sglang:generation_tokens:rate{w}",
                f"sum by ({BY}) (rate(sglang:generation_tokens_total{eng}[{w}]))"),
        _record(f"sglang:spec_verify_calls:rate{w}",
                f"sum by ({BY}) (rate(sglang:spec_verify_calls_total{eng}[{w}]))"),
        _record(f"sglang:requests:rate{w}",
                f"sum by ({BY}) (rate(sglang:num_requests_total{eng}[{w}]))"),
        # Δ generated tokens / Δ verify calls; no verify call in the window (idle, or not speculative): no series.
        _record(f"sglang:accept_length:ratio_rate{w}",
                f"sglang:generation_tokens:rate{w} / (sglang:spec_verify_calls:rate{w} > 0)"),
        # SGLang counts an aborted request also as a finished one (num_requests_total).
        _record(f"sglang:aborted_requests:ratio_rate{w}",
                f"sum by ({BY}) (rate(sglang:num_aborted_requests_total{eng}[{w}]))"
                f" / (sglang:requests:rate{w} > 0)"),
        # HTTP 5xx over all responses: the router's (what clients of a config with replicas see) and the
        # engine's own (SGLang counts every path, so its /metrics and /health answers are left out).
        _record(f"sglang:http_5xx:ratio_rate{w}",
                f'sum by (job, {BY}) (rate(smg_http_responses_total{{job="sglang-router",status_code=~"5.."}}[{w}]))\n'
                f'  / (sum by (job, {BY}) (rate(smg_http_responses_total{{job="sglang-router"}}[{w}])) > 0)\n'
                f'or\n'
                f'sum by (job, {BY}) (rate(sglang:http_responses_total{{job="sglang-engine",{_ENGINE_API},'
                f'status_code=~"5.."}}[{w}]))\n'
                f'  / (sum by (job, {BY}) (rate(sglang:http_responses_total{{job="sglang-engine",{_ENGINE_API}}}'
                f'[{w}])) > 0)'),
        # The scheduler's gauges (each TP rank may export its own: the largest counts).
        _record(f"sglang:running_requests:avg{w}",
                f"max by ({BY}) (avg_over_time(sglang:num_running_reqs{eng}[{w}]))"),
        _record("sglang:queue_requests:max",
                f"max by ({BY}) (sglang:num_queue_reqs{eng})"),
    ]


def _alert(name: str, expr: str, for_: str | None, severity: str, summary: str, description: str,
           labels: dict[str, str] | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": name, "expr": expr}
    if for_:
        rule["for"] = for_
    rule["labels"] = {"severity": severity, **(labels or {})}
    rule["annotations"] = {"summary": summary, "description": description}
    return rule


def _num(value: float) -> str:
    """A threshold as PromQL and people read it: 8 not 8.0, 3.5 as is."""
    return f"{value:g}"


def accept_length_alert(config: spec.Config, win: Windows = DEFAULT_WINDOWS) -> dict[str, Any] | None:
    """Accept length below the config's gates.min_accept_length, under traffic, for ACCEPT_FOR; None when the
    config has no minimum or does not speculate."""
    threshold = config.gates.min_accept_length
    if threshold is None or not config.speculative_enabled:
        return None
    w, t = win.rate, _num(threshold)
    expr = (f'sglang:accept_length:ratio_rate{w}{{config="{config.name}"}} < {t}\n'
            f"and on ({BY}) sglang:requests:rate{w} * {win.rate_s} >= {ACCEPT_MIN_REQUESTS}")
    return _alert(
        "SGLangAcceptLengthLow", expr, win.accept_for, "critical",
        f'Accept length {{{{ $value | printf "%.2f" }}}} below the minimum {t} {_WHERE}',
        f"Over the last {w} of live traffic speculative decoding accepted {{{{ $value | printf \"%.2f\" }}}} "
        f"tokens per verify step, below gates.min_accept_length {t} of config {config.name}, and has stayed below "
        f"for {win.accept_for}: the drafter no longer matches the target (stale or collapsed acceptance). Roll back "
        f"(make rollback CONFIG={config.name}) or redeploy.", {"config": config.name})


def throughput_alert(config: spec.Config, win: Windows = DEFAULT_WINDOWS) -> dict[str, Any] | None:
    """Generation tokens/s below gates.min_tokens_per_s while the engine holds at least the gate bench's
    concurrency (gates.bench_concurrency) of requests, for THROUGHPUT_FOR; None without a minimum."""
    threshold = config.gates.min_tokens_per_s
    if threshold is None:
        return None
    w, t, c = win.rate, _num(threshold), int(config.gates.bench_concurrency)
    expr = (f'sglang:generation_tokens:rate{w}{{config="{config.name}"}} < {t}\n'
            f"and on ({BY}) sglang:running_requests:avg{w} >= {c}")
    return _alert(
        "SGLangThroughputLow", expr, win.throughput_for, "warning",
        f'Generation throughput {{{{ $value | printf "%.1f" }}}} tokens/s below the minimum {t} {_WHERE}',
        f"Over the last {w} the engine generated {{{{ $value | printf \"%.1f\" }}}} tokens/s while serving "
        f"{c} or more requests at once on average (the gate bench's concurrency), below gates.min_tokens_per_s {t} "
        f"of config {config.name}, and has stayed below for {win.throughput_for}.", {"config": config.name})


def generic_alerts(win: Windows = DEFAULT_WINDOWS) -> list[dict[str, Any]]:
    """The alerts that hold for every scraped target: down, errors, queue growth, unit restarts."""
    w, pct = win.rate, f"{ERROR_RATIO_MAX:.0%}"
    host_down = 'unless on (host) up{job="sgdeploy-host"} == 0'
    return [
        _alert("SGLangEngineDown", f'up{{job="sglang-engine"}} == 0\n{host_down}', win.down_for, "critical",
               f"SGLang engine down {_WHERE}",
               f"Prometheus could not scrape the engine's metrics for {win.down_for} while the host's exporter "
               "answers: the engine is stopped, crashed or not answering (systemctl status "
               "sglang-{{ $labels.config }}{{ if $labels.replica }}-r{{ $labels.replica }}{{ end }}; make status)."),
        _alert("SGLangRouterDown", f'up{{job="sglang-router"}} == 0\n{host_down}', win.down_for, "critical",
               "sglang-router down on {{ $labels.host }} ({{ $labels.config }}, release {{ $labels.release }})",
               f"Prometheus could not scrape the router in front of config {{{{ $labels.config }}}}'s replicas "
               f"for {win.down_for} while the host's exporter answers: clients of the config's port get no answer."),
        _alert("SgdeployHostExporterDown", 'up{job="sgdeploy-host"} == 0', win.down_for, "critical",
               "sgdeploy metrics exporter down on {{ $labels.host }}",
               f"Prometheus could not scrape the sgdeploy exporter on {{{{ $labels.host }}}} for {win.down_for}: "
               "nothing on the host is seen (its engines and router are not judged down on its account)."),
        _alert("SGLangRequestsAborted", f"sglang:aborted_requests:ratio_rate{w} > {ERROR_RATIO_MAX:g}",
               win.errors_for, "warning",
               f'{{{{ $value | humanizePercentage }}}} of requests aborted {_WHERE}',
               f"{{{{ $value | humanizePercentage }}}} of the requests the engine finished over the last {w} were "
               f"aborted (more than {pct}) for {win.errors_for}: clients went away, timed out, or the engine "
               "aborted them."),
        _alert("SGLangHTTPErrors", f"sglang:http_5xx:ratio_rate{w} > {ERROR_RATIO_MAX:g}", win.errors_for, "warning",
               f'{{{{ $value | humanizePercentage }}}} of HTTP responses are 5xx from {{{{ $labels.job }}}} {_WHERE}',
               f"{{{{ $value | humanizePercentage }}}} of the {{{{ $labels.job }}}}'s HTTP responses over the "
               f"last {w} were server errors (more than {pct}) for {win.errors_for}."),
        _alert("SGLangQueueGrowing",
               f"sglang:queue_requests:max > 0\n"
               f'and on ({BY}) max by ({BY}) (deriv(sglang:num_queue_reqs{{job="sglang-engine"}}[{win.queue_window}]))'
               " > 0",
               win.queue_for, "warning",
               f"Request queue growing: {{{{ $value }}}} waiting {_WHERE}",
               f"The engine's waiting queue has not been empty and kept growing (its slope over {win.queue_window} "
               f"above 0) for {win.queue_for}: requests arrive faster than it serves them; {{{{ $value }}}} wait now."),
        _alert("SgdeployUnitRestarted",
               f'increase(sgdeploy_unit_restarts_total{{job="sgdeploy-host"}}[{win.restarts}]) > 0', None,
               "warning",
               "{{ $labels.unit }} restarted by systemd on {{ $labels.host }}",
               f"systemd restarted {{{{ $labels.unit }}}} on {{{{ $labels.host }}}} about "
               f"{{{{ $value | printf \"%.0f\" }}}} time(s) in the last {win.restarts} (NRestarts): it exited "
               "and Restart= brought it back (journalctl -u {{ $labels.unit }})."),
    ]


def rule_groups(configs: Mapping[str, spec.Config], time_scale: int = 1) -> dict[str, Any]:
    """The rule file as data: one group, the recording rules, then the alerts (per config in name order, then
    the generic ones). ``time_scale``: see ``windows``."""
    win = windows(time_scale)
    alerts: list[dict[str, Any]] = []
    for name in sorted(configs):
        config = configs[name]
        if not _LABEL_VALUE.match(config.name):
            raise ValueError(f"config name {config.name!r}: not a label value the rules can select "
                             "(lower-case letters, digits, '.', '_', '-')")
        for rule in (accept_length_alert(config, win), throughput_alert(config, win)):
            if rule is not None:
                alerts.append(rule)
    alerts.extend(generic_alerts(win))
    # One group: Prometheus evaluates a group's rules in order, so the alerts read the recorded series of the
    # same evaluation (across groups they would lag an interval behind, and fire a step late).
    return {"groups": [{"name": GROUP, "rules": [*recording_rules(win), *alerts]}]}


class _Dumper(yaml.SafeDumper):
    """Block scalars (``|``) for multi-line expressions, so the rule file reads like hand-written PromQL."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def load_configs(names: Iterable[str]) -> dict[str, spec.Config]:
    """name -> Config for these config names or paths (``spec.load``); ValueError for two configs of one name from
    different files (the rules select a config by its name), spec.ConfigError for a config that does not load."""
    configs: dict[str, spec.Config] = {}
    for arg in names:
        config = spec.load(arg)
        other = configs.get(config.name)
        if other is not None and other.source != config.source:
            raise ValueError(f"two configs named {config.name}: {other.source} and {config.source}; "
                             "the rules select a config by its name")
        configs[config.name] = config
    return configs


def render_rules(configs: Mapping[str, spec.Config], time_scale: int = 1) -> str:
    """The Prometheus rule file for these configs (name -> Config), as YAML text. ``time_scale`` divides every
    window and duration (1: the documented defaults; ValueError for anything but a whole number from 1)."""
    groups = rule_groups(configs, time_scale)
    names = ", ".join(sorted(configs)) or "none"
    head = (f"# Prometheus rules rendered by `sgdeploy rules` from the gates of: {names}.\n"
            "# Do not edit: change the configs' gates and render again. docs/monitoring.md explains them.\n")
    if time_scale != 1:
        head += (f"# Time scale {time_scale}: every window and duration is 1/{time_scale} of the documented default "
                 "(a test, not production).\n")
    return head + yaml.dump(groups, Dumper=_Dumper, sort_keys=False, width=1_000_000, allow_unicode=True)
