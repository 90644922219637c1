"""DDTree budget schedule: the tree budget of a decode step chosen from the running batch size.

What: ``--speculative-ddtree-budget-schedule "1:64,4:32,8:15"`` (patch 0005) is a list of
``min_batch:budget`` entries, ascending in ``min_batch`` from 1. A decode step of ``n`` requests
uses the budget of the last entry whose ``min_batch <= n``. ``parse`` checks and normalises the
text (``ddtree_hook.handle_ddtree`` calls it at start, so a bad schedule stops the server with one
line); ``BudgetSchedule.budget_for(n)`` answers from a host table: no device read, no sync, the
batch size is the host's ``len(batch.seq_lens)``.

Why: one fixed budget suits one load (docs/benchmarks.md: DDTREE 64 costs 1.28x DFLASH 16's step
at batch 1 but 2.5x at batch 6); the schedule lets a large tree serve a lone request and a small
one a full batch, in one server.

What is sized for the largest budget (``--speculative-ddtree-budget``, which must equal it): the
scheduler's KV reservation per decode step (2 x (budget + 1) slots), the recurrent-state forking
buffers and the top-k cap (at most the smallest budget). The target's verify CUDA graphs are
captured at every scheduled budget's width (``ddtree_graphs.py``: one graph runner per width, each
with its own attention backend, dispatched by the step's width); with
``SGLANG_DDTREE_SCHEDULE_GRAPHS=0`` only the largest width has graphs and the other steps verify
eagerly (0.5.23's runner replays only its captured width).

Losslessness: each step is a complete DDTree step at its budget (the tree, its mask, the verify and
the accepted-path commit all take the step's width), so a request that lives across a change of
bucket sees a sequence of lossless steps.

New file of the sgdeploy patch series (feature ``ddtree``), not in SGLang 0.5.23.
"""

from __future__ import annotations

FLAG = "--speculative-ddtree-budget-schedule"
MAX_BUDGET = 1024  # ddtree_hook's bound on --speculative-ddtree-budget
MAX_MIN_BATCH = 1 << 20


def parse(text: str) -> tuple[tuple[int, int], ...]:
    """``"1:64,4:32,8:15"`` -> ((1, 64), (4, 32), (8, 15)). Raises ValueError with one line naming the
    flag, the value and what is allowed."""
    raw = str(text).strip()
    if not raw:
        raise ValueError(f"{FLAG} is empty; give min_batch:budget pairs, e.g. 1:64,4:32,8:15.")
    entries: list[tuple[int, int]] = []
    for part in raw.split(","):
        item = part.strip()
        fields = item.split(":")
        if len(fields) != 2 or not all(f.strip().isdigit() for f in fields):
            raise ValueError(
                f"{FLAG} entry {item!r} is not min_batch:budget with two whole numbers (e.g. 4:32)."
            )
        min_batch, budget = (int(f) for f in fields)
        if not 1 <= min_batch <= MAX_MIN_BATCH:
            raise ValueError(f"{FLAG} entry {item!r}: min_batch must be 1 to {MAX_MIN_BATCH}.")
        if not 1 <= budget <= MAX_BUDGET:
            raise ValueError(f"{FLAG} entry {item!r}: budget must be 1 to {MAX_BUDGET}.")
        entries.append((min_batch, budget))
    if entries[0][0] != 1:
        raise ValueError(f"{FLAG} must start at min_batch 1 (every batch size needs a budget), got {raw!r}.")
    for (a, _), (b, _) in zip(entries, entries[1:], strict=False):
        if b <= a:
            raise ValueError(f"{FLAG}: min_batch must rise strictly from entry to entry, got {raw!r}.")
    return tuple(entries)


def normalise(entries: tuple[tuple[int, int], ...]) -> str:
    return ",".join(f"{m}:{b}" for m, b in entries)


class BudgetSchedule:
    """The budget per batch size, from a host list indexed by batch size (no search in the step)."""

    def __init__(self, entries: tuple[tuple[int, int], ...], max_bs: int = 1024):
        self.entries = tuple(entries)
        self.largest = max(b for _, b in self.entries)
        self.smallest = min(b for _, b in self.entries)
        self.budgets = tuple(sorted({b for _, b in self.entries}))
        table = [self.entries[0][1]] * (max_bs + 1)
        for min_batch, budget in self.entries:
            for n in range(min(min_batch, max_bs + 1), max_bs + 1):
                table[n] = budget
        self._table = table

    @classmethod
    def from_text(cls, text: str, max_bs: int = 1024) -> BudgetSchedule:
        return cls(parse(text), max_bs)

    def budget_for(self, batch_size: int) -> int:
        if batch_size < len(self._table):
            return self._table[batch_size]
        return [b for m, b in self.entries if m <= batch_size][-1]

    def __str__(self) -> str:
        return normalise(self.entries)
