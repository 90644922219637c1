"""docs/hostile-review.md maps every row of issue 34's "Found" to its tests: each test it names must exist
(the file, and `def name` in it), and no row may say its lab test is `none`, so the table cannot go stale
silently."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "hostile-review.md"
REF = re.compile(r"`(tests/[\w./-]+\.py)::(\w+)`")


def rows() -> list[list[str]]:
    """The table's data rows, as cells (the header and the |---| line left out)."""
    out = []
    for line in DOC.read_text().splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[0] != "#":
                out.append(cells)
    return out


def refs() -> list[tuple[str, str]]:
    return sorted({m.groups() for row in rows() for cell in row for m in REF.finditer(cell)})


def test_the_table_has_one_row_per_found_row_with_a_fix_and_a_lab_test():
    table = rows()
    assert [int(r[0]) for r in table] == list(range(1, len(table) + 1)), [r[0] for r in table]
    assert len(table) >= 23, len(table)
    for row in table:
        assert len(row) == 5 and all(row[:3]), row
        assert row[3].lower() == "none" or "`tests/lab/test_" in row[3], row


def test_no_row_is_without_a_lab_test():
    missing = [f"{r[0]} ({r[1]})" for r in rows() if r[3].strip().lower() == "none"]
    assert not missing, f"rows without a lab test: {missing}"


@pytest.mark.parametrize("path,name", refs(), ids=lambda v: v)
def test_every_test_named_exists(path, name):
    file = REPO / path
    assert file.is_file(), f"docs/hostile-review.md names {path}, which does not exist"
    assert re.search(rf"^\s*(async\s+)?def {name}\(", file.read_text(), re.M), \
        f"docs/hostile-review.md names {path}::{name}, which {path} does not define"
