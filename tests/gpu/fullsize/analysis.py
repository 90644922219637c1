"""What acceptance each DDTree budget needs to beat budget 15, from the full-size step times (CPU).

    python tests/gpu/fullsize/analysis.py RESULTS.json [--out DIR] [--field-accept 15] [--cap 16]

RESULTS.json is full_runner.py's output. Tokens per second at batch b = b x accept length / step time, so a
server S beats DDTREE budget 15 at the field's acceptance ``a15`` (issue 23: about 15 tokens per step at
budget 15; 173.4 tokens/s, 6.5x AR, on an RTX PRO 6000) only if its own accept length exceeds

    needed(S) = a15 x step(S) / step(DDTREE 15)            (same batch size)

No budget can accept more than ``cap`` = block size 16 tokens per step (15 draft depths + the bonus token),
whatever its width: where needed(S) > cap the budget cannot beat budget 15 at that acceptance at all. The
step times are the medians of the run (random weights: the step's work does not depend on acceptance,
except the commit of the accepted path).

Writes OUT/acceptance.md (the table) and OUT/acceptance.png (``make sweep``'s style: panels over the
budget, one line per batch size).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

FIELD_ACCEPT = 15.0
FIELD_TOKENS_PER_S = 173.4
FIELD_SPEEDUP = 6.5
CAP = 16.0
REFERENCE = "ddtree-b15"


def step_ms(results: dict, name: str, batch: int) -> float | None:
    """The server's median step time at this batch size (None where it did not run it)."""
    m = (results.get(name) or {}).get("measure") or {}
    return (m.get(f"batch_{batch}") or {}).get("step_ms_median")


def needed_accept(step: float, reference_step: float, field_accept: float = FIELD_ACCEPT) -> float:
    """Accept length at which a server of step time ``step`` makes as many tokens/s as the reference."""
    if step <= 0 or reference_step <= 0:
        raise ValueError(f"step times must be positive, got {step} and {reference_step}")
    return field_accept * step / reference_step


def rows(results: dict, field_accept: float = FIELD_ACCEPT, cap: float = CAP) -> list[dict]:
    """One row per server and batch size it measured, compared with DDTREE 15 and DFLASH 16 at the same
    batch size (a batch size the reference did not run has no ratio)."""
    names = [k for k, v in results.items() if isinstance(v, dict) and "predicted_bytes" in v]
    batches = sorted({b for n in names for b in (results[n].get("batches") or [])})
    out = []
    for batch in batches:
        ref = step_ms(results, REFERENCE, batch)
        dflash = step_ms(results, "dflash-b16", batch)
        for name in names:
            if batch not in (results[name].get("batches") or []):
                continue
            s = step_ms(results, name, batch)
            row = {"server": name, "batch": batch, "step_ms": s, "budget": _budget(name), "vs_b15": None,
                   "vs_dflash": None, "needed_accept": None, "reachable": None}
            if s is not None and ref is not None:
                row["vs_b15"] = round(s / ref, 4)
                row["needed_accept"] = round(needed_accept(s, ref, field_accept), 3)
                row["reachable"] = row["needed_accept"] <= cap if name != "ar" else None
            if s is not None and dflash is not None:
                row["vs_dflash"] = round(s / dflash, 4)
            out.append(row)
    return out


def _budget(name: str) -> int | None:
    for part in name.split("-"):
        if part.startswith("b") and part[1:].isdigit() and name.startswith("ddtree"):
            return int(part[1:])
    return None


def num(x, d=3) -> str:
    """A table cell: ``x`` with ``d`` decimals, empty for None."""
    return "" if x is None else f"{x:.{d}f}"


def markdown(table: list[dict], field_accept: float = FIELD_ACCEPT, cap: float = CAP) -> str:
    lines = [f"Accept length each server needs to make the tokens/s of DDTREE budget 15 at the field's "
             f"{field_accept:g} tokens per step (cap {cap:g}: block size 16).", "",
             "| server | batch | step ms | x DDTREE 15 | x DFLASH 16 | accept length needed | reachable (<= cap) |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    f = num
    for r in table:
        reach = "" if r["reachable"] is None else ("yes" if r["reachable"] else "**no**")
        lines.append(f"| {r['server']} | {r['batch'] or ''} | {f(r['step_ms'])} | {f(r['vs_b15'])} | "
                     f"{f(r['vs_dflash'])} | {f(r['needed_accept'], 2)} | {reach} |")
    return "\n".join(lines) + "\n"


def plot(table: list[dict], path: Path, field_accept: float = FIELD_ACCEPT, cap: float = CAP,
         title: str = "DDTree on a Qwen3.6-27B-shaped target, H200") -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, (ax_step, ax_acc) = plt.subplots(2, 1, sharex=True, figsize=(7.5, 6.5), dpi=100)
    budgets = set()
    styles = ("o-", "^-", "s-", "d-")
    for i, batch in enumerate(sorted({r["batch"] for r in table})):
        style = styles[i % len(styles)]
        pts = sorted((r for r in table if r["batch"] == batch and r["budget"] and r["step_ms"] is not None
                      and r["server"] == f"ddtree-b{r['budget']}"), key=lambda r: r["budget"])
        if not pts:
            continue
        xs = [r["budget"] for r in pts]
        budgets.update(xs)
        ax_step.plot(xs, [r["step_ms"] for r in pts], style, label=f"DDTree, batch {batch}")
        acc = [(r["budget"], r["needed_accept"]) for r in pts if r["needed_accept"] is not None]
        if acc:
            ax_acc.plot([a for a, _ in acc], [b for _, b in acc], style, label=f"needed, batch {batch}")
        s = next((r["step_ms"] for r in table if r["server"] == "dflash-b16" and r["batch"] == batch), None)
        if s is not None:
            ax_step.axhline(s, linestyle="--", linewidth=1, color=f"C{i}", alpha=0.6,
                            label=f"DFLASH 16, batch {batch}")
    ax_acc.axhline(cap, color="tab:red", linestyle="--", linewidth=1, label=f"cap {cap:g} (block size)")
    ax_acc.axhline(field_accept, color="tab:green", linestyle=":", linewidth=1,
                   label=f"field, budget 15: {field_accept:g}")
    if budgets:
        ax_acc.set_xscale("log", base=2)
        ax_acc.set_xticks(sorted(budgets))
        ax_acc.set_xticklabels([str(b) for b in sorted(budgets)])
    ax_step.set_ylabel("decode step (ms, median)")
    ax_acc.set_ylabel("accept length to beat budget 15")
    ax_acc.set_xlabel("DDTree budget (tree nodes)")
    ax_step.set_title(title)
    for ax in (ax_step, ax_acc):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def merge_servers(results: dict) -> dict:
    """The server entries of one results.json that ran (measured), by name."""
    return {k: v for k, v in results.items() if isinstance(v, dict) and "predicted_bytes" in v
            and (v.get("measure") or {})}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, nargs="+", help="full_runner results.json; several (calls of one "
                    "session that ran different servers) are merged, a later file's server winning")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--field-accept", type=float, default=FIELD_ACCEPT)
    ap.add_argument("--cap", type=float, default=CAP)
    args = ap.parse_args(argv)
    if not 1 <= args.field_accept <= args.cap:
        print(f"analysis: --field-accept {args.field_accept:g}: give 1 to --cap ({args.cap:g})", file=sys.stderr)
        return 2
    results: dict = {}
    for path in args.results:
        try:
            results.update(merge_servers(json.loads(path.read_text())))
        except (OSError, ValueError) as err:
            print(f"analysis: {path}: cannot read the results: {err}", file=sys.stderr)
            return 2
    table = rows(results, args.field_accept, args.cap)
    args.out.mkdir(parents=True, exist_ok=True)
    text = markdown(table, args.field_accept, args.cap)
    (args.out / "acceptance.md").write_text(text)
    plot(table, args.out / "acceptance.png", args.field_accept, args.cap)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
