# Copyright: sgdeploy contributors. Apache-2.0
"""Deploy gates: smoke, exactness, throughput and acceptance, each with a verdict pass, fail or inconclusive.

A gate result names the metric, the observed value, the absolute threshold from the config, the
baseline (the last good deploy of the same config on the same host) and the verdict, in the manner
of Argo Rollouts / Flagger analysis runs. See docs/gates.md.

The one implementation: the gate module (sgdeploy.host.sglang_gate) runs it on the host, the controller's
``sgdeploy gate`` imports it (the ``sgdeploy`` package carries this collection's module_utils).
Standard library only.
"""

from __future__ import annotations

import threading
import time
import unicodedata
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_gate_bench as bench
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_gate_exactness as exactness
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_gate_selfcheck as selfcheck
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_http
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_gate_bench import BenchResult

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


class GateThresholds:
    """Every setting of the config's ``gates:`` mapping, as attributes.

    The keys, kinds, defaults and bounds are defined once, in the config schema (``sgdeploy/gate_schema.py``,
    on the controller): the controller's ``sgdeploy.gate.GateThresholds`` fills the defaults and checks the
    values with it, and the deploy description (``sgdeploy render --json``) carries the complete, checked
    mapping to the host, where the gate module builds this from it."""

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = dict(values)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise GateError(f"gates.{name}: not given; the gates take the complete gates mapping of the deploy "
                            "description (sgdeploy render --json)") from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GateThresholds) and self._values == other._values

    def __repr__(self) -> str:
        return f"GateThresholds({self._values!r})"

    def to_dict(self) -> dict[str, Any]:
        return dict(self._values)


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
    base_url = sglang_http.check_url(base_url)

    def result(verdict: str, reason: str, value: float | None = None, **details: Any) -> GateResult:
        return GateResult("smoke", "deterministic_answer", value, None, None, verdict, reason, details)

    answers = []
    for attempt in (1, 2):
        try:
            answers.append(sglang_http.generate(base_url, thresholds.smoke_prompt, thresholds.smoke_max_tokens,
                                            timeout))
        except sglang_http.ServingError as err:
            return result(FAIL, f"request {attempt} of 2 failed: {err}")
    texts, metas = [a.get("text") for a in answers], [a.get("meta_info") or {} for a in answers]
    said: list[str] = []  # the texts, each checked to be a string
    for attempt, (text, meta) in enumerate(zip(texts, metas, strict=True), 1):
        if not isinstance(text, str) or not text.strip():
            return result(FAIL, f"answer {attempt} of 2 is empty", 0.0, answer=text)
        said.append(text)
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
    if said[0] != said[1]:
        return result(FAIL, f"two identical greedy requests gave different answers: {_excerpt(said[0])} "
                            f"vs {_excerpt(said[1])}", answer=said[0], answer_2=said[1])
    tokens = metas[0]["completion_tokens"]
    reason = f"answered {tokens} tokens twice, identically"
    accept = bench.accept_length(metas[0])
    if speculative:
        if accept is None:  # spec_verify_ct > 0 and completion_tokens > 0, checked above
            raise AssertionError("accept is None")
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


def _compare(value: float, base_value: float, metric: str, what: str, allowed: float,
             reasons: list[str], problems: list[str]) -> float:
    """Compare ``value`` with one baseline (``what`` names it), within ``allowed`` percent below it;
    returns the change in percent."""
    change = 100.0 * (value - base_value) / base_value
    if -change > allowed:
        problems.append(f"{metric} {_num(value)} is {-change:.1f}% below {what} ({_num(base_value)}); "
                        f"allowed {allowed:g}%")
    else:
        direction = "below" if change < 0 else "above"
        reasons.append(f"{abs(change):.1f}% {direction} {what} ({_num(base_value)}); allowed {allowed:g}% below")
    return change


def _same_window(gate: str, metric: str, value: float, bench_d: dict, peer: dict, thresholds: GateThresholds,
                 base_key: str, reasons: list[str], problems: list[str]) -> dict:
    """The canary against an old replica measured side by side with it (same prompts, same window):
    its number is a second baseline, within the same ``max_regression_pct``. An old replica whose bench
    did not complete enough requests, or that was measured differently, is not compared (recorded), and
    the gate is then inconclusive (_judge)."""
    what = f"the old replica in the same window ({peer.get('url')})"
    out = {"url": peer.get("url"), "value": None, "change_pct": None, "compared": False}
    raw = peer.get(base_key)
    differs = _measured_differently(gate, bench_d, peer)
    if peer.get("completed_fraction", 0.0) < thresholds.min_completed_fraction:
        reasons.append(f"{what}: only {peer.get('completed')} of {peer.get('requests')} of its bench requests "
                       "completed: not compared")
    elif differs:
        reasons.append(f"{what} measured differently ({differs}): not compared")
    elif not isinstance(raw, int | float) or raw <= 0:
        reasons.append(f"{what} has no usable {metric} ({raw!r}): not compared")
    else:
        out["value"] = float(raw)
        out["change_pct"] = round(_compare(value, float(raw), metric, what, thresholds.max_regression_pct,
                                           reasons, problems), 2)
        out["compared"] = True
    return out


def _judge(gate: str, metric: str, value: float, threshold: float | None, bench_d: dict,
           baseline: dict | None, thresholds: GateThresholds, base_key: str,
           peer: dict | None = None) -> GateResult:
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
            _compare(value, base_value, metric, "the last good deploy", thresholds.max_regression_pct,
                     reasons, problems)
    details = {}
    if peer is not None:
        details["same_window"] = _same_window(gate, metric, value, bench_d, peer, thresholds, base_key,
                                              reasons, problems)
    if problems:
        return GateResult(gate, metric, value, threshold, base_value, FAIL, "; ".join(problems), details)
    if peer is not None and not details["same_window"]["compared"]:
        # A canary is judged against an old replica in the same window; without that comparison it is not
        # known to be as good as the replicas it would replace: inconclusive, and the rollout stops.
        return GateResult(gate, metric, value, threshold, base_value, INCONCLUSIVE,
                          "; ".join(reasons) + "; the canary's same-window comparison could not be made: inconclusive",
                          details)
    return GateResult(gate, metric, value, threshold, base_value, PASS, "; ".join(reasons), details)


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
               baseline: bench.BenchResult | dict | None = None,
               peer: bench.BenchResult | dict | None = None) -> GateResult:
    """Tokens/s of the bench against ``min_tokens_per_s``, the baseline bench (or record) and, for a canary,
    ``peer``: the bench of an old replica run side by side with it in the same window."""
    b, base, other = _bench_dict(bench_result), _bench_dict(baseline), _bench_dict(peer)
    if b is None:  # the candidate's own bench (a BenchResult or its dict), never absent
        raise AssertionError("b is None")
    threshold = thresholds.min_tokens_per_s
    return (_too_few("throughput", "tokens_per_s", threshold, b, thresholds)
            or _judge("throughput", "tokens_per_s", float(b["tokens_per_s"]), threshold, b, base, thresholds,
                      "tokens_per_s", other))


def acceptance(bench_result: bench.BenchResult | dict, thresholds: GateThresholds,
               baseline: bench.BenchResult | dict | None = None, speculative: bool = True,
               peer: bench.BenchResult | dict | None = None) -> GateResult:
    """Mean accept length of the bench against ``min_accept_length``, the baseline and (a canary) ``peer``,
    the same-window bench of an old replica.

    A non-speculative config passes with the reason "not speculative": it accepts exactly one
    token per step by construction, and there is nothing to measure.
    """
    threshold = thresholds.min_accept_length
    if not speculative:
        return GateResult("acceptance", "accept_length", None, threshold, None, PASS,
                          "not speculative: one token per step by construction, nothing to gate")
    b, base, other = _bench_dict(bench_result), _bench_dict(baseline), _bench_dict(peer)
    if b is None:  # the candidate's own bench (a BenchResult or its dict), never absent
        raise AssertionError("b is None")
    too_few = _too_few("acceptance", "accept_length", threshold, b, thresholds)
    if too_few:
        return too_few
    if not b.get("accept_length_requests"):
        return GateResult("acceptance", "accept_length", None, threshold, None, FAIL,
                          "no completed request reported spec_verify_ct or spec_accept_length: "
                          "speculative decoding is not running")
    result = _judge("acceptance", "accept_length", float(b["accept_length_mean"]), threshold, b, base,
                    thresholds, "accept_length_mean", other)
    result.details.update({"stdev": b.get("accept_length_stdev"), "requests": b.get("accept_length_requests"),
                           "step_time_ms_mean": b.get("step_time_ms_mean")})
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
    """A speculative candidate against the recorded reference of its model (the autoregressive server's
    answers, sglang_gate_exactness) when there is a usable one; otherwise against the target's own prefill on
    the same server (sglang_gate_selfcheck). Either way the verdict is pass or fail; inconclusive only when
    requests failed. ``gates.exactness_require_reference`` refuses the self-check (fail, saying why)."""
    path = None if target.identity is None else exactness.reference_path(target.references_dir, target.identity)
    where = {} if path is None else {"reference_path": str(path)}
    prompts = exactness.load_prompts()
    missing: str | None
    if target.identity is None or path is None:  # path is None exactly when identity is
        missing = "the deploy description names no target model, so there is no reference to compare with"
    elif not path.is_file():
        missing = f"no reference outputs for {target.identity['label']} on this host yet ({path})"
    else:
        try:
            reference = exactness.read_reference(path)
            missing = exactness.comparable(reference, prompts)
        except exactness.ExactnessError as err:
            missing = str(err)
        if missing is None:
            return _against_reference(base_url, thresholds, reference, prompts, timeout, where)
    if thresholds.exactness_require_reference:
        return _exact(FAIL, f"{missing}; gates.exactness_require_reference is true, so the check against the "
                      f"target's own prefill is not enough: {target.how_to_make()}", None, thresholds,
                      method="none", **where)
    v = selfcheck.self_check(base_url, prompts, thresholds.exactness_tie_tolerance, thresholds.exactness_concurrency,
                             timeout)
    return _exact(v.verdict, f"{v.reason} (self-check: {missing})", None if v.equal is None else float(v.equal),
                  thresholds, reference_missing=missing, **where, **v.details)


def _against_reference(base_url: str, thresholds: GateThresholds, reference: dict, prompts: list,
                       timeout: float, where: dict) -> GateResult:
    outputs, errors = exactness.collect(base_url, prompts, thresholds.exactness_concurrency, timeout,
                                        top_needed=False)
    if errors:
        return _exact(INCONCLUSIVE, f"{len(errors)} of {len(prompts)} exactness requests failed: {errors[0]}",
                      None, thresholds, method="reference", errors=errors[:5], **where)
    v = exactness.compare(reference, [o for o in outputs if o], thresholds.exactness_tie_tolerance)
    return _exact(v.verdict, v.reason, None if v.equal is None else float(v.equal), thresholds,
                  method="reference", **where, **v.details)


def record_reference(base_url: str, thresholds: GateThresholds, target: ExactnessTarget,
                     timeout: float = 600.0) -> GateResult:
    """The target alone (a non-speculative config that passed its gates): record its answers as the
    reference of its model, atomically. The verdict is pass (it is the target), or inconclusive when
    no reference could be recorded."""
    if target.identity is None:
        return _exact(PASS, "not speculative (the target itself); no reference recorded: the deploy description "
                      "names no target model", None, thresholds)
    prompts = exactness.load_prompts()
    outputs, errors = exactness.collect(base_url, prompts, thresholds.exactness_concurrency, timeout)
    if errors:
        return _exact(INCONCLUSIVE, f"not speculative; no reference recorded: {len(errors)} of {len(prompts)} "
                      f"requests failed: {errors[0]}", None, thresholds, errors=errors[:5])
    path = exactness.reference_path(target.references_dir, target.identity)
    # No errors: collect answered every prompt (it sets an answer or an error for each; only a worker still
    # running after its join would leave a None, on which build_reference fails as it always did).
    answered = cast("list[dict]", outputs)
    ref = exactness.build_reference(answered, prompts, target.identity, config=target.config, host=target.host,
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
    bench: BenchResult | None = None  # (the class by its own name: this field hides the module in here)
    baseline: dict | None = None  # who the baseline is: {"config", "host", "release", "finished"}
    started: str = ""
    finished: str = ""
    exactness: GateResult | None = None  # recorded apart from the gates list (docs/gates.md)
    exactness_enforced: bool = True  # False: the verdict is recorded, never blocks (the sweep's variants)
    # A canary's second baseline: an old replica's bench run side by side with the canary's (same prompts,
    # same counts, the same window); None when no old replica was named (peer_url).
    peer_bench: BenchResult | None = None

    @property
    def exactness_blocks(self) -> bool:
        """A failed exactness gate blocks; an inconclusive one too unless gates.exactness_inconclusive is warn."""
        e = self.exactness
        if e is None or not self.exactness_enforced:
            return False
        return e.verdict == FAIL or (e.verdict == INCONCLUSIVE and self.thresholds.exactness_inconclusive != "warn")

    @property
    def passed(self) -> bool:
        """Nothing blocks: every selected gate passed and exactness passed or does not block. ``all_passed``
        says whether every verdict, exactness included, is pass."""
        return bool(self.results) and all(r.passed for r in self.results) and not self.exactness_blocks

    @property
    def all_passed(self) -> bool:
        return self.passed and (self.exactness is None or self.exactness.passed)

    @property
    def failed_gates(self) -> list[str]:
        """Gates whose verdict is not pass (fail or inconclusive), and exactness when it blocks, in order."""
        failed = {r.gate for r in self.results if not r.passed} | ({"exactness"} if self.exactness_blocks else set())
        return [g for g in ALL_GATES if g in failed]

    def _why_not_blocking(self) -> str:
        if not self.exactness_enforced:
            return "recorded, does not block: report only"
        return "recorded, does not block: gates.exactness_inconclusive is warn"

    def summary(self) -> str:
        """One line per gate, for people (exactness after smoke)."""
        lines = [r.line() for r in self.results]
        if self.exactness is not None:
            line = self.exactness.line()
            if self.exactness.verdict != PASS and not self.exactness_blocks:
                line += f" ({self._why_not_blocking()})"
            lines.insert(1 if self.results and self.results[0].gate == "smoke" else 0, line)
        return "\n".join(lines)

    def verdict_line(self) -> str:
        """``gates passed`` only when every verdict is pass; a verdict that did not pass and does not block is
        named, never summarised as passed."""
        if not self.passed:
            return f"gates failed: {', '.join(self.failed_gates)}"
        if self.all_passed:
            return "gates passed"
        if self.exactness is None:  # passed but not all passed: exactness did not pass
            raise AssertionError("self.exactness is None")
        return (f"gates not all passed, none blocks: exactness {self.exactness.verdict.upper()} "
                f"({self._why_not_blocking()})")

    def lines(self) -> list[str]:
        """What people read: one line per gate, the bench line, then the verdict line (``verdict_line``)."""
        lines = self.summary().splitlines()
        if self.bench:
            lines.append(f"bench      {self.bench.summary()}")
        if self.peer_bench:
            lines.append(f"same window, old replica {self.peer_bench.url}: {self.peer_bench.summary()}")
        lines.append(self.verdict_line())
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": 1, "url": self.url, "speculative": self.speculative, "passed": self.passed,
            "all_passed": self.all_passed, "verdict_line": self.verdict_line(), "failed_gates": self.failed_gates,
            "gates": [r.to_dict() for r in self.results],
            "exactness": self.exactness.to_dict() if self.exactness else None,
            "bench": self.bench.to_dict() if self.bench else None, "baseline": self.baseline,
            "same_window": _same_window_record(self.peer_bench),
            "thresholds": self.thresholds.to_dict(), "started": self.started, "finished": self.finished,
        }


def _same_window_record(peer: bench.BenchResult | None) -> dict | None:
    """What a record keeps of the old replica's same-window bench (its samples left out)."""
    if peer is None:
        return None
    return {"url": peer.url, "bench": {k: v for k, v in peer.to_dict().items() if k != "samples"}}


def side_by_side(base_url: str, peer_url: str, prompts: list[bench.Prompt] | None, thresholds: GateThresholds,
                 timeout: float) -> tuple[bench.BenchResult, bench.BenchResult]:
    """The same bench (prompts, requests, concurrency, tokens) against the candidate and an old replica at
    the same time, each in its own thread and both bounded by ``timeout``: two numbers from one window."""
    args = (prompts, thresholds.bench_requests, thresholds.bench_concurrency, thresholds.bench_max_tokens, timeout)
    out: dict[str, bench.BenchResult | Exception] = {}

    def measure(key: str, url: str) -> None:
        try:
            out[key] = bench.run(url, *args)
        except Exception as err:  # noqa: BLE001 - handed to the caller's thread below
            out[key] = err

    threads = [threading.Thread(target=measure, args=(k, u), daemon=True)
               for k, u in (("candidate", base_url), ("peer", peer_url))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    candidate, peer = out["candidate"], out["peer"]
    if isinstance(candidate, Exception):
        raise candidate
    if isinstance(peer, Exception):
        raise peer
    return candidate, peer


def _baseline_info(record: dict | None) -> dict | None:
    if not record:
        return None
    return {k: record.get(k) for k in ("config", "host", "release", "finished")}


def run_all(base_url: str, thresholds: GateThresholds, speculative: bool, baseline_record: dict | None = None,
            only: list[str] | tuple[str, ...] | None = None, prompts: list[bench.Prompt] | None = None,
            bench_timeout: float = 600.0, smoke_timeout: float = 120.0,
            exactness_target: ExactnessTarget | None = None, exactness_enforced: bool = True,
            peer_url: str | None = None) -> GateReport:
    """Smoke first; when it fails, the others are inconclusive and no bench runs. Then, for a speculative
    config, the exactness gate (when ``exactness_target`` says where references are). Then one bench run
    shared by the throughput and acceptance gates. A non-speculative config whose gates all passed records
    the reference of its model instead. ``only`` limits the gates (smoke always runs first when selected).
    With ``peer_url`` (a canary: an old replica of the same config), the bench runs against both side by
    side in the same window, and the old replica's numbers are a second baseline (docs/router.md)."""
    base_url = sglang_http.check_url(base_url)
    peer_url = sglang_http.check_url(peer_url) if peer_url else None
    unknown = set(only or ()) - set(ALL_GATES)
    if unknown:
        raise GateError(f"--only {sorted(unknown)[0]!r} is not a gate; allowed: {', '.join(ALL_GATES)}")
    selected = [g for g in GATES if only is None or g in only]
    # The exactness gate's target: where references are, when given and selected (None: no exactness gate).
    exact = exactness_target if only is None or "exactness" in only else None
    report = GateReport(base_url, speculative, thresholds, [], baseline=_baseline_info(baseline_record),
                        started=_now(), exactness_enforced=exactness_enforced)
    if "smoke" in selected:
        report.results.append(smoke(base_url, thresholds, speculative, smoke_timeout))
    smoke_failed = bool(report.results) and not report.results[0].passed
    if exact is not None and speculative:
        report.exactness = (_exact(INCONCLUSIVE, "skipped: the smoke gate failed", None, thresholds)
                            if smoke_failed else exactness_gate(base_url, thresholds, exact, bench_timeout))
    rest = [g for g in selected if g != "smoke"]
    if rest and smoke_failed:
        for g in rest:
            metric = "tokens_per_s" if g == "throughput" else "accept_length"
            threshold = thresholds.min_tokens_per_s if g == "throughput" else thresholds.min_accept_length
            report.results.append(GateResult(g, metric, None, threshold, None, INCONCLUSIVE,
                                             "skipped: the smoke gate failed"))
    elif rest:
        if peer_url:
            report.bench, report.peer_bench = side_by_side(base_url, peer_url, prompts, thresholds, bench_timeout)
        else:
            report.bench = bench.run(base_url, prompts, thresholds.bench_requests, thresholds.bench_concurrency,
                                     thresholds.bench_max_tokens, bench_timeout)
        base = _bench_dict(baseline_record) if baseline_record else None
        peer = report.peer_bench.to_dict() if report.peer_bench else None
        if "throughput" in rest:
            report.results.append(throughput(report.bench, thresholds, base, peer))
        if "acceptance" in rest:
            report.results.append(acceptance(report.bench, thresholds, base, speculative, peer))
    if exact is not None and not speculative:
        report.exactness = (record_reference(base_url, thresholds, exact, bench_timeout)
                            if report.passed else
                            _exact(INCONCLUSIVE, "not speculative; no reference recorded: a gate did not pass",
                                   None, thresholds))
    report.finished = _now()
    return report
