"""Links between the project's Markdown pages resolve: the file exists and its #anchor is one of its headings.

docs/benchmarks.md leads with the current number of each claim and links every row to its dated section in
docs/results/benchmarks-history.md; a renamed heading there would break the link silently.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as '-', '-1', '-2' for repeats."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not re.match(r"#{1,6} ", line):
            continue
        text = line.lstrip("#").strip().lower()
        slug = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN").replace(" ", "-")
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def local_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(page.read_text(encoding="utf-8")) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_local_links_resolve(page):
    for target in local_links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        assert dest.exists(), f"{page.relative_to(REPO)}: link {target}: no such file"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{page.relative_to(REPO)}: link {target}: no such heading"


def test_every_benchmark_row_links_to_its_history_and_back():
    current, history = REPO / "docs" / "benchmarks.md", REPO / "docs" / "results" / "benchmarks-history.md"
    rows = [line for line in current.read_text(encoding="utf-8").splitlines()
            if line.startswith("| ") and not line.startswith(("| claim", "| ---"))]
    assert len(rows) >= 20
    for row in rows:
        assert "results/benchmarks-history.md#" in row, f"a row without its history: {row[:80]}"
        assert re.search(r"\| 20\d\d-\d\d-\d\d", row), f"a row without its date: {row[:80]}"
    assert "../benchmarks.md" in local_links(history)


def test_the_anchor_rule_catches_a_wrong_anchor(tmp_path):
    page = tmp_path / "a.md"
    page.write_text("# Title\n\n## Full size: the targets (issue 23, session 10)\n\n## Repeat\n\n## Repeat\n")
    assert anchors(page) == {"title", "full-size-the-targets-issue-23-session-10", "repeat", "repeat-1"}
