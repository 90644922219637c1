"""Sweep report: the acceptance cliff, the recommendation, and the three output files.

Pure logic over variant rows (one per budget × top-k cap, as `sgdeploy.sweep` measures them):

- **cliff**: per top-k cap, in increasing budget order, the first budget whose mean accept length
  is more than ``cliff_drop`` (a fraction, 0.25 by default) below the best accept length of the
  smaller budgets of that cap. The reported ``cliff`` is the one at the smallest budget over all
  caps; ``cliffs`` lists one per cap that has one.
- **qualifies**: a measured variant that does not leak (``leaks``: no state forking above
  ``block_size - 1`` on a model with recurrent layers, so its tokens are wrong whatever its
  acceptance) and that the deploy's gates would let through (``gates_failed`` empty: smoke,
  throughput and acceptance passed, exactness did not fail). Only qualifying variants are
  recommended or called fastest; the others are marked in the table and the plot.
- **fastest**: the qualifying variant with the most tokens/s.
- **recommendation** (``best``): among the qualifying variants whose tokens/s is within ``tie_tolerance`` (a
  fraction, 0.03 by default) of the fastest and that sit below their cap's cliff, the largest budget
  (then the largest cap). Best-first trees are nested, so a larger budget verifies a superset of the
  smaller tree and accepts at least as much on every step; when its cost does not show in tokens/s at
  the load benchmarked, the larger tree is the headroom for prompts the drafter finds harder. With
  no tie the recommendation is the fastest. A warning when it sits right before its cap's cliff (the
  next budget tested with that cap is the cliff): a longer prompt mix or a model update may tip it
  over. When no variant qualifies, nothing is recommended and the text says why.

With batch sizes (``--batches``), each row's ``by_batch`` cells (tokens/s and accept length with that many
requests in flight) give the **budget schedule** (``schedule_cells`` then ``sgdeploy.schedule.derive``): at each
batch size, the qualifying budget with the most tokens/s, a smaller one within ``tie_tolerance`` winning the tie.

Files (``write``): ``results.json`` (schema 1, see docs/sweep.md), ``results.md`` (a table, the
cliff and the recommendation; with batches, the per-bucket table and the schedule), the schedule's config
(``<base>-sched.yml``, with batches) and ``sweep.png`` (accept length and tokens/s against budget, one
line per cap, the cliff and the best marked; matplotlib with the Agg backend, imported only here).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sgdeploy import schedule

SCHEMA = 1
DEFAULT_CLIFF_DROP = 0.25
DEFAULT_TIE_TOLERANCE = 0.03
VARIANT_KEYS = ("budget", "topk_cap", "accept_length_mean", "accept_length_sd", "tokens_per_s", "step_time_ms",
                "requests", "failures", "status", "error")
GATE_NAMES = ("smoke", "exactness", "throughput", "acceptance")  # the deploy's gates, in the order they run
FILE_MODE = 0o644  # every report file, whatever the umask (they hold no secret)
NO_RECOMMENDATION = "no variant recommended"


class ReportError(ValueError):
    """Bad report input: one line naming the thing, the value and what is allowed."""


def check_cliff_drop(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1:
        raise ReportError(f"cliff drop {value!r}: must be a fraction above 0 and below 1 (e.g. 0.25 for 25%)")
    return float(value)


def check_tie_tolerance(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 0.5:
        raise ReportError(f"tie tolerance {value!r}: must be a fraction from 0 up to below 0.5 "
                          "(e.g. 0.03 for 3%; 0 recommends the fastest variant alone)")
    return float(value)


def variant_row(budget: int, topk_cap: int, *, accept_length_mean: float | None = None,
                accept_length_sd: float | None = None, tokens_per_s: float | None = None,
                step_time_ms: float | None = None, requests: int = 0, failures: int = 0,
                status: str = "ok", error: str | None = None, **extra: Any) -> dict[str, Any]:
    """One row of ``variants`` with every documented key (extra keys, e.g. ``config``, are kept)."""
    if status not in ("ok", "failed"):
        raise ReportError(f"variant status {status!r}: must be ok or failed")
    row = {"budget": budget, "topk_cap": topk_cap, "accept_length_mean": accept_length_mean,
           "accept_length_sd": accept_length_sd, "tokens_per_s": tokens_per_s, "step_time_ms": step_time_ms,
           "requests": requests, "failures": failures, "status": status, "error": error}
    row.update(extra)
    return row


def _measured(row: dict) -> bool:
    return row.get("status") == "ok" and row.get("accept_length_mean") is not None


def _caps(rows: list[dict]) -> list[int]:
    """Caps in the order they first appear."""
    seen: list[int] = []
    for r in rows:
        if r["topk_cap"] not in seen:
            seen.append(r["topk_cap"])
    return seen


def find_cliffs(rows: list[dict], cliff_drop: float = DEFAULT_CLIFF_DROP) -> list[dict]:
    """One cliff per cap that has one: ``{"budget", "topk_cap", "drop_pct", "from_budget", "accept_length",
    "best_accept_length"}``. Failed or unmeasured rows are skipped."""
    cliff_drop = check_cliff_drop(cliff_drop)
    cliffs = []
    for cap in _caps(rows):
        best: dict | None = None
        for row in sorted((r for r in rows if r["topk_cap"] == cap and _measured(r)), key=lambda r: r["budget"]):
            acc = row["accept_length_mean"]
            if best is not None and acc < best["accept_length_mean"] * (1 - cliff_drop):
                drop = 100.0 * (best["accept_length_mean"] - acc) / best["accept_length_mean"]
                cliffs.append({"budget": row["budget"], "topk_cap": cap, "drop_pct": round(drop, 1),
                               "from_budget": best["budget"], "accept_length": acc,
                               "best_accept_length": best["accept_length_mean"]})
                break
            if best is None or acc > best["accept_length_mean"]:
                best = row
    return cliffs


def first_cliff(cliffs: list[dict]) -> dict | None:
    """The cliff at the smallest budget (caps in the order tested break a tie)."""
    return min(cliffs, key=lambda c: c["budget"], default=None)


def best_variant(rows: list[dict]) -> dict | None:
    """The measured variant with the most tokens/s (the first tested wins a tie)."""
    best = None
    for row in rows:
        if row.get("status") == "ok" and row.get("tokens_per_s") is not None:
            if best is None or row["tokens_per_s"] > best["tokens_per_s"]:
                best = row
    return best


def _below_cliff(row: dict, cliffs: list[dict]) -> bool:
    cliff = next((c for c in cliffs if c["topk_cap"] == row["topk_cap"]), None)
    return cliff is None or row["budget"] < cliff["budget"]


def tied_with_fastest(rows: list[dict], cliffs: list[dict], tie_tolerance: float = DEFAULT_TIE_TOLERANCE,
                      fastest: dict | None = None) -> list[dict]:
    """Measured variants below their cap's cliff whose tokens/s is within ``tie_tolerance`` of the fastest
    (``best_variant(rows)`` unless given; itself included), in budget then cap order."""
    tie_tolerance = check_tie_tolerance(tie_tolerance)
    fastest = fastest or best_variant(rows)
    if fastest is None:
        return []
    floor = fastest["tokens_per_s"] * (1 - tie_tolerance)
    tied = [r for r in rows if r.get("status") == "ok" and r.get("tokens_per_s") is not None
            and (r is fastest or (r["tokens_per_s"] >= floor and _below_cliff(r, cliffs)))]
    return sorted(tied, key=lambda r: (r["budget"], r["topk_cap"]))


def _name(row: dict) -> str:
    return f"budget {row['budget']} cap {row['topk_cap']}"


def _num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def leaks(row: dict) -> bool:
    """The variant ran without state forking above block_size - 1 on a model with recurrent layers
    (``sgdeploy.sweep.leaks``, spec's rule): its tokens are wrong however well it accepts."""
    return bool(row.get("leaks"))


def gate_verdicts(row: dict) -> dict[str, str | None]:
    """{gate: pass | fail | inconclusive | None (not run)} for the four gates of the deploy."""
    gates = row.get("gates")
    if not isinstance(gates, dict):
        gates = {}
    out = {}
    for name in GATE_NAMES:
        g = gates.get(name)
        out[name] = g.get("verdict") if isinstance(g, dict) else None
    if out["exactness"] is None:
        out["exactness"] = exactness_verdict(row)
    return out


def failed_gates(row: dict) -> list[str]:
    """The gates that would stop a deploy of this variant (``gates_failed`` as the sweep recorded it with
    the gate code's rule); a row without it counts a failed exactness verdict only."""
    recorded = row.get("gates_failed")
    if isinstance(recorded, list):
        return [g for g in GATE_NAMES if g in recorded]
    return ["exactness"] if exactness_verdict(row) == "fail" else []


def disqualified(row: dict) -> list[str]:
    """Why a measured variant is never recommended nor fastest (empty: it qualifies)."""
    why = []
    if leaks(row):
        why.append("leaks: no state forking above block_size - 1")
    verdicts = gate_verdicts(row)
    failed = failed_gates(row)
    if failed:
        why.append(", ".join(f"{g} {verdicts[g] or 'not passed'}" for g in failed))
    return why


def qualifies(row: dict) -> bool:
    return _measured(row) and row.get("tokens_per_s") is not None and not disqualified(row)


def recommend(rows: list[dict], cliffs: list[dict], cliff_drop: float = DEFAULT_CLIFF_DROP,
              tie_tolerance: float = DEFAULT_TIE_TOLERANCE) -> tuple[dict | None, str, str | None]:
    """(recommended row, recommendation text, warning text or None).

    Only qualifying variants (``qualifies``) are recommended, however fast the others are: a leaking
    variant gives wrong tokens, and one that fails a gate the deploy would refuse. The text names the
    variants left out and why; with none left it starts with "no variant recommended"."""
    out = [r for r in rows if _measured(r) and disqualified(r)]
    left_out = ("; not recommended: " + ", ".join(f"{_name(r)} ({'; '.join(disqualified(r))})" for r in out)
                if out else "")
    candidates = [r for r in rows if qualifies(r)]
    fastest = best_variant(candidates)
    if fastest is None:
        failed = sum(1 for r in rows if r.get("status") != "ok")
        if not any(_measured(r) for r in rows):
            why = f"no variant was measured ({failed} of {len(rows)} failed)" if rows else "no variant was measured"
        else:
            why = "no measured variant qualifies" + (f" ({failed} of {len(rows)} failed to deploy or be measured)"
                                                     if failed else "")
        return None, f"{NO_RECOMMENDATION}: {why}{left_out}", None
    tied = tied_with_fastest(candidates, cliffs, tie_tolerance, fastest)
    best = tied[-1]
    what = (f"{_name(best)}: {_num(best['tokens_per_s'])} tokens/s, "
            f"accept length {_num(best['accept_length_mean'], 2)}")
    if best is not fastest:
        others = " and ".join(f"{_name(r)} at {_num(r['tokens_per_s'])}" for r in tied if r is not best)
        what += (f" (tied within {tie_tolerance * 100:g}% with {others} tokens/s; the larger tree accepts at "
                 "least as much, so it is recommended)")
    warning = None
    cap_cliff = next((c for c in cliffs if c["topk_cap"] == best["topk_cap"]), None)
    if cap_cliff is not None:
        larger = sorted(r["budget"] for r in rows if r["topk_cap"] == best["topk_cap"] and _measured(r)
                        and r["budget"] > best["budget"])
        if larger and larger[0] == cap_cliff["budget"]:
            warning = (f"{_name(best)} sits right before the acceptance cliff: budget {cap_cliff['budget']} "
                       f"(cap {cap_cliff['topk_cap']}) loses {cap_cliff['drop_pct']:.1f}% of the accept length; "
                       "a different prompt mix or model revision may tip it over, so re-run the sweep after "
                       "such a change")
    first = first_cliff(cliffs)
    if first is None:
        largest = max(r["budget"] for r in rows if _measured(r)) if any(_measured(r) for r in rows) else None
        text = (f"no acceptance cliff up to budget {largest} (no drop above {cliff_drop * 100:g}% from the best "
                f"so far); recommended: {what}")
    else:
        text = (f"acceptance cliff at budget {first['budget']} cap {first['topk_cap']} (accept length "
                f"{_num(first['accept_length'], 2)}, {first['drop_pct']:.1f}% below "
                f"{_num(first['best_accept_length'], 2)} at budget {first['from_budget']}); recommended: {what}")
    return best, text + left_out, warning


def exactness_verdict(row: dict) -> str | None:
    """The variant's exactness verdict (pass, fail, inconclusive) from its deploy record, or None."""
    e = row.get("exactness")
    return e.get("verdict") if isinstance(e, dict) else None


def schedule_cells(variants: list[dict]) -> list[dict]:
    """The (budget, batch) cells of the rows' ``by_batch`` measurements for ``schedule.derive``: a cell qualifies
    when its variant does (``qualifies``: not leaking, the deploy's gates pass) and every request of its bench
    completed."""
    out = []
    for row in variants:
        for cell in row.get("by_batch") or []:
            ok = qualifies(row) and cell.get("status") == "ok" and not cell.get("failures")
            out.append({"budget": row["budget"], "topk_cap": row["topk_cap"], "batch": cell["batch"],
                        "tokens_per_s": cell.get("tokens_per_s"), "accept_length_mean": cell.get("accept_length_mean"),
                        "qualifies": ok})
    return out


def budget_schedule(variants: list[dict], tie_tolerance: float = DEFAULT_TIE_TOLERANCE) -> dict[str, Any] | None:
    """``results.json``'s ``budget_schedule``: the derived schedule with its buckets (``schedule.derive``), the
    schedule as JSON lists; None when no batch size has a qualifying budget."""
    derived = schedule.derive(schedule_cells(variants), check_tie_tolerance(tie_tolerance))
    if derived is None:
        return None
    derived["schedule"] = [list(e) for e in derived["schedule"]]
    return derived


def build_results(*, config: str, host: str, started: str, finished: str, variants: list[dict],
                  cliff_drop: float = DEFAULT_CLIFF_DROP, tie_tolerance: float = DEFAULT_TIE_TOLERANCE,
                  restored: str | None = None, batches: list[int] | None = None,
                  **extra: Any) -> dict[str, Any]:
    """The ``results.json`` object (schema 1)."""
    for row in variants:
        missing = [k for k in VARIANT_KEYS if k not in row]
        if missing:
            raise ReportError(f"variant {row.get('budget')!r}/{row.get('topk_cap')!r}: missing {', '.join(missing)}")
    for row in variants:
        row["not_recommended"] = disqualified(row)
    cliffs = find_cliffs(variants, cliff_drop)
    cliff = first_cliff(cliffs)
    best, text, warning = recommend(variants, cliffs, cliff_drop, tie_tolerance)
    fastest = best_variant([r for r in variants if qualifies(r)])
    results = {
        "schema": SCHEMA, "config": config, "host": host, "started": started, "finished": finished,
        "variants": variants,
        "cliff": None if cliff is None else {k: cliff[k] for k in ("budget", "topk_cap", "drop_pct")},
        "best": None if best is None else dict(best),
        "fastest": None if fastest is None else dict(fastest),
        "recommendation": text, "warning": warning, "restored": restored,
        "cliff_drop": cliff_drop, "tie_tolerance": tie_tolerance, "cliffs": cliffs,
    }
    if batches:
        results["batches"] = list(batches)
        results["budget_schedule"] = budget_schedule(variants, tie_tolerance)
    results.update(extra)
    return results


# --------------------------------------------------------------------------------------------------
# Files


SIMULATED_NOTE = ("the host runs the lab's simulated engine (tests/sim): these numbers prove the plumbing, not "
                  "how SGLang behaves")


def _same(a: dict | None, b: dict | None) -> bool:
    if not a or not b:
        return False
    return (a["budget"], a["topk_cap"]) == (b["budget"], b["topk_cap"])


def markdown(results: dict) -> str:
    """``results.md``: what was swept, a table (leaks and the four gate verdicts per variant), the cliff,
    the recommendation and the warning."""
    lines = [f"# Sweep of {results['config']} on {results['host']}", "",
             f"Started {results['started']}, finished {results['finished']}. "
             f"Cliff rule: accept length more than {results.get('cliff_drop', DEFAULT_CLIFF_DROP) * 100:g}% below "
             "the best of the smaller budgets (per top-k cap).", ""]
    if results.get("simulated"):
        lines += [f"**Simulated**: {SIMULATED_NOTE}.", ""]
    lines += ["| budget | top-k cap | accept length | sd | tokens/s | step ms | requests | failures | leaks | smoke "
              "| exactness | throughput | acceptance | status |",
              "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | --- | --- | --- |"]
    cliff, best, fastest = results.get("cliff"), results.get("best"), results.get("fastest")
    for r in results["variants"]:
        marks = []
        if _same(r, cliff):
            marks.append("cliff")
        if _same(r, best):
            marks.append("best")
        if _same(r, fastest) and not _same(best, fastest):
            marks.append("fastest")
        why = disqualified(r)
        if why:
            marks.append(f"not recommended: {'; '.join(why)}")
        status = r["status"] if r["status"] == "ok" else f"failed: {r.get('error') or '?'}"
        if marks:
            status += f" ({', '.join(marks)})"
        verdicts = gate_verdicts(r)
        lines.append(f"| {r['budget']} | {r['topk_cap']} | {_num(r['accept_length_mean'], 2)} | "
                     f"{_num(r['accept_length_sd'], 2)} | {_num(r['tokens_per_s'])} | {_num(r['step_time_ms'])} | "
                     f"{r['requests']} | {r['failures']} | {'yes' if leaks(r) else 'no'} | "
                     + " | ".join(verdicts[g] or "-" for g in GATE_NAMES)
                     + f" | {status.replace('|', '/')} |")
    lines += ["", "Leaks **yes**: no state forking above block_size - 1 on a model with recurrent layers "
              "(reproduce_state_leak): the tokens are wrong whatever the acceptance. Gates: the deploy's own "
              "(docs/gates.md), run on every variant; a variant that leaks or that the deploy's gates would stop "
              "is never the best nor the fastest.", ""]
    if cliff:
        lines.append(f"**Cliff**: budget {cliff['budget']} (cap {cliff['topk_cap']}), "
                     f"accept length down {cliff['drop_pct']:.1f}% from the best so far.")
    else:
        lines.append("**Cliff**: none found.")
    lines += ["", f"**Recommendation**: {results['recommendation']}"]
    if results.get("warning"):
        lines += ["", f"**Warning**: {results['warning']}"]
    if results.get("batches"):
        lines += ["", *schedule_markdown(results)]
    restored = results.get("restored")
    lines += ["", f"After the sweep: {'restored ' + restored if restored else 'no earlier config to restore'}.", ""]
    return "\n".join(lines)


def schedule_markdown(results: dict) -> list[str]:
    """The batch dimension of ``results.md``: tokens/s and accept length per budget and batch size (the chosen
    budget in bold, the ones that do not qualify marked), the buckets, the schedule and its config."""
    batches = results["batches"]
    sched = results.get("budget_schedule")
    chosen = {b["batch"]: b["budget"] for b in (sched or {}).get("buckets", [])}
    lines = ["## Budget schedule", "",
             f"Each budget benchmarked with B requests in flight ({results.get('batch_waves') or 2} x B requests of "
             f"{(results.get('bench') or {}).get('max_new_tokens', '?')} tokens); tokens/s (accept length). Bold: the "
             f"budget chosen at that batch size (the most tokens/s; a smaller budget within "
             f"{results.get('tie_tolerance', DEFAULT_TIE_TOLERANCE) * 100:g}% wins the tie). A variant that leaks or "
             "fails a gate, or a bench with failed requests, is never chosen (marked *).", "",
             "| budget | top-k cap | " + " | ".join(f"batch {n}" for n in batches) + " |",
             "| ---: | ---: | " + " | ".join("---:" for _ in batches) + " |"]
    for r in results["variants"]:
        cells = {c["batch"]: c for c in r.get("by_batch") or []}
        out = []
        for n in batches:
            c = cells.get(n)
            if c is None or c.get("status") != "ok":
                out.append("-" if c is None else "failed")
                continue
            text = f"{_num(c['tokens_per_s'])} ({_num(c['accept_length_mean'], 2)})"
            if not qualifies(r) or c.get("failures"):
                text += " *"
            elif chosen.get(n) == r["budget"]:
                text = f"**{text}**"
            out.append(text)
        lines.append(f"| {r['budget']} | {r['topk_cap']} | " + " | ".join(out) + " |")
    lines.append("")
    if sched is None:
        lines.append("**Schedule**: none: no budget qualifies at any batch size measured.")
        return lines
    lines += ["| bucket (running requests) | budget | tokens/s | accept length | tied with |",
              "| --- | ---: | ---: | ---: | --- |"]
    buckets = sched["buckets"]
    for i, b in enumerate(buckets):
        low = 1 if i == 0 else b["batch"]
        high = f"{buckets[i + 1]['batch'] - 1}" if i + 1 < len(buckets) else "up"
        span = f"{low} to {high}" if high != str(low) else f"{low}"
        tied = ", ".join(f"budget {t}" for t in b["tied_with"]) or "-"
        if b.get("note"):
            tied += f" ({b['note']})"
        lines.append(f"| {span} (measured at {b['batch']}) | {b['budget'] if b['budget'] is not None else '-'} | "
                     f"{_num(b['tokens_per_s'])} | {_num(b['accept_length_mean'], 2)} | {tied} |")
    lines += ["", f"**Schedule**: `{sched['flag']}` (server flag `--speculative-ddtree-budget-schedule "
                  f"\"{sched['flag']}\"`; one entry where the best budget changes).", ""]
    if sched.get("config_yaml"):
        state = ("ready to use" if not sched.get("config_problems")
                 else "NOT valid as it stands: " + "; ".join(sched["config_problems"]))
        lines += [f"Config (`{sched['config_file']}` beside this report, {state}):", "", "```yaml",
                  sched["config_yaml"].rstrip("\n"), "```"]
    return lines


def _boxes_overlap(a, b, pad: float) -> bool:
    return not (a.x1 + pad <= b.x0 or b.x1 + pad <= a.x0 or a.y1 + pad <= b.y0 or b.y1 + pad <= a.y0)


def thin_tick_labels(fig, ax, keep: Sequence[float] = (), pad: float = 4.0) -> list[str]:
    """Hide the x tick labels that would overlap a label already shown (the tick stays): the first and
    last ticks, then ``keep`` (the best, the cliff), then the rest in order. Returns the labels shown."""
    renderer = fig.canvas.get_renderer()
    ticks = list(ax.get_xticks())
    labels = ax.get_xticklabels()
    order = sorted(range(len(labels)), key=lambda i: (0 if i in (0, len(labels) - 1) else
                                                      1 if ticks[i] in keep else 2, i))
    shown: list = []
    for i in order:
        label = labels[i]
        if not label.get_visible() or not label.get_text():
            continue
        box = label.get_window_extent(renderer)
        if any(_boxes_overlap(box, other, pad) for other in shown):
            label.set_visible(False)
        else:
            shown.append(box)
    return [t.get_text() for t in labels if t.get_visible() and t.get_text()]


def figure(results: dict):
    """The figure of ``sweep.png`` (matplotlib, Agg): two panels over budget, one line per cap; leaking
    variants crossed in red, variants that fail a gate boxed in orange; tick labels never overlap."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import NullFormatter, NullLocator

    rows = [r for r in results["variants"] if _measured(r)]
    fig, (ax_acc, ax_tps) = plt.subplots(2, 1, sharex=True, figsize=(7.5, 6.5), dpi=100)
    for cap in _caps(results["variants"]):
        pts = sorted((r for r in rows if r["topk_cap"] == cap), key=lambda r: r["budget"])
        if not pts:
            continue
        budgets = [r["budget"] for r in pts]
        ax_acc.plot(budgets, [r["accept_length_mean"] for r in pts], marker="o", label=f"cap {cap}")
        ax_tps.plot(budgets, [r["tokens_per_s"] for r in pts], marker="o", label=f"cap {cap}")
    leaking = [r for r in rows if leaks(r)]
    gated = [r for r in rows if failed_gates(r)]
    for ax, key in ((ax_acc, "accept_length_mean"), (ax_tps, "tokens_per_s")):
        if leaking:
            ax.scatter([r["budget"] for r in leaking], [r[key] for r in leaking], marker="x", s=90, linewidths=2,
                       color="tab:red", zorder=6,
                       label="leaks (no state forking): never recommended" if ax is ax_acc else None)
        pts = [r for r in gated if r.get(key) is not None]
        if pts:
            ax.scatter([r["budget"] for r in pts], [r[key] for r in pts], marker="s", s=130, facecolors="none",
                       edgecolors="tab:orange", linewidths=1.8, zorder=6,
                       label="a gate not passed: never recommended" if ax is ax_acc else None)
    cliff, best = results.get("cliff"), results.get("best")
    if cliff:
        for ax in (ax_acc, ax_tps):
            ax.axvline(cliff["budget"], color="tab:red", linestyle="--", linewidth=1,
                       label=f"cliff (budget {cliff['budget']}, -{cliff['drop_pct']:.0f}%)" if ax is ax_acc else None)
    fastest, tol = results.get("fastest"), results.get("tie_tolerance") or 0
    if best and fastest and tol and not _same(best, fastest):
        ax_tps.axhspan(fastest["tokens_per_s"] * (1 - tol), fastest["tokens_per_s"], color="tab:green", alpha=0.12,
                       label=f"tie: within {tol * 100:g}% of the fastest")
    if best:
        ax_tps.scatter([best["budget"]], [best["tokens_per_s"]], s=180, facecolors="none", edgecolors="tab:green",
                       linewidths=2, zorder=5, label=f"best (budget {best['budget']} cap {best['topk_cap']})")
        if best.get("accept_length_mean") is not None:
            ax_acc.scatter([best["budget"]], [best["accept_length_mean"]], s=180, facecolors="none",
                           edgecolors="tab:green", linewidths=2, zorder=5)
    budgets = sorted({r["budget"] for r in results["variants"]})
    if budgets and budgets[-1] / max(budgets[0], 1) >= 8:
        ax_tps.set_xscale("log", base=2)
    if budgets:
        ax_tps.set_xticks(budgets)
        ax_tps.set_xticklabels([str(b) for b in budgets])
        ax_tps.xaxis.set_minor_locator(NullLocator())
        ax_tps.xaxis.set_minor_formatter(NullFormatter())
    ax_acc.set_ylabel("accept length (tokens/step)")
    ax_tps.set_ylabel("tokens/s")
    ax_tps.set_xlabel("DDTree budget (tree nodes)")
    title = f"{results['config']} on {results['host']}"
    if results.get("simulated"):
        title += "\n(simulated engine: plumbing, not SGLang's behaviour)"
    ax_acc.set_title(title)
    for ax in (ax_acc, ax_tps):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.canvas.draw()
    marked = [float(x["budget"]) for x in (best, cliff) if x]
    thin_tick_labels(fig, ax_tps, marked)
    return fig


def plot(results: dict, path: Path) -> None:
    """``sweep.png``: the figure of ``figure``, written atomically with the report files' mode."""
    from matplotlib import pyplot as plt

    fig = figure(results)
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    os.chmod(tmp, FILE_MODE)
    os.replace(tmp, path)


def _write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, FILE_MODE)  # mkstemp makes 0600; sweep.png is written the same way (FILE_MODE)
    os.replace(tmp, path)


def write(results: dict, out_dir: Path) -> dict[str, Path]:
    """Write results.json, results.md and sweep.png into ``out_dir`` (each atomically, each FILE_MODE)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "results.json", "md": out_dir / "results.md", "png": out_dir / "sweep.png"}
    _write_text(paths["json"], json.dumps(results, indent=2) + "\n")
    _write_text(paths["md"], markdown(results))
    sched = results.get("budget_schedule")
    if sched and sched.get("config_yaml") and sched.get("config_file"):
        paths["schedule_config"] = out_dir / sched["config_file"]
        _write_text(paths["schedule_config"], sched["config_yaml"])
    plot(results, paths["png"])
    return paths
