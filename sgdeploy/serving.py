"""Talking to a running SGLang service: health, drain, warm-up, one greedy request.

The HTTP client (``generate``, ``check_url``, ``is_healthy``, the health wait) is the project's one HTTP/health
helper, the collection's module_utils ``sglang_http``, which the host modules run too; the installed
``sgdeploy`` package carries it (docs/gates.md, "One implementation"). What is the controller's alone: the
drain, whose ``/metrics`` reading uses ``prometheus_client``'s text parser (hosts have no such package, and no
host module reads metrics), the warm-up, and this command line. Deploys wait with the
``sgdeploy.host.sglang_deploy_wait`` module.

Command line (exit 0 done, 1 timed out or failed, 2 misuse)::

    python -m sgdeploy.serving wait-healthy --url URL --timeout S [--json]
    python -m sgdeploy.serving wait-drained --url URL --timeout S [--json]
    python -m sgdeploy.serving warmup --url URL --requests N --max-tokens M [--timeout S] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import NoReturn

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_units as units
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_http
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_http import (  # noqa: F401
    ServingError,
    UsageError,
    check_url,
    generate,
    is_healthy,
)
from prometheus_client.parser import text_string_to_metric_families

# Gauges that count requests the engine still owns; all of them must read 0 before a stop.
IN_FLIGHT_GAUGES = ("sglang:num_running_reqs", "sglang:num_queue_reqs")

WARMUP_PROMPT = "Warm-up: list the first ten prime numbers and explain why 1 is not prime."


class MetricsUnavailable(ServingError):
    """The service answers but has no in-flight gauge: a drain cannot be watched, waiting will not help."""


@dataclass
class WaitResult:
    ok: bool
    state: str  # healthy | exited | drained | gone | timeout | no-metrics
    waited_s: float
    detail: str = ""
    in_flight: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def wait_healthy(base_url: str, timeout: float, interval: float = 1.0, unit: str | None = None) -> WaitResult:
    """Poll ``/health`` until it answers 200 or ``timeout`` seconds have passed (``sglang_http.wait_healthy``).

    With ``unit``, give up early when systemd reports the service failed or stopped, or restarted
    since this wait began (a crash at start, a failed CUDA-graph capture): waiting out a 30-minute
    load timeout would tell nothing more.
    """
    start = time.monotonic()
    baseline = units.n_restarts(unit) if unit else 0
    state, detail = sglang_http.wait_healthy(base_url, unit, baseline, start + timeout, timeout, interval,
                                             probe_timeout=min(5.0, max(interval, 1.0)), clock=time.monotonic)
    waited = round(time.monotonic() - start, 3)
    if state == "healthy":
        return WaitResult(True, state, waited, "service is healthy")
    if state == "exited":
        return WaitResult(False, state, waited, detail)
    return WaitResult(False, "timeout", waited, f"{base_url}/health did not answer 200 within {timeout:g} s")


def parse_metrics(text: str) -> dict[str, float]:
    """Sum Prometheus text-format samples by metric name (over all label sets), with ``prometheus_client``'s
    parser; a sample keeps its exposed name (a counter's ``sglang:num_requests_total``, not its family's).
    Raises ServingError when the text is not Prometheus text format."""
    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + float(sample.value)
    except ValueError as err:
        raise ServingError(f"/metrics answered something that is not Prometheus text: {err}") from None
    return totals


def in_flight(base_url: str, timeout: float = 5.0) -> float | None:
    """Requests the engine still owns (running plus queued), from ``/metrics``.

    Returns None when nothing listens at ``base_url`` (the service is gone). Raises
    MetricsUnavailable when the service answers but exposes no ``sglang:num_running_reqs``
    (metrics not enabled: ``--enable-metrics`` is needed for a safe drain), ServingError when
    the answer is slow or broken.
    """
    try:
        status, raw = sglang_http.request("GET", base_url + "/metrics", None, timeout)
    except OSError as err:
        if sglang_http.refused(err):
            return None
        raise ServingError(f"/metrics failed: {sglang_http.reason(err)}") from None
    if status in (404, 405):
        raise MetricsUnavailable(f"/metrics answered HTTP {status}; start the server with --enable-metrics")
    if status != 200:
        raise ServingError(f"/metrics answered HTTP {status}")
    metrics = parse_metrics(raw.decode(errors="replace"))
    if IN_FLIGHT_GAUGES[0] not in metrics:
        raise MetricsUnavailable("/metrics has no sglang:num_running_reqs; start the server with --enable-metrics")
    return sum(metrics.get(name, 0.0) for name in IN_FLIGHT_GAUGES)


def wait_drained(base_url: str, timeout: float, interval: float = 0.5, settle: int = 2) -> WaitResult:
    """Wait until the engine owns no request or is gone (nothing listens at ``base_url``).

    Drained means ``settle`` consecutive readings of 0, ``interval`` apart, so that a request
    accepted just before a reading is not missed.
    """
    start = time.monotonic()
    last: float | None = None
    zeros = 0
    while True:
        waited = time.monotonic() - start
        try:
            count = in_flight(base_url, timeout=min(5.0, max(timeout - waited, 0.5)))
        except MetricsUnavailable as err:
            return WaitResult(False, "no-metrics", round(time.monotonic() - start, 3), str(err), last)
        except ServingError as err:  # slow or broken answer: try again until the timeout
            count, detail, zeros = -1.0, str(err), 0
        else:
            if count is None:
                return WaitResult(True, "gone", round(time.monotonic() - start, 3),
                                  "nothing listens: the service is gone", last)
            last = count
            zeros = zeros + 1 if count == 0 else 0
            if zeros >= settle:
                return WaitResult(True, "drained", round(time.monotonic() - start, 3),
                                  "no request in flight", 0.0)
            detail = f"{count:g} requests still in flight"
        waited = time.monotonic() - start
        if waited >= timeout:
            return WaitResult(False, "timeout", round(waited, 3),
                              f"not drained within {timeout:g} s: {detail}", last)
        time.sleep(min(interval, max(timeout - waited, 0.01)))


@dataclass
class WarmupResult:
    ok: bool
    requests: int
    completed: int
    failed: int
    wall_s: float
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def warmup(base_url: str, requests: int, max_tokens: int, timeout: float = 600.0,
           prompt: str = WARMUP_PROMPT) -> WarmupResult:
    """Send ``requests`` greedy requests at once and return when every one has finished.

    Warm-up compiles kernels and captures graphs; a request that fails here fails the warm-up,
    since the gates would only see the same failure later.
    """
    if requests < 1:
        raise UsageError(f"--requests {requests} must be at least 1")
    if max_tokens < 1:
        raise UsageError(f"--max-tokens {max_tokens} must be at least 1")
    start = time.monotonic()
    deadline = start + timeout
    errors: list[str] = []
    done = [0]
    lock = threading.Lock()

    def one(i: int) -> None:
        try:
            generate(base_url, f"{prompt} (#{i})", max_tokens, max(deadline - time.monotonic(), 0.1))
        except ServingError as err:
            with lock:
                errors.append(str(err))
        else:
            with lock:
                done[0] += 1

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0))
    unfinished = sum(t.is_alive() for t in threads)
    if unfinished:
        errors.append(f"{unfinished} warm-up requests still running after {timeout:g} s")
    with lock:
        completed = done[0]
    failed = requests - completed
    return WarmupResult(failed == 0, requests, completed, failed, round(time.monotonic() - start, 3),
                        sorted(set(errors)))


# --- command line -------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, no usage dump
        self.exit(2, f"{self.prog}: {message}\n")


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
        return value
    return parse


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m sgdeploy.serving", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    p = sub.add_parser("wait-healthy", help="wait until /health answers 200")
    p.add_argument("--timeout", type=_positive(float), required=True, help="seconds")
    p.add_argument("--interval", type=_positive(float), default=1.0)
    p.add_argument("--unit", help="systemd unit of the service: stop waiting when it has failed")
    p = sub.add_parser("wait-drained", help="wait until no request is in flight, or the service is gone")
    p.add_argument("--timeout", type=_positive(float), required=True, help="seconds")
    p.add_argument("--interval", type=_positive(float), default=0.5)
    p = sub.add_parser("warmup", help="send warm-up requests and wait until all have finished")
    p.add_argument("--requests", type=_positive(int), required=True)
    p.add_argument("--max-tokens", type=_positive(int), required=True)
    p.add_argument("--timeout", type=_positive(float), default=600.0, help="seconds (default 600)")
    for p in sub.choices.values():
        p.add_argument("--url", required=True, help="http://HOST:PORT of the service")
        p.add_argument("--json", action="store_true", help="print one JSON object instead of a line")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    result: WaitResult | WarmupResult
    try:
        url = check_url(args.url)
        if args.command == "wait-healthy":
            result = wait_healthy(url, args.timeout, args.interval, unit=args.unit)
            line = f"{args.command}: {result.detail} ({result.waited_s:.1f} s)"
        elif args.command == "wait-drained":
            result = wait_drained(url, args.timeout, args.interval)
            line = f"{args.command}: {result.detail} ({result.waited_s:.1f} s)"
        else:
            warm = warmup(url, args.requests, args.max_tokens, args.timeout)
            result = warm
            line = (f"warmup: {warm.completed}/{warm.requests} requests finished "
                    f"in {warm.wall_s:.1f} s" + (f"; {'; '.join(warm.errors)}" if warm.errors else ""))
    except UsageError as err:
        print(f"{_build_parser().prog} {args.command}: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"command": args.command, "url": url, **result.to_dict()}, sort_keys=True))
    else:
        print(line, file=sys.stdout if result.ok else sys.stderr)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
