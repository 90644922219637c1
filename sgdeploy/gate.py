"""Deploy gates: smoke, exactness, throughput and acceptance, each with a verdict pass, fail or inconclusive.

A gate result names the metric, the observed value, the absolute threshold from the config, the
baseline (the last good deploy of the same config on the same host) and the verdict, in the manner
of Argo Rollouts / Flagger analysis runs. See docs/gates.md.

Standard library only: the playbook may copy the package to a host and run it with system python3.

Command line (exit 0 all gates pass, 1 a gate failed or was inconclusive, 2 misuse)::

    python -m sgdeploy.gate --url URL (--config-json FILE | --thresholds-json STRING)
        [--speculative | --no-speculative] [--baseline RECORD.json] [--out REPORT.json]
        [--only smoke|exactness|throughput|acceptance ...] [--bench-timeout S] [--json]
        [--references DIR [--host NAME] [--exactness-report-only]]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import unicodedata
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sgdeploy import bench, exactness, gate_schema, records, serving

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
GATES = ("smoke", "throughput", "acceptance")  # the gates of a record's "gates" list
# Every gate --only can name; exactness is recorded on its own ("exactness" key, docs/gates.md).
ALL_GATES = ("smoke", "exactness", "throughput", "acceptance")

# Bench settings a baseline must share with the candidate to be compared ("measured the same way").
_COMPARABLE = {
    "throughput": ("prompts_digest", "max_new_tokens", "concurrency", "requests"),
    "acceptance": ("prompts_digest", "max_new_tokens"),
}


class GateError(ValueError):
    """Bad gate input (thresholds, baseline file): one line naming the thing, the value, what is allowed."""


_D = gate_schema.DEFAULTS


@dataclass(frozen=True)
class GateThresholds:
    """The config's ``gates`` mapping. Keys, defaults and bounds: ``sgdeploy.gate_schema`` (the config
    schema's own definition; a test fails if these fields and it differ)."""

    min_accept_length: float | None = _D["min_accept_length"]
    min_tokens_per_s: float | None = _D["min_tokens_per_s"]
    max_regression_pct: float = _D["max_regression_pct"]
    smoke_prompt: str = _D["smoke_prompt"]
    smoke_max_tokens: int = _D["smoke_max_tokens"]
    bench_requests: int = _D["bench_requests"]
    bench_concurrency: int = _D["bench_concurrency"]
    bench_max_tokens: int = _D["bench_max_tokens"]
    min_completed_fraction: float = _D["min_completed_fraction"]
    warmup_requests: int = _D["warmup_requests"]  # used by the deploy's warm-up step, not by a gate
    exactness_tie_tolerance: float = _D["exactness_tie_tolerance"]
    exactness_concurrency: int = _D["exactness_concurrency"]
    exactness_require_reference: bool = _D["exactness_require_reference"]

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None) -> GateThresholds:
        """Build from a mapping (missing keys take the defaults); GateError names a bad key or value."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise GateError(f"gates must be a mapping of names to values, not {type(data).__name__}")
        values: dict[str, Any] = {}
        for key, value in data.items():
            if key not in gate_schema.FIELDS:
                raise GateError(f"gates.{key}: unknown setting; allowed: {', '.join(gate_schema.FIELDS)}")
            try:
                values[key] = gate_schema.check(key, value)
            except ValueError as err:
                raise GateError(f"gates.{key}: {value!r} is not allowed; {err}") from None
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GateResult:
    gate: str  # smoke | throughput | acceptance
    metric: str
    value: float | None
    threshold: float | None  # the config's absolute minimum, None when not set
    baseline: float | None  # the last good deploy's value, None when there is none (or not comparable)
    verdict: str  # pass | fail | inconclusive
    reason: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.verdict == PASS

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        return f"{self.gate:<11}{self.verdict.upper():<13}{self.reason}"


def _num(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def _excerpt(text: str, n: int = 60) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


def garbled(text: str) -> str | None:
    """Why ``text`` looks garbled (replacement or control characters), or None if it looks like text."""
    bad = [c for c in text if c == "\ufffd" or (unicodedata.category(c) in ("Cc", "Cs", "Co", "Cn")
                                                 and c not in "\n\r\t")]
    if bad:
        return f"{len(bad)} replacement or control characters"
    return None


# --- smoke ------------------------------------------------------------------------------------------

def smoke(base_url: str, thresholds: GateThresholds, speculative: bool, timeout: float = 120.0) -> GateResult:
    """Send the same greedy request twice: both answered, non-empty, readable, identical, and
    (speculative configs) reporting ``spec_verify_ct > 0``."""
    base_url = serving.check_url(base_url)

    def result(verdict: str, reason: str, value: float | None = None, **details: Any) -> GateResult:
        return GateResult("smoke", "deterministic_answer", value, None, None, verdict, reason, details)

    answers = []
    for attempt in (1, 2):
        try:
            answers.append(serving.generate(base_url, thresholds.smoke_prompt, thresholds.smoke_max_tokens,
                                            timeout))
        except serving.ServingError as err:
            return result(FAIL, f"request {attempt} of 2 failed: {err}")
    texts, metas = [a.get("text") for a in answers], [a.get("meta_info") or {} for a in answers]
    for attempt, (text, meta) in enumerate(zip(texts, metas, strict=True), 1):
        if not isinstance(text, str) or not text.strip():
            return result(FAIL, f"answer {attempt} of 2 is empty", 0.0, answer=text)
        why = garbled(text)
        if why:
            return result(FAIL, f"answer {attempt} of 2 is garbled: {why} in {_excerpt(text)}", answer=text)
        tokens = meta.get("completion_tokens")
        if not isinstance(tokens, int) or tokens <= 0:
            return result(FAIL, f"answer {attempt} of 2 reports completion_tokens {tokens!r}; "
                                "expected more than 0", answer=text)
        verify = meta.get("spec_verify_ct")
        if speculative and not (isinstance(verify, int | float) and verify > 0):
            return result(FAIL, f"answer {attempt} of 2 reports spec_verify_ct {verify!r}: no speculative "
                                "metrics, so speculative decoding is not running", float(tokens), answer=text)
    if texts[0] != texts[1]:
        return result(FAIL, f"two identical greedy requests gave different answers: {_excerpt(texts[0])} "
                            f"vs {_excerpt(texts[1])}", answer=texts[0], answer_2=texts[1])
    tokens = metas[0]["completion_tokens"]
    reason = f"answered {tokens} tokens twice, identically"
    accept = bench.accept_length(metas[0])
    if speculative:
        reason += f"; spec_verify_ct {metas[0]['spec_verify_ct']}, accept length {_num(accept)}"
    return result(PASS, reason, float(tokens), answer=texts[0], accept_length=accept)


# --- throughput and acceptance ---------------------------------------------------------------------------

def _bench_dict(data: bench.BenchResult | dict | None) -> dict | None:
    if data is None:
        return None
    if isinstance(data, bench.BenchResult):
        return data.to_dict()
    if "schema" in data and "bench" in data:  # a deploy record
        return data["bench"]
    return data


def _measured_differently(gate: str, bench_d: dict, base: dict) -> str | None:
    diffs = [f"{k} {base.get(k)!r} vs {bench_d.get(k)!r}"
             for k in _COMPARABLE[gate] if base.get(k) != bench_d.get(k)]
    return ", ".join(diffs) or None


def _judge(gate: str, metric: str, value: float, threshold: float | None, bench_d: dict,
           baseline: dict | None, thresholds: GateThresholds, base_key: str) -> GateResult:
    reasons, problems = [], []
    if threshold is not None:
        if value < threshold:
            short = 100.0 * (threshold - value) / threshold if threshold > 0 else 0.0
            problems.append(f"{metric} {_num(value)} is below the minimum {_num(threshold)} "
                            f"({short:.1f}% short)")
        else:
            reasons.append(f"{metric} {_num(value)} meets the minimum {_num(threshold)}")
    else:
        reasons.append(f"{metric} {_num(value)} (no minimum configured)")
    base_value = None
    if baseline is None:
        reasons.append("no last good deploy to compare with")
    else:
        differs = _measured_differently(gate, bench_d, baseline)
        raw = baseline.get(base_key)
        if differs:
            reasons.append(f"last good deploy measured differently ({differs}): not compared")
        elif not isinstance(raw, int | float) or raw <= 0:
            reasons.append(f"last good deploy has no usable {metric} ({raw!r}): not compared")
        else:
            base_value = float(raw)
            change = 100.0 * (value - base_value) / base_value
            allowed = thresholds.max_regression_pct
            if -change > allowed:
                problems.append(f"{metric} {_num(value)} is {-change:.1f}% below the last good deploy "
                                f"({_num(base_value)}); allowed {allowed:g}%")
            else:
                direction = "below" if change < 0 else "above"
                reasons.append(f"{abs(change):.1f}% {direction} the last good deploy ({_num(base_value)}); "
                               f"allowed {allowed:g}% below")
    if problems:
        return GateResult(gate, metric, value, threshold, base_value, FAIL, "; ".join(problems))
    return GateResult(gate, metric, value, threshold, base_value, PASS, "; ".join(reasons))


def _too_few(gate: str, metric: str, threshold: float | None, bench_d: dict,
             thresholds: GateThresholds) -> GateResult | None:
    frac = bench_d.get("completed_fraction", 0.0)
    if frac >= thresholds.min_completed_fraction:
        return None
    errors = bench_d.get("errors") or []
    why = f": {errors[0]['message']} (x{errors[0]['count']})" if errors else ""
    return GateResult(gate, metric, None, threshold, None, INCONCLUSIVE,
                      f"only {bench_d.get('completed')} of {bench_d.get('requests')} bench requests "
                      f"completed ({100 * frac:.0f}%); the gate needs "
                      f"{100 * thresholds.min_completed_fraction:.0f}%{why}")


def throughput(bench_result: bench.BenchResult | dict, thresholds: GateThresholds,
               baseline: bench.BenchResult | dict | None = None) -> GateResult:
    """Tokens/s of the bench against ``min_tokens_per_s`` and the baseline bench (or record)."""
    b, base = _bench_dict(bench_result), _bench_dict(baseline)
    threshold = thresholds.min_tokens_per_s
    return (_too_few("throughput", "tokens_per_s", threshold, b, thresholds)
            or _judge("throughput", "tokens_per_s", float(b["tokens_per_s"]), threshold, b, base, thresholds,
                      "tokens_per_s"))


def acceptance(bench_result: bench.BenchResult | dict, thresholds: GateThresholds,
               baseline: bench.BenchResult | dict | None = None, speculative: bool = True) -> GateResult:
    """Mean accept length of the bench against ``min_accept_length`` and the baseline.

    A non-speculative config passes with the reason "not speculative": it accepts exactly one
    token per step by construction, and there is nothing to measure.
    """
    threshold = thresholds.min_accept_length
    if not speculative:
        return GateResult("acceptance", "accept_length", None, threshold, None, PASS,
                          "not speculative: one token per step by construction, nothing to gate")
    b, base = _bench_dict(bench_result), _bench_dict(baseline)
    too_few = _too_few("acceptance", "accept_length", threshold, b, thresholds)
    if too_few:
        return too_few
    if not b.get("accept_length_requests"):
        return GateResult("acceptance", "accept_length", None, threshold, None, FAIL,
                          "no completed request reported spec_verify_ct or spec_accept_length: "
                          "speculative decoding is not running")
    result = _judge("acceptance", "accept_length", float(b["accept_length_mean"]), threshold, b, base,
                    thresholds, "accept_length_mean")
    result.details = {"stdev": b.get("accept_length_stdev"), "requests": b.get("accept_length_requests"),
                      "step_time_ms_mean": b.get("step_time_ms_mean")}
    return result


# --- exactness ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ExactnessTarget:
    """Where references live and whose they are: the host's ``<state dir>/references`` folder and the
    deploy's target model (``exactness.model_identity``), config, host and release."""

    references_dir: str
    identity: dict | None
    config: str = "?"
    host: str = "?"
    release: str | None = None

    def how_to_make(self) -> str:
        return exactness.HOW_TO_MAKE.format(config=self.config, host=self.host)


def _exact(verdict: str, reason: str, value: float | None, thresholds: GateThresholds, **details: Any) -> GateResult:
    return GateResult("exactness", "prompts_equal", value, thresholds.exactness_tie_tolerance, None, verdict, reason,
                      details)


def exactness_gate(base_url: str, thresholds: GateThresholds, target: ExactnessTarget,
                   timeout: float = 600.0) -> GateResult:
    """A speculative candidate against the reference of its model (sgdeploy.exactness)."""
    if target.identity is None:
        return _exact(INCONCLUSIVE, "the deploy description names no target model: no reference to compare with",
                      None, thresholds)
    path = exactness.reference_path(target.references_dir, target.identity)
    label = target.identity["label"]
    if not path.is_file():
        return _exact(INCONCLUSIVE, f"no reference outputs for {label} on this host yet ({path}): "
                      f"{target.how_to_make()}", None, thresholds, reference_path=str(path))
    prompts = exactness.load_prompts()
    try:
        reference = exactness.read_reference(path)
    except exactness.ExactnessError as err:
        return _exact(INCONCLUSIVE, f"{err}: {target.how_to_make()}", None, thresholds, reference_path=str(path))
    why = exactness.comparable(reference, prompts)
    if why:
        return _exact(INCONCLUSIVE, f"{why}: {target.how_to_make()}", None, thresholds, reference_path=str(path))
    outputs, errors = exactness.collect(base_url, prompts, thresholds.exactness_concurrency, timeout,
                                        top_needed=False)
    if errors:
        return _exact(INCONCLUSIVE, f"{len(errors)} of {len(prompts)} exactness requests failed: {errors[0]}",
                      None, thresholds, errors=errors[:5], reference_path=str(path))
    v = exactness.compare(reference, [o for o in outputs if o], thresholds.exactness_tie_tolerance)
    return _exact(v.verdict, v.reason, None if v.equal is None else float(v.equal), thresholds,
                  reference_path=str(path), **v.details)


def record_reference(base_url: str, thresholds: GateThresholds, target: ExactnessTarget,
                     timeout: float = 600.0) -> GateResult:
    """The target alone (a non-speculative config that passed its gates): record its answers as the
    reference of its model, atomically. The verdict is pass (it is the target), or inconclusive when
    no reference could be recorded."""
    if target.identity is None:
        return _exact(INCONCLUSIVE, "the deploy description names no target model: no reference recorded",
                      None, thresholds)
    prompts = exactness.load_prompts()
    outputs, errors = exactness.collect(base_url, prompts, thresholds.exactness_concurrency, timeout)
    if errors:
        return _exact(INCONCLUSIVE, f"not speculative; no reference recorded: {len(errors)} of {len(prompts)} "
                      f"requests failed: {errors[0]}", None, thresholds, errors=errors[:5])
    path = exactness.reference_path(target.references_dir, target.identity)
    ref = exactness.build_reference(outputs, prompts, target.identity, config=target.config, host=target.host,
                                    release=target.release, concurrency=thresholds.exactness_concurrency)
    try:
        exactness.write_reference(path, ref)
    except OSError as err:
        return _exact(INCONCLUSIVE, f"not speculative; cannot write the reference {path}: {err.strerror or err}",
                      None, thresholds)
    return _exact(PASS, f"not speculative (the target itself): recorded the reference for {target.identity['label']} "
                  f"({len(prompts)} prompts x {exactness.MAX_NEW_TOKENS} tokens) in {path}", float(len(prompts)),
                  thresholds, reference_path=str(path), recorded=True)


# --- all gates ----------------------------------------------------------------------------------------------

def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class GateReport:
    url: str
    speculative: bool
    thresholds: GateThresholds
    results: list[GateResult]
    bench: bench.BenchResult | None = None
    baseline: dict | None = None  # who the baseline is: {"config", "host", "release", "finished"}
    started: str = ""
    finished: str = ""
    exactness: GateResult | None = None  # recorded apart from the gates list (docs/gates.md)
    exactness_enforced: bool = True  # False: the verdict is recorded, never blocks (the sweep's variants)

    @property
    def exactness_blocks(self) -> bool:
        """A failed exactness gate blocks; an inconclusive one only with gates.exactness_require_reference."""
        e = self.exactness
        if e is None or not self.exactness_enforced:
            return False
        return e.verdict == FAIL or (e.verdict == INCONCLUSIVE and self.thresholds.exactness_require_reference)

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results) and not self.exactness_blocks

    @property
    def failed_gates(self) -> list[str]:
        """Gates whose verdict is not pass (fail or inconclusive), and exactness when it blocks, in order."""
        failed = {r.gate for r in self.results if not r.passed} | ({"exactness"} if self.exactness_blocks else set())
        return [g for g in ALL_GATES if g in failed]

    def summary(self) -> str:
        """One line per gate, for people (exactness after smoke)."""
        lines = [r.line() for r in self.results]
        if self.exactness is not None:
            line = self.exactness.line()
            if self.exactness.verdict != PASS and not self.exactness_blocks:
                line += " (recorded, does not block)"
            lines.insert(1 if self.results and self.results[0].gate == "smoke" else 0, line)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": 1, "url": self.url, "speculative": self.speculative, "passed": self.passed,
            "failed_gates": self.failed_gates, "gates": [r.to_dict() for r in self.results],
            "exactness": self.exactness.to_dict() if self.exactness else None,
            "bench": self.bench.to_dict() if self.bench else None, "baseline": self.baseline,
            "thresholds": self.thresholds.to_dict(), "started": self.started, "finished": self.finished,
        }


def _baseline_info(record: dict | None) -> dict | None:
    if not record:
        return None
    return {k: record.get(k) for k in ("config", "host", "release", "finished")}


def run_all(base_url: str, thresholds: GateThresholds, speculative: bool, baseline_record: dict | None = None,
            only: list[str] | tuple[str, ...] | None = None, prompts: list[bench.Prompt] | None = None,
            bench_timeout: float = 600.0, smoke_timeout: float = 120.0,
            exactness_target: ExactnessTarget | None = None, exactness_enforced: bool = True) -> GateReport:
    """Smoke first; when it fails, the others are inconclusive and no bench runs. Then, for a speculative
    config, the exactness gate (when ``exactness_target`` says where references are). Then one bench run
    shared by the throughput and acceptance gates. A non-speculative config whose gates all passed records
    the reference of its model instead. ``only`` limits the gates (smoke always runs first when selected)."""
    base_url = serving.check_url(base_url)
    unknown = set(only or ()) - set(ALL_GATES)
    if unknown:
        raise GateError(f"--only {sorted(unknown)[0]!r} is not a gate; allowed: {', '.join(ALL_GATES)}")
    selected = [g for g in GATES if only is None or g in only]
    exact = exactness_target is not None and (only is None or "exactness" in only)
    report = GateReport(base_url, speculative, thresholds, [], baseline=_baseline_info(baseline_record),
                        started=_now(), exactness_enforced=exactness_enforced)
    if "smoke" in selected:
        report.results.append(smoke(base_url, thresholds, speculative, smoke_timeout))
    smoke_failed = bool(report.results) and not report.results[0].passed
    if exact and speculative:
        report.exactness = (_exact(INCONCLUSIVE, "skipped: the smoke gate failed", None, thresholds)
                            if smoke_failed else exactness_gate(base_url, thresholds, exactness_target, bench_timeout))
    rest = [g for g in selected if g != "smoke"]
    if rest and smoke_failed:
        for g in rest:
            metric = "tokens_per_s" if g == "throughput" else "accept_length"
            threshold = thresholds.min_tokens_per_s if g == "throughput" else thresholds.min_accept_length
            report.results.append(GateResult(g, metric, None, threshold, None, INCONCLUSIVE,
                                             "skipped: the smoke gate failed"))
    elif rest:
        report.bench = bench.run(base_url, prompts, thresholds.bench_requests, thresholds.bench_concurrency,
                                 thresholds.bench_max_tokens, bench_timeout)
        base = _bench_dict(baseline_record) if baseline_record else None
        if "throughput" in rest:
            report.results.append(throughput(report.bench, thresholds, base))
        if "acceptance" in rest:
            report.results.append(acceptance(report.bench, thresholds, base, speculative))
    if exact and not speculative:
        report.exactness = (record_reference(base_url, thresholds, exactness_target, bench_timeout)
                            if report.passed else
                            _exact(INCONCLUSIVE, "not speculative; no reference recorded: a gate did not pass",
                                   None, thresholds))
    report.finished = _now()
    return report


# --- command line -------------------------------------------------------------------------------------------

def load_thresholds(config_json: str | None,
                    thresholds_json: str | None) -> tuple[GateThresholds, bool | None]:
    """Thresholds from a config JSON file (``{"gates": {...}, "speculative": ...}`` as written by
    ``python -m sgdeploy render --json``, or a bare gates mapping) or an inline JSON string. Also
    returns what the file says about speculation (None when it says nothing)."""
    if config_json is not None:
        source = f"--config-json {config_json}"
        data = records.read_json(config_json, source, GateError)
    else:
        try:
            data = json.loads(thresholds_json)
        except ValueError as err:
            raise GateError(f"--thresholds-json {thresholds_json!r}: not JSON ({err})") from None
        source = "--thresholds-json"
    if not isinstance(data, dict):
        raise GateError(f"{source}: expected a JSON object, not {type(data).__name__}")
    speculative = None
    if "gates" in data:
        spec = data.get("speculative")
        if isinstance(spec, bool):
            speculative = spec
        elif isinstance(spec, dict) and isinstance(spec.get("algorithm"), str):
            speculative = spec["algorithm"].upper() != "NONE"
        data = data["gates"]
    try:
        return GateThresholds.from_mapping(data), speculative
    except GateError as err:
        raise GateError(f"{source}: {err}") from None


def _exactness_target(args: argparse.Namespace) -> ExactnessTarget:
    """References folder and model from ``--references`` and the deploy description (``--config-json``)."""
    if not args.config_json:
        raise GateError("--references needs --config-json with the deploy description (its models name the target)")
    data = records.read_json(args.config_json, f"--config-json {args.config_json}", GateError)
    return ExactnessTarget(args.references, exactness.model_identity(data), str(data.get("config") or "?"),
                           args.host, data.get("release"))


def main(argv: list[str] | None = None) -> int:
    parser = serving._Parser(prog="python -m sgdeploy.gate", description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="http://HOST:PORT of the service")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--config-json", metavar="FILE", help="config JSON with a gates mapping")
    src.add_argument("--thresholds-json", metavar="STRING", help="the gates mapping as a JSON string")
    parser.add_argument("--speculative", action=argparse.BooleanOptionalAction, default=None,
                        help="the config uses speculative decoding (default: what --config-json says)")
    parser.add_argument("--baseline", metavar="RECORD.json", help="the last good deploy record")
    parser.add_argument("--out", metavar="REPORT.json", help="write the report as JSON here")
    parser.add_argument("--only", action="append", choices=ALL_GATES, help="run only this gate (repeatable)")
    parser.add_argument("--references", metavar="DIR", help="the host's exactness references folder: a speculative "
                        "config is compared with its model's reference there, a non-speculative one records it")
    parser.add_argument("--host", metavar="NAME", default="?", help="the host's name (in references and messages)")
    parser.add_argument("--exactness-report-only", action="store_true",
                        help="record the exactness verdict without letting it fail the gates (the sweep's variants)")
    parser.add_argument("--bench-timeout", type=serving._positive(float), default=600.0,
                        help="seconds for the bench run (default 600)")
    parser.add_argument("--json", action="store_true", help="print the JSON report instead of the summary")
    parser.add_argument("--via-ssh", metavar="HOST", help="run from the controller: reach --url as HOST sees it "
                        "through an SSH tunnel (the service binds to loopback); needs --inventory")
    parser.add_argument("--inventory", metavar="INV", help="the Ansible inventory that names HOST (with --via-ssh)")
    args = parser.parse_args(argv)
    if args.via_ssh:
        if not args.inventory:
            print(f"{parser.prog}: --via-ssh {args.via_ssh} needs --inventory", file=sys.stderr)
            return 2
        return _via_ssh(parser, args, argv)
    try:
        url = serving.check_url(args.url)
        thresholds, file_speculative = load_thresholds(args.config_json, args.thresholds_json)
        speculative = args.speculative if args.speculative is not None else file_speculative
        if speculative is None:
            raise GateError("say --speculative or --no-speculative (the thresholds do not say which)")
        baseline = records.read_record(args.baseline) if args.baseline else None
        target = _exactness_target(args) if args.references else None
        if args.out and not Path(args.out).resolve().parent.is_dir():
            raise GateError(f"--out {args.out}: its folder does not exist")
    except (GateError, serving.UsageError, records.RecordError) as err:
        print(f"{parser.prog}: {err}", file=sys.stderr)
        return 2
    report = run_all(url, thresholds, speculative, baseline, args.only, bench_timeout=args.bench_timeout,
                     exactness_target=target, exactness_enforced=not args.exactness_report_only)
    data = report.to_dict()
    if args.out:
        records.write_json(args.out, data)
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
    else:
        print(report.summary())
        if report.bench:
            print(f"bench      {report.bench.summary()}")
        print("gates passed" if report.passed else f"gates failed: {', '.join(report.failed_gates)}")
    return 0 if report.passed else 1


def _via_ssh(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str] | None) -> int:
    """Open a tunnel to the service as the host sees it, then run the gates on the local end.

    Controller only (Fabric is not on the hosts): imported here so the host-side copy of this
    module keeps to the standard library.
    """
    from urllib.parse import urlsplit

    from sgdeploy import sweep, tunnel

    try:
        url = serving.check_url(args.url)
        parts = urlsplit(url)
        data = sweep.read_inventory(Path(args.inventory))
        name, hostvars = sweep.pick_host(data, Path(args.inventory), args.via_ssh)
    except (serving.UsageError, sweep.UsageError) as err:
        print(f"{parser.prog}: {err}", file=sys.stderr)
        return 2
    rest, skip = [], False
    for arg in (argv if argv is not None else sys.argv[1:]):
        if skip:
            skip = False
            continue
        if arg in ("--via-ssh", "--inventory", "--url"):
            skip = True
            continue
        if arg.startswith(("--via-ssh=", "--inventory=", "--url=")):
            continue
        rest.append(arg)
    try:
        with tunnel.forward(tunnel.Target.from_hostvars(name, hostvars), parts.port or 80,
                            remote_host=parts.hostname or "127.0.0.1") as local_url:
            print(f"gates through an SSH tunnel: {local_url} -> {name} -> {url}", file=sys.stderr)
            return main(["--url", local_url, *rest])
    except tunnel.TunnelError as err:
        print(f"{parser.prog}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
