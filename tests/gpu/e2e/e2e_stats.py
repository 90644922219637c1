"""Statistics of the end-to-end harness, pure Python (no torch, no server): the near-tie rule for
greedy losslessness, accept-length histograms and the sibling statistics of accepted tree paths.

The near-tie rule (``compare_greedy``): a candidate's greedy tokens equal the autoregressive (AR)
server's, or, at the first step where they differ, the candidate's token is one the AR server itself
scores within ``tol`` nats of its own top-1 (with the top-2 token: the AR top-1/top-2 log-prob gap is
below ``tol``). Anything else is a divergence outside the rule. ``TIE_TOLERANCE_NATS`` is the stated
bf16 tolerance (README.md, "The near-tie rule").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

# bf16 keeps 8 significant bits: one unit in the last place of a logit in [2, 4) is 2**-6 = 0.0156.
# A flip between the verify kernels (tree attention, recurrent kernels over budget + 1 positions) and
# the decode kernels needs the two computations to disagree by the gap; 0.0625 nats = 4 such units.
TIE_TOLERANCE_NATS = 0.0625

EQUAL, NEAR_TIE, DIVERGED, INCOMPLETE = "equal", "near_tie", "diverged", "incomplete"


def top_entries(step: Sequence) -> list[tuple[float, int]]:
    """One step of SGLang's ``output_top_logprobs`` / ``input_top_logprobs`` ([logprob, token id, text]
    entries, best first) as (logprob, id) pairs; None entries are skipped."""
    out = []
    for entry in step or ():
        if entry is None or entry[0] is None:
            continue
        out.append((float(entry[0]), int(entry[1])))
    out.sort(key=lambda e: -e[0])
    return out


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ (a length difference counts), or None."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_greedy(ar_ids: Sequence[int], ar_top: Sequence[Sequence], cand_ids: Sequence[int],
                   tol: float = TIE_TOLERANCE_NATS) -> dict:
    """Judge one prompt's candidate tokens against the AR server's by the near-tie rule.

    ``ar_top[i]``: the AR server's top log-probs at output step i (``output_top_logprobs``).
    Returns ``{"verdict", "step", "ar_token", "cand_token", "gap", "cand_gap"}``: ``gap`` is the AR
    top-1/top-2 gap at the first differing step, ``cand_gap`` how far below the AR top-1 the
    candidate's token is there (None when the AR server did not list it).
    """
    out = {"verdict": EQUAL, "step": None, "ar_token": None, "cand_token": None, "gap": None, "cand_gap": None}
    step = first_difference(ar_ids, cand_ids)
    if step is None:
        return out
    out["step"] = step
    if step >= len(ar_ids) or step >= len(cand_ids):
        out["verdict"] = INCOMPLETE
        return out
    out["ar_token"], out["cand_token"] = int(ar_ids[step]), int(cand_ids[step])
    top = top_entries(ar_top[step]) if step < len(ar_top) else []
    if len(top) >= 2:
        out["gap"] = round(top[0][0] - top[1][0], 6)
    listed = {tok: lp for lp, tok in top}
    if top and out["cand_token"] in listed:
        out["cand_gap"] = round(top[0][0] - listed[out["cand_token"]], 6)
    near = out["cand_gap"] is not None and out["cand_gap"] < tol
    out["verdict"] = NEAR_TIE if near else DIVERGED
    return out


def summarize_lossless(verdicts: Iterable[dict]) -> dict:
    """Counts per verdict, the flip rate (prompts not equal to AR / prompts), the gaps seen at
    near-ties, and the divergences outside the rule (prompt index, step, tokens, gap)."""
    verdicts = list(verdicts)
    counts = Counter(v["verdict"] for v in verdicts)
    n = len(verdicts)
    outside = [{"prompt": i, "step": v["step"], "ar": v["ar_token"], "cand": v["cand_token"], "gap": v["gap"],
                "cand_gap": v["cand_gap"]}
               for i, v in enumerate(verdicts) if v["verdict"] in (DIVERGED, INCOMPLETE)]
    tie_gaps = sorted(v["cand_gap"] for v in verdicts if v["verdict"] == NEAR_TIE)
    return {
        "prompts": n,
        "equal": counts[EQUAL], "near_tie": counts[NEAR_TIE], "diverged": counts[DIVERGED],
        "incomplete": counts[INCOMPLETE],
        "flip_rate": round((n - counts[EQUAL]) / n, 4) if n else None,
        "outside_rule": len(outside),
        "near_tie_gap_max": tie_gaps[-1] if tie_gaps else None,
        "divergences": outside,
        "first_diff_steps": sorted(v["step"] for v in verdicts if v["step"] is not None),
    }


def teacher_forced(cand_ids: Sequence[int], ar_top_at: Sequence[Sequence], tol: float = TIE_TOLERANCE_NATS) -> dict:
    """Every candidate token against the AR server's choice *given the candidate's own prefix*.

    ``ar_top_at[i]``: the AR server's top log-probs for the token at output position i, scored by one
    AR prefill of prompt + candidate output (``input_top_logprobs``). A token counts as outside the
    rule when it is not within ``tol`` of the AR top-1 there. This checks whole outputs, past a first
    near-tie flip, where ``compare_greedy`` stops.
    """
    checked = outside = ties = 0
    worst = None
    first_outside = None
    for i, tok in enumerate(cand_ids):
        if i >= len(ar_top_at):
            break
        top = top_entries(ar_top_at[i])
        if not top:
            continue
        checked += 1
        listed = {t: lp for lp, t in top}
        gap = top[0][0] - listed[tok] if tok in listed else None
        if top[0][1] == tok:
            continue
        if gap is not None and gap < tol:
            ties += 1
            continue
        outside += 1
        if first_outside is None:
            first_outside = i
        if gap is not None and (worst is None or gap > worst):
            worst = gap
    return {"checked": checked, "near_ties": ties, "outside_rule": outside, "first_outside": first_outside,
            "worst_gap": None if worst is None else round(worst, 6)}


# --- accepted tree paths ---------------------------------------------------------------------------------

def path_ranks(path: Sequence[int], parent: Sequence[int], next_token: Sequence[int],
               next_sibling: Sequence[int]) -> list[int]:
    """Sibling rank of each accepted node below the root (0 = its parent's first child).

    ``path``: verify indices root first (0, v1, v2, ...). ``parent``/``next_token``/``next_sibling``:
    the request's ``retrieve_parent_token`` / ``retrieve_next_token`` (first child) /
    ``retrieve_next_sibling`` rows (-1 = none). Raises ValueError when the path is not a chain of
    parent links or a node is not among its parent's children.
    """
    ranks = []
    for prev, node in zip(path, path[1:], strict=False):
        if parent[node] != prev:
            raise ValueError(f"accepted node {node} has parent {parent[node]}, not the previous node {prev}")
        child, rank, seen = next_token[prev], 0, 0
        while child != node:
            if child < 0 or seen > len(next_sibling):
                raise ValueError(f"accepted node {node} is not a child of {prev}")
            child, rank, seen = next_sibling[child], rank + 1, seen + 1
        ranks.append(rank)
    return ranks


def step_rows(accept_index: Sequence[Sequence[int]], accept_lens: Sequence[int], parents: Sequence[Sequence[int]],
              next_tokens: Sequence[Sequence[int]], next_siblings: Sequence[Sequence[int]], width: int) -> list[list]:
    """One decode step, every request: ``[accepted draft tokens, [sibling ranks along the path]]``.

    ``accept_index`` [bs, D + 1]: EAGLE's global node ids (request * width + verify index, -1 padded),
    ``accept_lens`` [bs]: accepted verify positions including the root.
    """
    rows = []
    for b, n in enumerate(accept_lens):
        n = int(n)
        path = [int(x) % width for x in accept_index[b][:n]]
        if not path:
            rows.append([0, []])
            continue
        rows.append([n - 1, path_ranks(path, parents[b], next_tokens[b], next_siblings[b])])
    return rows


def path_statistics(rows: Iterable[Sequence]) -> dict:
    """Per server, over all logged verify steps (one row per request and step): the histogram of accepted
    draft tokens, the share of steps whose accepted path passes a non-first sibling, the share of
    steps accepting two or more draft tokens, and the deepest accepted rank seen."""
    hist: Counter = Counter()
    steps = nonfirst = two_plus = 0
    max_rank = 0
    for accepted, ranks in rows:
        steps += 1
        hist[int(accepted)] += 1
        if any(r > 0 for r in ranks):
            nonfirst += 1
        if accepted >= 2:
            two_plus += 1
        max_rank = max([max_rank, *ranks])
    return {
        "steps": steps,
        "accepted_hist": {str(k): hist[k] for k in sorted(hist)},
        "nonfirst_sibling_share": round(nonfirst / steps, 4) if steps else None,
        "two_plus_share": round(two_plus / steps, 4) if steps else None,
        "mean_accepted": round(sum(k * v for k, v in hist.items()) / steps, 4) if steps else None,
        "max_rank": max_rank,
    }


def merge_histograms(hists: Iterable[Sequence[int] | None]) -> dict:
    """Sum per-request ``spec_correct_drafts_histogram`` lists (index = correct drafts in a step)."""
    total: Counter = Counter()
    for h in hists:
        for k, v in enumerate(h or ()):
            total[k] += int(v)
    return {str(k): total[k] for k in sorted(total)}


LOOP_NGRAM, LOOP_TIMES = 8, 3


def looping(ids: Sequence[int], n: int = LOOP_NGRAM, times: int = LOOP_TIMES) -> bool:
    """Whether an output has fallen into a repeated loop: some run of ``n`` tokens occurs ``times`` times or more
    (a small trained model's greedy output often repeats a line; acceptance is then easy and says less)."""
    seen: dict[tuple, int] = {}
    for i in range(len(ids) - n + 1):
        key = tuple(ids[i:i + n])
        seen[key] = seen.get(key, 0) + 1
        if seen[key] >= times:
            return True
    return False
