"""Sweep report: the acceptance cliff, the recommendation, and the three output files.

Pure logic over variant rows (one per budget × top-k cap, as `sgdeploy.sweep` measures them):

- **cliff**: per top-k cap, in increasing budget order, the first budget whose mean accept length
  is more than ``cliff_drop`` (a fraction, 0.25 by default) below the best accept length of the
  smaller budgets of that cap. The reported ``cliff`` is the one at the smallest budget over all
  caps; ``cliffs`` lists one per cap that has one.
- **fastest**: the variant with the most tokens/s.
- **recommendation** (``best``): among the variants whose tokens/s is within ``tie_tolerance`` (a
  fraction, 0.03 by default) of the fastest and that sit below their cap's cliff, the largest budget
  (then the largest cap). Best-first trees are nested, so a larger budget verifies a superset of the
  smaller tree and accepts at least as much on every step; when its cost does not show in tokens/s at
  the load benchmarked, the larger tree is the headroom for prompts the drafter finds harder. With
  no tie the recommendation is the fastest. A warning when it sits right before its cap's cliff (the
  next budget tested with that cap is the cliff): a longer prompt mix or a model update may tip it
  over.

Files (``write``): ``results.json`` (schema 1, see docs/sweep.md), ``results.md`` (a table, the
cliff and the recommendation) and ``sweep.png`` (accept length and tokens/s against budget, one
line per cap, the cliff and the best marked; matplotlib with the Agg backend, imported only here).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

SCHEMA = 1
DEFAULT_CLIFF_DROP = 0.25
DEFAULT_TIE_TOLERANCE = 0.03
VARIANT_KEYS = ("budget", "topk_cap", "accept_length_mean", "accept_length_sd", "tokens_per_s", "step_time_ms",
                "requests", "failures", "status", "error")


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


def recommend(rows: list[dict], cliffs: list[dict], cliff_drop: float = DEFAULT_CLIFF_DROP,
              tie_tolerance: float = DEFAULT_TIE_TOLERANCE) -> tuple[dict | None, str, str | None]:
    """(recommended row, recommendation text, warning text or None).

    A variant whose exactness gate failed (it does not give the target's own greedy tokens) is never
    recommended, however fast; the text says which were left out."""
    inexact = [r for r in rows if exactness_verdict(r) == "fail"]
    rows = [r for r in rows if exactness_verdict(r) != "fail"]
    left_out = (f"; not recommended, exactness failed: {', '.join(_name(r) for r in inexact)}" if inexact else "")
    fastest = best_variant(rows)
    if fastest is None:
        failed = sum(1 for r in rows if r.get("status") != "ok")
        why = f" ({failed} of {len(rows)} failed)" if rows else ""
        return None, f"no variant was measured{why}: nothing to recommend{left_out}", None
    tied = tied_with_fastest(rows, cliffs, tie_tolerance, fastest)
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


def build_results(*, config: str, host: str, started: str, finished: str, variants: list[dict],
                  cliff_drop: float = DEFAULT_CLIFF_DROP, tie_tolerance: float = DEFAULT_TIE_TOLERANCE,
                  restored: str | None = None, **extra: Any) -> dict[str, Any]:
    """The ``results.json`` object (schema 1)."""
    for row in variants:
        missing = [k for k in VARIANT_KEYS if k not in row]
        if missing:
            raise ReportError(f"variant {row.get('budget')!r}/{row.get('topk_cap')!r}: missing {', '.join(missing)}")
    cliffs = find_cliffs(variants, cliff_drop)
    cliff = first_cliff(cliffs)
    best, text, warning = recommend(variants, cliffs, cliff_drop, tie_tolerance)
    fastest = best_variant([r for r in variants if exactness_verdict(r) != "fail"])
    results = {
        "schema": SCHEMA, "config": config, "host": host, "started": started, "finished": finished,
        "variants": variants,
        "cliff": None if cliff is None else {k: cliff[k] for k in ("budget", "topk_cap", "drop_pct")},
        "best": None if best is None else dict(best),
        "fastest": None if fastest is None else dict(fastest),
        "recommendation": text, "warning": warning, "restored": restored,
        "cliff_drop": cliff_drop, "tie_tolerance": tie_tolerance, "cliffs": cliffs,
    }
    results.update(extra)
    return results


# --------------------------------------------------------------------------------------------------
# Files


def markdown(results: dict) -> str:
    """``results.md``: what was swept, a table, the cliff, the recommendation and the warning."""
    lines = [f"# Sweep of {results['config']} on {results['host']}", "",
             f"Started {results['started']}, finished {results['finished']}. "
             f"Cliff rule: accept length more than {results.get('cliff_drop', DEFAULT_CLIFF_DROP) * 100:g}% below "
             "the best of the smaller budgets (per top-k cap).", "",
             "| budget | top-k cap | accept length | sd | tokens/s | step ms | requests | failures | exactness "
             "| status |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    cliff, best = results.get("cliff"), results.get("best")
    for r in results["variants"]:
        marks = []
        if cliff and (r["budget"], r["topk_cap"]) == (cliff["budget"], cliff["topk_cap"]):
            marks.append("cliff")
        if best and (r["budget"], r["topk_cap"]) == (best["budget"], best["topk_cap"]):
            marks.append("best")
        fastest = results.get("fastest")
        if fastest and best and (r["budget"], r["topk_cap"]) == (fastest["budget"], fastest["topk_cap"]) \
                and (best["budget"], best["topk_cap"]) != (fastest["budget"], fastest["topk_cap"]):
            marks.append("fastest")
        status = r["status"] if r["status"] == "ok" else f"failed: {r.get('error') or '?'}"
        if marks:
            status += f" ({', '.join(marks)})"
        lines.append(f"| {r['budget']} | {r['topk_cap']} | {_num(r['accept_length_mean'], 2)} | "
                     f"{_num(r['accept_length_sd'], 2)} | {_num(r['tokens_per_s'])} | {_num(r['step_time_ms'])} | "
                     f"{r['requests']} | {r['failures']} | {exactness_verdict(r) or '-'} | "
                     f"{status.replace('|', '/')} |")
    lines.append("")
    if cliff:
        lines.append(f"**Cliff**: budget {cliff['budget']} (cap {cliff['topk_cap']}), "
                     f"accept length down {cliff['drop_pct']:.1f}% from the best so far.")
    else:
        lines.append("**Cliff**: none found.")
    lines += ["", f"**Recommendation**: {results['recommendation']}"]
    if results.get("warning"):
        lines += ["", f"**Warning**: {results['warning']}"]
    restored = results.get("restored")
    lines += ["", f"After the sweep: {'restored ' + restored if restored else 'no earlier config to restore'}.", ""]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    """``sweep.png``: two panels over budget (accept length, tokens/s), one line per cap."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    rows = [r for r in results["variants"] if _measured(r)]
    fig, (ax_acc, ax_tps) = plt.subplots(2, 1, sharex=True, figsize=(7.5, 6.5), dpi=100)
    for cap in _caps(results["variants"]):
        pts = sorted((r for r in rows if r["topk_cap"] == cap), key=lambda r: r["budget"])
        if not pts:
            continue
        budgets = [r["budget"] for r in pts]
        ax_acc.plot(budgets, [r["accept_length_mean"] for r in pts], marker="o", label=f"cap {cap}")
        ax_tps.plot(budgets, [r["tokens_per_s"] for r in pts], marker="o", label=f"cap {cap}")
    cliff, best = results.get("cliff"), results.get("best")
    if cliff:
        for ax in (ax_acc, ax_tps):
            ax.axvline(cliff["budget"], color="tab:red", linestyle="--", linewidth=1,
                       label=f"cliff (budget {cliff['budget']}, -{cliff['drop_pct']:.0f}%)" if ax is ax_acc else None)
    fastest, tol = results.get("fastest"), results.get("tie_tolerance") or 0
    if best and fastest and tol and (best["budget"], best["topk_cap"]) != (fastest["budget"], fastest["topk_cap"]):
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
    ax_acc.set_ylabel("accept length (tokens/step)")
    ax_tps.set_ylabel("tokens/s")
    ax_tps.set_xlabel("DDTree budget (tree nodes)")
    ax_acc.set_title(f"{results['config']} on {results['host']}")
    for ax in (ax_acc, ax_tps):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png")
    plt.close(fig)
    os.replace(tmp, path)


def _write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write(results: dict, out_dir: Path) -> dict[str, Path]:
    """Write results.json, results.md and sweep.png into ``out_dir`` (each atomically)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "results.json", "md": out_dir / "results.md", "png": out_dir / "sweep.png"}
    _write_text(paths["json"], json.dumps(results, indent=2) + "\n")
    _write_text(paths["md"], markdown(results))
    plot(results, paths["png"])
    return paths
