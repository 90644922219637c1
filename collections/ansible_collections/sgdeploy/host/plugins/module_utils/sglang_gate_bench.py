# Copyright: sgdeploy contributors. Apache-2.0
"""A fixed, greedy benchmark of a running SGLang service: tokens/s, accept length, step time.

Standard library only: shipped to the host with the gate module (sgdeploy.host.sglang_gate) and
imported by the controller's ``sgdeploy bench`` (one implementation). Every request is greedy
(temperature 0) with ``ignore_eos`` so that each produces exactly ``max_new_tokens`` tokens and two
runs of the same release measure the same work. The prompts are the repository's fixed set,
``sglang_gate_prompts.BENCH``, used in order and repeated as needed.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_gate_prompts, sglang_http

# The default prompt set, for messages (its text is sglang_gate_prompts.BENCH).
DEFAULT_PROMPTS = "the bench prompts (sglang_gate_prompts.BENCH)"


class BenchError(ValueError):
    """Bad benchmark input (prompt file, counts): one line naming the thing and the value."""


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str


def parse_prompts(items: list, where: str) -> list[Prompt]:
    """Prompts from ``{"id": ..., "text": ...}`` items (``where`` names them in messages)."""
    prompts = []
    for number, item in enumerate(items, 1):
        if not (isinstance(item, dict) and isinstance(item.get("id"), str)
                and isinstance(item.get("text"), str) and item["text"].strip()):
            raise BenchError(f"{where} line {number}: needs a string id and a non-empty string text")
        prompts.append(Prompt(item["id"], item["text"]))
    if not prompts:
        raise BenchError(f"{where}: has no prompts")
    return prompts


def load_prompts(path: str | Path | None = None) -> list[Prompt]:
    """The bench prompts, or those of a JSON-lines prompt file (``{"id": ..., "text": ...}`` per line;
    blank lines skipped)."""
    if path is None:
        return parse_prompts(sglang_gate_prompts.BENCH, DEFAULT_PROMPTS)
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise BenchError(f"prompt file {path}: cannot read it ({err.strerror or err})") from None
    items = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            items.append(json.loads(line))
        except ValueError:
            raise BenchError(f"prompt file {path} line {number}: not JSON; expected "
                             '{"id": "...", "text": "..."}') from None
    return parse_prompts(items, f"prompt file {path}")


def prompts_digest(prompts: list[Prompt]) -> str:
    """First 12 hex digits of sha256 over the prompts, so that two runs can be told comparable."""
    h = hashlib.sha256()
    for p in prompts:
        h.update(json.dumps([p.id, p.text]).encode())
    return h.hexdigest()[:12]


def accept_length(meta: dict) -> float | None:
    """Accepted tokens per verify step for one request, or None when it reports no spec metrics.

    ``spec_accept_length`` when the release reports it, else ``completion_tokens / spec_verify_ct``.
    """
    reported = meta.get("spec_accept_length")
    if isinstance(reported, int | float) and not isinstance(reported, bool) and reported > 0:
        return float(reported)
    verify, tokens = meta.get("spec_verify_ct"), meta.get("completion_tokens")
    if isinstance(verify, int | float) and verify > 0 and isinstance(tokens, int | float):
        return tokens / verify
    return None


@dataclass
class RequestSample:
    index: int
    prompt_id: str
    ok: bool
    completion_tokens: int | None = None
    spec_verify_ct: int | None = None
    accept_length: float | None = None
    e2e_latency_s: float | None = None  # the server's meta_info.e2e_latency, else measured here
    step_time_ms: float | None = None  # e2e latency / verify steps (or / tokens without speculation)
    error: str | None = None


@dataclass
class BenchResult:
    url: str
    requests: int
    concurrency: int
    max_new_tokens: int
    prompts_digest: str
    started: str
    wall_s: float
    completed: int
    failed: int
    completed_fraction: float
    total_completion_tokens: int
    tokens_per_s: float
    accept_length_mean: float | None
    accept_length_stdev: float | None
    accept_length_requests: int  # completed requests that reported spec metrics
    step_time_ms_mean: float | None
    latency_s_mean: float | None
    errors: list[dict] = field(default_factory=list)  # [{"message": str, "count": int}], most frequent first
    samples: list[RequestSample] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> BenchResult:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["samples"] = [RequestSample(**s) for s in data.get("samples", [])]
        return cls(**known)

    def summary(self) -> str:
        acc = ("-" if self.accept_length_mean is None
               else f"{self.accept_length_mean:.2f} (sd {self.accept_length_stdev:.2f})")
        step = "-" if self.step_time_ms_mean is None else f"{self.step_time_ms_mean:.1f} ms"
        line = (f"{self.completed}/{self.requests} requests completed in {self.wall_s:.1f} s; "
                f"{self.tokens_per_s:.1f} tokens/s; accept length {acc}; step time {step}")
        if self.errors:
            line += f"; errors: {self.errors[0]['message']} (x{self.errors[0]['count']})"
        return line


def _sample(index: int, prompt: Prompt, answer: dict, client_latency: float) -> RequestSample:
    meta = answer.get("meta_info") or {}
    tokens = meta.get("completion_tokens")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        return RequestSample(index, prompt.id, False, error="meta_info has no completion_tokens")
    verify = meta.get("spec_verify_ct")
    verify = verify if isinstance(verify, int) and not isinstance(verify, bool) and verify >= 0 else None
    e2e = meta.get("e2e_latency")
    e2e = float(e2e) if isinstance(e2e, int | float) and e2e > 0 else client_latency
    steps = verify if verify else tokens
    step_ms = 1000.0 * e2e / steps if steps else None
    return RequestSample(index, prompt.id, True, tokens, verify, accept_length(meta), round(e2e, 6),
                         None if step_ms is None else round(step_ms, 4))


def run(base_url: str, prompts: list[Prompt] | None = None, requests: int = 16, concurrency: int = 4,
        max_new_tokens: int = 128, timeout: float = 300.0) -> BenchResult:
    """Send ``requests`` greedy requests, at most ``concurrency`` at a time, within ``timeout`` seconds.

    Requests not finished when the time is up count as failed. Tokens/s is the completed requests'
    completion tokens over the run's wall time; accept length is the mean over completed requests
    of each request's accept length.
    """
    counts = (("requests", requests), ("concurrency", concurrency), ("max_new_tokens", max_new_tokens))
    for name, value in counts:
        if not isinstance(value, int) or value < 1:
            raise BenchError(f"bench {name} {value!r} must be a whole number of at least 1")
    if timeout <= 0:
        raise BenchError(f"bench timeout {timeout!r} must be greater than 0 seconds")
    prompts = prompts if prompts is not None else load_prompts()
    base_url = sglang_http.check_url(base_url)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    start = time.monotonic()
    deadline = start + timeout
    samples: list[RequestSample | None] = [None] * requests
    ends: list[float] = []
    lock = threading.Lock()
    next_index = [0]

    def worker() -> None:
        while True:
            with lock:
                i = next_index[0]
                if i >= requests or time.monotonic() >= deadline:
                    return
                next_index[0] += 1
            prompt = prompts[i % len(prompts)]
            t0 = time.monotonic()
            try:
                answer = sglang_http.generate(base_url, prompt.text, max_new_tokens, deadline - t0)
            except sglang_http.ServingError as err:
                sample = RequestSample(i, prompt.id, False, error=str(err))
            else:
                sample = _sample(i, prompt, answer, time.monotonic() - t0)
            with lock:
                samples[i] = sample
                ends.append(time.monotonic())

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(concurrency, requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0))
    with lock:
        finished = list(samples)
        last_end = max(ends, default=time.monotonic())
        sent = next_index[0]
        next_index[0] = requests  # stop stragglers from sending more
    done: list[RequestSample] = []  # every request's sample, one made up for each not finished
    for i, s in enumerate(finished):
        if s is None:
            reason = "still running" if i < sent else "not sent"
            s = RequestSample(i, prompts[i % len(prompts)].id, False,
                              error=f"{reason} when the bench time limit ({timeout:g} s) ran out")
        done.append(s)
    return summarise(base_url, done, concurrency, max_new_tokens, prompts_digest(prompts), started,
                     min(last_end, deadline) - start)


def summarise(url: str, samples: list[RequestSample], concurrency: int, max_new_tokens: int,
              digest: str, started: str, wall_s: float) -> BenchResult:
    """Aggregate per-request samples into a BenchResult."""
    ok = [s for s in samples if s.ok]
    tokens = sum(s.completion_tokens or 0 for s in ok)
    wall_s = max(wall_s, 1e-9)
    accepts = [s.accept_length for s in ok if s.accept_length is not None]
    steps = [s.step_time_ms for s in ok if s.step_time_ms is not None]
    latencies = [s.e2e_latency_s for s in ok if s.e2e_latency_s is not None]
    errors = Counter(s.error for s in samples if not s.ok)

    def mean(values: list[float]) -> float | None:
        return round(statistics.fmean(values), 4) if values else None

    return BenchResult(
        url=url, requests=len(samples), concurrency=concurrency, max_new_tokens=max_new_tokens,
        prompts_digest=digest, started=started, wall_s=round(wall_s, 4),
        completed=len(ok), failed=len(samples) - len(ok),
        completed_fraction=round(len(ok) / len(samples), 4) if samples else 0.0,
        total_completion_tokens=tokens, tokens_per_s=round(tokens / wall_s, 3) if ok else 0.0,
        accept_length_mean=mean(accepts),
        accept_length_stdev=(round(statistics.stdev(accepts), 4) if len(accepts) > 1
                             else 0.0 if accepts else None),
        accept_length_requests=len(accepts),
        step_time_ms_mean=mean(steps), latency_s_mean=mean(latencies),
        errors=[{"message": m, "count": c} for m, c in errors.most_common()],
        samples=samples,
    )
