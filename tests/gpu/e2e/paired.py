"""Paired, interleaved timing, the harness's one way to compare servers' tokens/s (sets ``derive``, issue 38 item 3,
and ``schedule``, sched_compare.py): what is timed in which order, how the rounds' tokens/s become medians and paired
ratios, what a comparison may say, and how many repeats fit the call.

Why (the H200 run of 2026-12-05, set ``derive``): each server was timed alone in one tiny round per batch size
(about 1.3-1.9 s), the servers one after another, minutes apart. ``ddtree-b64-k8`` timed twice ~3 minutes apart
came out 19-30 % apart, and ``sched-derived`` (schedule ``1:64``: the same server) 7 % from it: one round cannot
resolve the issue's 3 %.

So servers are compared in **rounds timed in alternation**: in each repeat, at each batch size, every server of the
comparison runs one round right after the other, in the order A B C, the next repeat C B A (A B | B A: a slow
drift weighs the same on both sides), several repeats. A round is ``round_requests(n)`` greedy requests of the
plan's ``max_new`` tokens with ``n`` in flight (about 3-4 s of generation on the H200 at the rates of
2026-12-05); the load that moves 1 -> 16 -> 1 is one round of ``MOVING``. The first round at each batch size of a
server is untimed (kernels compile at a new batch size). A server's number at a batch is the **median** of its
rounds with the **spread** (min-max, and the quartiles); a comparison of two servers is the **median of their
paired ratios** (the two rounds of one repeat) with the ratios' min-max.

Verdicts (truth first: only what the rounds can tell): "within 3 %" when every paired ratio is >= 0.97 (so the
median is too), "not within 3 %" when every one is below, else "inconclusive (spread X %)"; fewer than
``MIN_REPEATS`` ratios are always inconclusive. "beats" when every paired ratio is > 1, "does not beat" when
every one is <= 1. With three repeats the min-max range of the ratios is the distribution-free interval for their
median at 75 % (five: 94 %). Pure functions, no GPU; TEST EQUIPMENT of the harness.
"""

from __future__ import annotations

import math
from statistics import median
from typing import Any

WITHIN = 0.03  # issue 38 item 3: "within 3 % of the best fixed budget at that batch size"
MIN_REPEATS = 3  # fewer paired ratios than this never give a verdict
MAX_REPEATS = 5
# Requests per timed round at n in flight (MAX_NEW = 128 tokens each on the trained pair): at least 3 s of generation
# at the fastest DDTree rates of the H200 run of 2026-12-05 (DDTREE 64 timed first: 324 / 1079 / 1838 / 2705 tokens/s
# at 1 / 4 / 8 / 16), about 4 s at its retimed ones (263 / 860 / 1411 / 1887).
ROUND_REQUESTS = {1: 8, 4: 28, 8: 48, 16: 64}
MOVING = ((1, 4), (16, 32), (1, 4))  # (in flight, requests): the load that moves 1 -> 16 -> 1
# Estimates for the budget (seconds; the runner re-measures as it goes): a full round, the moving round, an untimed
# warm-up round (n requests of MAX_NEW // 4 tokens).
ROUND_S = 3.5
MOVING_S = 5.5
WARM_S = 0.6


def round_requests(n: int, scale: float = 1.0) -> int:
    """Requests in one timed round at ``n`` in flight: ``ROUND_REQUESTS`` (4 per slot for a size not listed) times
    ``scale``, a whole number of waves of ``n``, at least one."""
    base = ROUND_REQUESTS.get(n, 4 * n)
    return max(n, n * math.ceil(base * scale / n - 1e-9))


def pick(ps: list, count: int) -> list:
    """``count`` prompts spread evenly over ``ps`` (the held-out set alternates code and prose), cycling past its
    end; the same prompts for every server of a round, so their outputs (greedy) and accept lengths are the same."""
    if count <= len(ps):
        return [ps[(i * len(ps)) // count] for i in range(count)]
    return (ps * math.ceil(count / len(ps)))[:count]


def order(names: list[str], repeat: int) -> list[str]:
    """The servers of one comparison in repeat ``repeat``: as given on even repeats, reversed on odd ones."""
    return list(names) if repeat % 2 == 0 else list(reversed(names))


def repeat_rounds(groups: dict[str, list[str]], repeat: int) -> list[tuple[str, str]]:
    """One repeat's rounds in the order they run: for each key of ``groups`` (``batchN`` or ``moving``, in the
    dict's order), its servers by ``order``: [(key, server), ...]."""
    return [(key, name) for key, names in groups.items() for name in order(names, repeat)]


def round_cost(key: str, scale: float = 1.0) -> float:
    return MOVING_S if key == "moving" else ROUND_S * scale


def repeat_cost(groups: dict[str, list[str]], scale: float = 1.0) -> float:
    """Estimated seconds of one repeat of ``groups`` (``scale`` sizes the batch rounds; the moving round is fixed)."""
    return sum(len(names) * round_cost(key, scale) for key, names in groups.items())


def fit_repeats(available_s: float, cost_a: float, cost_b: float, most: int = MAX_REPEATS) -> tuple[int, int]:
    """Repeats of phase A (the derivation's rounds) and phase B (the verdicts' rounds) that fit ``available_s``:
    one each at least (the derivation needs a number; the runner still skips a phase-B repeat that would pass its
    stop time), then one more of B, one more of A, B, A, ... (a phase at ``most`` is passed over) until the next
    one does not fit. More time never gives fewer repeats."""
    ra = rb = 1
    used = cost_a + cost_b
    for turn in ("b", "a") * most:
        if turn == "b" and rb < most:
            if used + cost_b > available_s:
                break
            rb, used = rb + 1, used + cost_b
        elif turn == "a" and ra < most:
            if used + cost_a > available_s:
                break
            ra, used = ra + 1, used + cost_a
    return ra, rb


SCALES = (1.0, 0.75, 0.5)  # round sizes tried by ``plan_rounds``, largest first


def plan_rounds(available_s: float, groups: dict[str, list[str]], scales: tuple[float, ...] = SCALES,
                min_n: int = MIN_REPEATS, most: int = MAX_REPEATS) -> tuple[int, float]:
    """(repeats, scale) of one set of comparisons (``groups``) in ``available_s``: the largest round size of
    ``scales`` at which ``min_n`` repeats (a verdict's least) fit, as many repeats of it as fit, up to ``most``; where
    ``min_n`` fit at no size, the smallest size and the repeats that fit, at least one (its verdicts then say
    inconclusive). More time never gives fewer repeats at one size, nor smaller rounds."""
    for scale in scales:
        cost = repeat_cost(groups, scale)
        if cost and min_n * cost <= available_s:
            return min(most, int(available_s // cost)), scale
    cost = repeat_cost(groups, scales[-1])
    return max(1, min(most, int(available_s // cost) if cost else most)), scales[-1]


def next_repeat_fits(now: float, stop: float, durations: list[float], estimate: float) -> bool:
    """Whether one more repeat ends by ``stop``: its length is the longest repeat so far, or ``estimate`` before
    the first."""
    return now + (max(durations) if durations else estimate) <= stop


def _ok(rec: dict) -> bool:
    return not rec.get("errors") and rec.get("tokens_per_s") is not None


def quartiles(xs: list[float]) -> tuple[float, float]:
    s = sorted(xs)
    if len(s) < 2:
        return s[0], s[0]
    h = len(s) // 2
    return median(s[:h]), median(s[-h:])


def summarise(records: list[dict]) -> dict[str, dict[str, dict[str, Any]]]:
    """{server: {key: {"n", "tokens_per_s" (the median), "min", "max", "q1", "q3", "spread_pct" ((max - min) over
    the median), "accept_length" (median), "rounds" (every round's tokens/s, in order), "errors"}}}. A round with a
    request error counts in ``errors``, never in the numbers."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for rec in records:
        cell = out.setdefault(rec["server"], {}).setdefault(rec["key"], {"rounds": [], "accept": [], "errors": []})
        if _ok(rec):
            cell["rounds"].append(rec["tokens_per_s"])
            if rec.get("accept_length") is not None:
                cell["accept"].append(rec["accept_length"])
        else:
            cell["errors"].append((rec.get("errors") or ["no tokens/s"])[0])
    for server in out.values():
        for key, cell in server.items():
            xs, acc = cell.pop("rounds"), cell.pop("accept")
            med = round(median(xs), 1) if xs else None
            q1, q3 = quartiles(xs) if xs else (None, None)
            server[key] = {"n": len(xs), "tokens_per_s": med, "min": min(xs, default=None),
                           "max": max(xs, default=None), "q1": q1, "q3": q3,
                           "spread_pct": round(100 * (max(xs) - min(xs)) / med, 1) if med else None,
                           "accept_length": round(median(acc), 3) if acc else None, "rounds": xs,
                           "errors": cell["errors"]}
    return out


def paired_ratios(records: list[dict], mine: str, others: list[str], key: str) -> list[dict]:
    """Per repeat in which ``mine`` and every one of ``others`` ran round ``key`` without error: ``mine``'s tokens/s
    over the fastest of ``others`` in that repeat, and which one that was. [{"repeat", "ratio", "against"}]."""
    by_repeat: dict[int, dict[str, float]] = {}
    for rec in records:
        if rec["key"] == key and _ok(rec):
            by_repeat.setdefault(rec["repeat"], {})[rec["server"]] = rec["tokens_per_s"]
    out = []
    for r in sorted(by_repeat):
        got = by_repeat[r]
        if mine in got and others and all(o in got for o in others):
            best = max(others, key=lambda o: got[o])
            out.append({"repeat": r, "ratio": round(got[mine] / got[best], 4), "against": best})
    return out


def ratio_stats(ratios: list[float]) -> dict[str, Any]:
    if not ratios:
        return {"n": 0, "median": None, "min": None, "max": None, "spread_pct": None}
    return {"n": len(ratios), "median": round(median(ratios), 4), "min": min(ratios), "max": max(ratios),
            "spread_pct": round(100 * (max(ratios) - min(ratios)), 1)}


def _few(n: int, min_n: int) -> str:
    return f"inconclusive ({n} paired repeat{'s' if n != 1 else ''}, at least {min_n} needed)"


def judge_within(ratios: list[float], within: float = WITHIN, min_n: int = MIN_REPEATS) -> dict[str, Any]:
    """The paired ratios of the derived server over the best fixed one at one batch size: within / not within
    ``within`` of it, or inconclusive (see the module's doc)."""
    st = ratio_stats(ratios)
    pct = f"{within * 100:g} %"
    if st["n"] < min_n:
        verdict = _few(st["n"], min_n)
    elif st["min"] >= 1 - within:
        verdict = f"within {pct}"
    elif st["max"] < 1 - within:
        verdict = f"not within {pct}"
    else:
        verdict = f"inconclusive (spread {st['spread_pct']} %)"
    return {**st, "verdict": verdict, "holds": True if verdict.startswith("within") else
            False if verdict.startswith("not within") else None}


def judge_beats(ratios: list[float], min_n: int = MIN_REPEATS) -> dict[str, Any]:
    """The paired ratios of the derived server over one other over the moving load: beats / does not beat /
    inconclusive."""
    st = ratio_stats(ratios)
    if st["n"] < min_n:
        verdict = _few(st["n"], min_n)
    elif st["min"] > 1:
        verdict = "beats"
    elif st["max"] <= 1:
        verdict = "does not beat"
    else:
        verdict = f"inconclusive (spread {st['spread_pct']} %)"
    return {**st, "verdict": verdict, "holds": True if verdict == "beats" else
            False if verdict == "does not beat" else None}


def cell_text(t: dict | None) -> str:
    """A server's number at one round kind in a summary: median [min-max] x rounds."""
    if not t or t.get("tokens_per_s") is None:
        return "-"
    return f"{t['tokens_per_s']} [{t['min']}-{t['max']}] x{t['n']}"


def ratio_text(v: dict) -> str:
    """A comparison in a summary: the paired ratios' median, min-max, count and spread (the verdict follows it)."""
    if not v.get("n"):
        return "no pairs"
    return f"median {v['median']} [{v['min']}-{v['max']}] x{v['n']}, spread {v['spread_pct']} %"


def all_of(verdicts: list[dict]) -> bool | None:
    """True when every verdict holds, False when one is known not to, None otherwise (or none at all)."""
    if not verdicts:
        return None
    if any(v["holds"] is False for v in verdicts):
        return False
    return True if all(v["holds"] for v in verdicts) else None


def contenders(records: list[dict], names: list[str], key: str, within: float = WITHIN) -> list[str]:
    """The servers of ``names`` that may be the fastest at round ``key``: the one with the highest median and every
    one whose paired ratio to it reached ``1 - within`` in some repeat (the others were more than ``within``
    slower in every repeat)."""
    summary = summarise([r for r in records if r["key"] == key and r["server"] in names])
    timed = [n for n in names if (summary.get(n, {}).get(key) or {}).get("tokens_per_s") is not None]
    if not timed:
        return []
    best = max(timed, key=lambda n: summary[n][key]["tokens_per_s"])
    out = []
    for n in timed:
        rs = [p["ratio"] for p in paired_ratios(records, n, [best], key)]
        if n == best or (rs and max(rs) >= 1 - within):
            out.append(n)
    return out
