"""Unhealthy window of a switch under a paced client load (issue 20), lab equipment.

Sends one small /generate request every 1/RATE s to URL while COMMAND (a deploy or a rollback)
runs, and reports how long the service did not answer: the longest stretch from the first failed
request to the next one that succeeded, by send time. Failures are split into `refused` (the
connection was not accepted: nothing listened, the expected gap of a single-replica switch),
`rejected` (503 at once: a server that is loading or draining turns new requests away, as SGLang
does after SIGTERM) and `broken` (accepted, then reset, timed out, torn or answered with another
error: work that a drain dropped).

    python tests/lab/unhealthy_window.py --url http://127.0.51.1:30000 [--rate 10]
        [--max-requests 3000] [--max-seconds 600] [--json OUT] -- COMMAND...

Bounded: at most --max-requests requests (then only the command is waited for) and --max-seconds
seconds (the command is stopped at that limit); URL must be inside 127.0.0.0/8.
Exit status: the command's (2 for bad input).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

BODY = json.dumps({"text": "Hello", "sampling_params": {"temperature": 0, "max_new_tokens": 8}}).encode()


def loopback_url(value: str) -> str:
    host = urlparse(value).hostname or ""
    try:
        ok = ipaddress.ip_address(host) in ipaddress.ip_network("127.0.0.0/8")
    except ValueError:
        ok = False
    if not ok or urlparse(value).scheme != "http":
        raise argparse.ArgumentTypeError(f"--url {value!r}: give http://127.x.y.z:PORT (inside 127.0.0.0/8 only)")
    return value.rstrip("/")


def positive(kind):
    def parse(value: str):
        try:
            v = kind(value)
        except ValueError:
            v = 0
        if v <= 0:
            raise argparse.ArgumentTypeError(f"{value!r}: give a number above 0")
        return v
    return parse


def probe(url: str, timeout: float) -> str:
    """One request: 'ok', 'refused' (not accepted), 'rejected' (503) or 'broken' (accepted, then failed)."""
    req = urllib.request.Request(url + "/generate", data=BODY, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return "ok" if resp.status == 200 and json.loads(resp.read()).get("text") is not None else "broken"
    except urllib.error.HTTPError as exc:
        return "rejected" if exc.code == 503 else "broken"
    except urllib.error.URLError as exc:
        return "refused" if isinstance(exc.reason, ConnectionRefusedError) else "broken"
    except ConnectionRefusedError:
        return "refused"
    except (OSError, ValueError):  # reset, timeout, a torn answer
        return "broken"


def windows(samples: list[tuple[float, str]]) -> list[dict]:
    """Stretches of failed requests (by send time), each up to the next success (or the last sample)."""
    out, start, kinds = [], None, set()
    for t, result in sorted(samples):
        if result != "ok":
            start = t if start is None else start
            kinds.add(result)
        elif start is not None:
            out.append({"from": start, "seconds": round(t - start, 3), "kinds": sorted(kinds), "closed": True})
            start, kinds = None, set()
    if start is not None:
        out.append({"from": start, "seconds": round(sorted(samples)[-1][0] - start, 3), "kinds": sorted(kinds),
                    "closed": False})
    return out


def measure(url: str, command: list[str], rate: float, max_requests: int, max_seconds: float,
            timeout: float = 10.0) -> dict:
    samples: list[tuple[float, str]] = []
    lock = threading.Lock()
    t0 = time.monotonic()

    def one(sent: float) -> None:
        result = probe(url, timeout)
        with lock:
            samples.append((sent - t0, result))

    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out_chunks: list[str] = []
    reader = threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()), daemon=True)
    reader.start()
    sent = 0
    stopped_at_limit = False
    with ThreadPoolExecutor(max_workers=16) as pool:
        next_at = time.monotonic()
        tail_until = None
        while True:
            now = time.monotonic()
            if now - t0 > max_seconds:
                stopped_at_limit = proc.poll() is None
                break
            if proc.poll() is not None:
                tail_until = tail_until or now + 2.0  # a short tail: the service answers again after it
                if now >= tail_until:
                    break
            if sent < max_requests and now >= next_at:  # past the count, only the command is waited for
                pool.submit(one, now)
                sent += 1
                next_at += 1.0 / rate
            time.sleep(max(0.0, min(next_at - time.monotonic(), 0.05)))
    if proc.poll() is None:
        proc.terminate()
    rc = proc.wait(timeout=120)
    reader.join(timeout=10)
    counts = {k: sum(1 for _, r in samples if r == k) for k in ("ok", "refused", "rejected", "broken")}
    found = windows(samples)
    return {"url": url, "command": command, "rc": rc, "rate_per_s": rate, "requests": len(samples), **counts,
            "seconds": round(time.monotonic() - t0, 1), "stopped_at_limit": stopped_at_limit,
            "windows": found, "longest_window_s": max((w["seconds"] for w in found), default=0.0),
            "output_tail": "".join(out_chunks)[-3000:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", type=loopback_url, required=True)
    ap.add_argument("--rate", type=positive(float), default=10.0, help="requests per second (default 10)")
    ap.add_argument("--max-requests", type=positive(int), default=3000)
    ap.add_argument("--max-seconds", type=positive(float), default=600.0)
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND... (the deploy or rollback)")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command to measure after --")
    if args.rate > 50:
        ap.error(f"--rate {args.rate}: at most 50 requests per second (a paced load, not a stress test)")
    result = measure(args.url, command, args.rate, args.max_requests, args.max_seconds)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    print(f"unhealthy window: longest {result['longest_window_s']} s; requests {result['requests']} "
          f"(ok {result['ok']}, refused {result['refused']}, rejected {result['rejected']}, "
          f"broken {result['broken']}) at {args.rate}/s "
          f"over {result['seconds']} s; command exit {result['rc']}")
    return result["rc"]


if __name__ == "__main__":
    sys.exit(main())
