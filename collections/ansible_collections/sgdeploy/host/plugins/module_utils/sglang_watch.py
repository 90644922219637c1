# Copyright: sgdeploy contributors. Apache-2.0
"""The post-deploy watch (docs/monitoring-watch.md): an engine's live ``/metrics`` read every interval over a
window, each interval judged against the config's ``watch`` thresholds, Argo Rollouts style.

Per interval, from SGLang 0.5.23's tokenizer counters (counted when a request finishes; summed over their
``is_streaming`` label):

- requests: Δ ``sglang:num_requests_total`` (finished) + Δ ``sglang:num_aborted_requests_total`` (aborted);
- accept length: Δ ``sglang:generation_tokens_total`` / Δ ``sglang:spec_verify_calls_total`` (the one
  definition the alert rules and the dashboard use too);
- tokens/s: Δ ``sglang:generation_tokens_total`` / the interval's seconds;
- error rate: aborted / requests.

An interval with fewer than ``min_requests`` requests is **inconclusive**: it is neither a failure nor a pass,
and it does not break a run of consecutive failures (a quiet spell between two failed intervals does not
hide a collapse that is still there). Otherwise it **fails** when a threshold is missed (accept length below
``min_accept_length``, tokens/s below ``min_tokens_per_s``, error rate above ``max_error_rate``), when the
counters went back (the engine restarted) or when ``/metrics`` did not answer; ``failure_limit`` consecutive
failures end the watch at once, ``failed``. At the end of the window: ``inconclusive`` when every interval
was, else ``passed``.

Why a parser here: a host runs this with its system ``python3``, which has no ``prometheus_client`` (the
controller parses ``/metrics`` with it, ``sgdeploy.serving``); the watch needs only the sums of four
counters, so ``parse`` reads the text format's sample lines and nothing else. Standard library only.
"""

from __future__ import annotations

import math
import time

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_http

GENERATION = "sglang:generation_tokens_total"
VERIFY = "sglang:spec_verify_calls_total"
FINISHED = "sglang:num_requests_total"
ABORTED = "sglang:num_aborted_requests_total"
COUNTERS = (GENERATION, VERIFY, FINISHED, ABORTED)

RESULTS = ("passed", "failed", "inconclusive")


class WatchError(Exception):
    """The watch could not read the engine's metrics (one line)."""


def _sample_name_and_rest(line: str) -> tuple[str, str]:
    """The metric name of a sample line and what follows its labels (value and optional timestamp)."""
    brace = line.find("{")
    space = min((i for i in (line.find(" "), line.find("\t")) if i >= 0), default=-1)
    if brace < 0 or (0 <= space < brace):
        return line[:space], line[space:]
    i, quoted = brace + 1, False
    while i < len(line):
        c = line[i]
        if quoted and c == "\\":
            i += 2
            continue
        if c == '"':
            quoted = not quoted
        elif c == "}" and not quoted:
            return line[:brace].strip(), line[i + 1:]
        i += 1
    raise ValueError("unterminated label set")


def parse(text: str, names: tuple[str, ...] = COUNTERS) -> dict[str, float]:
    """The sum over all label sets of each metric in ``names`` in Prometheus text ``text`` (absent: not in the
    result). Raises WatchError on a sample line that is not of the text format."""
    sums: dict[str, float] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            name, rest = _sample_name_and_rest(line)
            value = float(rest.split()[0])
        except (ValueError, IndexError):
            raise WatchError(f"/metrics line {n} is not a Prometheus sample: {line[:120]!r}") from None
        if name in names and not math.isnan(value):
            sums[name] = sums.get(name, 0.0) + value
    return sums


def read(url: str, timeout: float = 10.0) -> dict[str, float]:
    """The counters of the engine at ``url`` (its ``/metrics``). Raises WatchError when it does not answer."""
    try:
        status, raw = sglang_http.request("GET", url.rstrip("/") + "/metrics", None, timeout)
    except OSError as err:
        raise WatchError(f"/metrics did not answer: {sglang_http.reason(err)}") from None
    if status != 200:
        raise WatchError(f"/metrics answered HTTP {status} (the engine runs with --enable-metrics?)")
    counters = parse(raw.decode("utf-8", errors="replace"))
    if FINISHED not in counters:
        raise WatchError(f"/metrics has no {FINISHED}: not an SGLang engine's metrics")
    return counters


class Thresholds:
    """The watch's thresholds (the config's resolved ``watch`` mapping: ``sgdeploy render --json``)."""

    def __init__(self, min_requests: int = 10, min_accept_length: float | None = None,
                 min_tokens_per_s: float | None = None, max_error_rate: float | None = 0.05):
        self.min_requests = int(min_requests)
        self.min_accept_length = None if not min_accept_length else float(min_accept_length)
        self.min_tokens_per_s = None if not min_tokens_per_s else float(min_tokens_per_s)
        self.max_error_rate = None if max_error_rate is None else float(max_error_rate)

    def as_dict(self) -> dict:
        return {"min_requests": self.min_requests, "min_accept_length": self.min_accept_length,
                "min_tokens_per_s": self.min_tokens_per_s, "max_error_rate": self.max_error_rate}


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def judge_interval(index: int, prev: dict[str, float], cur: dict[str, float], seconds: float, th: Thresholds,
                   speculative: bool = True) -> dict:
    """One interval's numbers and verdict (pass, fail, inconclusive) from the counters at its start and end."""
    d = {k: cur.get(k, 0.0) - prev.get(k, 0.0) for k in COUNTERS}
    out: dict = {"interval": index, "seconds": round(seconds, 2), "finished": int(d[FINISHED]),
                 "aborted": int(d[ABORTED]), "requests": int(d[FINISHED] + d[ABORTED]),
                 "generation_tokens": int(d[GENERATION]), "verify_calls": int(d[VERIFY]),
                 "accept_length": None, "tokens_per_s": None, "error_rate": None, "verdict": "pass", "reasons": []}
    if any(v < 0 for v in d.values()):
        out.update(verdict="fail", reasons=["the counters went back: the engine restarted during the interval"])
        return out
    requests = out["requests"]
    if speculative and d[VERIFY] > 0:
        out["accept_length"] = _r(d[GENERATION] / d[VERIFY])
    out["tokens_per_s"] = _r(d[GENERATION] / seconds if seconds > 0 else 0.0, 2)
    out["error_rate"] = _r(d[ABORTED] / requests, 4) if requests else None
    if requests < th.min_requests:
        out.update(verdict="inconclusive",
                   reasons=[f"{requests} request(s) ended, fewer than min_requests {th.min_requests}"])
        return out
    reasons = []
    if speculative and th.min_accept_length is not None:
        if out["accept_length"] is None:
            reasons.append("no verify steps counted: speculative decoding is not running")
        elif out["accept_length"] < th.min_accept_length:
            reasons.append(f"accept length {out['accept_length']:.2f} below {th.min_accept_length:g}")
    if th.min_tokens_per_s is not None and out["tokens_per_s"] < th.min_tokens_per_s:
        reasons.append(f"{out['tokens_per_s']:.1f} tokens/s below {th.min_tokens_per_s:g}")
    if th.max_error_rate is not None and out["error_rate"] is not None and out["error_rate"] > th.max_error_rate:
        reasons.append(f"error rate {out['error_rate']:.3f} ({out['aborted']} of {requests} aborted) above "
                       f"{th.max_error_rate:g}")
    if reasons:
        out.update(verdict="fail", reasons=reasons)
    return out


class Tally:
    """The Argo-style run over the intervals: consecutive failures, the result."""

    def __init__(self, failure_limit: int):
        self.failure_limit = int(failure_limit)
        self.intervals: list[dict] = []
        self.consecutive = 0

    def add(self, interval: dict) -> bool:
        """Count one interval; True when the watch has failed (``failure_limit`` consecutive failures)."""
        self.intervals.append(interval)
        if interval["verdict"] == "fail":
            self.consecutive += 1
        elif interval["verdict"] == "pass":
            self.consecutive = 0
        # inconclusive: neither counts nor resets the run of failures
        return self.failed

    @property
    def failed(self) -> bool:
        return self.consecutive >= self.failure_limit

    def count(self, verdict: str) -> int:
        return sum(1 for i in self.intervals if i["verdict"] == verdict)

    @property
    def result(self) -> str:
        if self.failed:
            return "failed"
        if self.intervals and self.count("inconclusive") == len(self.intervals):
            return "inconclusive"
        return "passed" if self.intervals else "inconclusive"


def _span(intervals: list[dict], key: str) -> str:
    vals = [i[key] for i in intervals if i.get(key) is not None]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    return f"{lo:.2f}" if lo == hi else f"{lo:.2f} to {hi:.2f}"


def line(tally: Tally, window_s: int, interval_s: int, min_requests: int) -> str:
    """One sentence of what the watch found (the deploy's output and the record's ``watch.line``)."""
    n = len(tally.intervals)
    counts = f"{tally.count('pass')} passed, {tally.count('fail')} failed, {tally.count('inconclusive')} inconclusive"
    judged = [i for i in tally.intervals if i["verdict"] != "inconclusive"]
    accept = _span(judged, "accept_length")
    numbers = (f"; accept length {accept}" if accept else "") + (
        f"; {_span(judged, 'tokens_per_s')} tokens/s" if judged else "")
    if tally.result == "failed":
        last = tally.intervals[-1]
        return (f"watch FAILED after {n} interval(s) of {interval_s} s: {tally.consecutive} consecutive failed "
                f"interval(s) (failure_limit {tally.failure_limit}); interval {last['interval']}: "
                f"{'; '.join(last['reasons'])} ({counts})")
    if tally.result == "inconclusive":
        most = max((i["requests"] for i in tally.intervals), default=0)
        return (f"watch INCONCLUSIVE over {window_s} s ({n} interval(s) of {interval_s} s): too little traffic to "
                f"judge in every interval (at most {most} request(s) in one; min_requests {min_requests}); "
                f"kept, not passed")
    return f"watch passed over {window_s} s ({n} interval(s) of {interval_s} s: {counts}{numbers})"


def watch(url: str, window_s: int, interval_s: int, failure_limit: int, th: Thresholds, speculative: bool = True,
          fetch=read, clock=time.monotonic, sleep=time.sleep) -> dict:
    """Read ``url``'s counters now and after every interval of the window; stop at the first ``failure_limit``
    consecutive failed intervals. Returns {"result", "line", "intervals", ...} (``fetch``, ``clock`` and
    ``sleep`` are the tests' seams)."""
    tally = Tally(failure_limit)
    count = max(1, int(window_s) // int(interval_s))
    start = clock()
    prev: dict[str, float] | None = None
    prev_t = start
    try:
        prev = fetch(url)
    except WatchError as exc:
        first_problem = str(exc)
    else:
        first_problem = ""
    for i in range(1, count + 1):
        wait = start + i * interval_s - clock()
        if wait > 0:
            sleep(wait)
        now = clock()
        try:
            cur = fetch(url)
        except WatchError as exc:
            interval = {"interval": i, "seconds": round(now - prev_t, 2), "verdict": "fail",
                        "reasons": [str(exc)], "requests": 0}
            if tally.add(interval):
                break
            continue
        if prev is None:
            interval = {"interval": i, "seconds": round(now - prev_t, 2), "verdict": "fail",
                        "reasons": [f"no counters at the interval's start: {first_problem}"], "requests": 0}
        else:
            interval = judge_interval(i, prev, cur, now - prev_t, th, speculative)
        prev, prev_t = cur, now
        if tally.add(interval):
            break
    return {"result": tally.result, "line": line(tally, window_s, interval_s, th.min_requests),
            "intervals": tally.intervals,
            "failed_intervals": tally.count("fail"), "inconclusive_intervals": tally.count("inconclusive"),
            "consecutive_failures": tally.consecutive, "window_s": int(window_s), "interval_s": int(interval_s),
            "failure_limit": int(failure_limit), "thresholds": th.as_dict(), "url": url,
            "seconds": round(clock() - start, 1)}
