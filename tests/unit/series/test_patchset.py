"""The patch series parser, the selection of a config's patch set, and the release label."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from sgdeploy import patchset
from sgdeploy.patchset import PatchSetError


def make_series(tmp_path: Path, lines: str, files: dict[str, bytes] | None = None) -> Path:
    d = tmp_path / "patches"
    d.mkdir(exist_ok=True)
    (d / "series").write_text(lines)
    for name, data in (files or {}).items():
        (d / name).write_bytes(data)
    return d


THREE = {
    "0001-ddtree.patch": b"ddtree bytes\n",
    "0002-fork.patch": b"fork bytes\n",
    "0003-topk.patch": b"topk bytes\n",
}
SERIES = "# ordered\n0001-ddtree.patch ddtree\n0002-fork.patch   fork  # state forking\n\n0003-topk.patch topk\n"


def test_series_parses_in_order_with_comments(tmp_path):
    d = make_series(tmp_path, SERIES, THREE)
    s = patchset.load(d)
    assert [(p.name, p.feature, p.line) for p in s.patches] == [
        ("0001-ddtree.patch", "ddtree", 2),
        ("0002-fork.patch", "fork", 3),
        ("0003-topk.patch", "topk", 5),
    ]
    assert s.features() == ("ddtree", "fork", "topk")


@pytest.mark.parametrize(
    "lines, files, expected",
    [
        ("0001-x.patch ddtree\n", {}, r"series:1: patch file '0001-x.patch' not found in .*patches"),
        ("0001-ddtree.patch tree\n", THREE, r"series:1: unknown feature 'tree' \(allowed: ddtree, fork"),
        (
            "0001-ddtree.patch ddtree\n0002-fork.patch fork\n0001-ddtree.patch ddtree\n",
            THREE,
            r"series:3: duplicate patch '0001-ddtree.patch' \(first listed at line 1\)",
        ),
        ("0001-ddtree.patch\n", THREE, r"series:1: expected '<file> <feature>', got '0001-ddtree.patch'"),
        ("../0001-ddtree.patch ddtree\n", THREE, r"must be a file name in .*, not a path"),
    ],
)
def test_series_errors_name_file_line_and_value(tmp_path, lines, files, expected):
    d = make_series(tmp_path, lines, files)
    with pytest.raises(PatchSetError, match=expected) as exc:
        patchset.load(d)
    assert str(d / "series") in str(exc.value)
    assert "\n" not in str(exc.value)


def test_missing_series_is_an_error(tmp_path):
    with pytest.raises(PatchSetError, match=r"patch series not found: .*/nowhere/series"):
        patchset.load(tmp_path / "nowhere")


def test_select_is_the_whole_series_or_nothing(tmp_path):
    d = make_series(tmp_path, SERIES, THREE)
    everything = ["0001-ddtree.patch", "0002-fork.patch", "0003-topk.patch"]
    assert [p.name for p in patchset.select(["topk", "ddtree"], d)] == everything
    assert [p.name for p in patchset.select(["ddtree"], d)] == everything
    assert patchset.select([], d) == []


def test_select_names_a_feature_the_series_lacks(tmp_path):
    d = make_series(tmp_path, "0001-ddtree.patch ddtree\n", THREE)
    with pytest.raises(PatchSetError) as exc:
        patchset.select(["ddtree", "fork"], d)
    msg = str(exc.value)
    assert "'fork'" in msg and str(d / "series") in msg and "has: ddtree" in msg


def test_select_rejects_unknown_feature(tmp_path):
    d = make_series(tmp_path, SERIES, THREE)
    with pytest.raises(PatchSetError, match=r"unknown patch feature 'speed' \(allowed: ddtree, fork, topk\)"):
        patchset.select(["speed"], d)


def expected_label(d: Path) -> str:
    """The rule of docs/build.md, written out: sha256 over framed series, diffs, src files."""
    h = hashlib.sha256()
    for kind, name, data in [("series", "series", (d / "series").read_bytes())] + [
        ("diff", n, (d / n).read_bytes()) for n in ("0001-ddtree.patch", "0002-fork.patch", "0003-topk.patch")
    ] + [("src", p.relative_to(d / "src").as_posix(), p.read_bytes()) for p in sorted((d / "src").rglob("*.py"))]:
        h.update(f"{kind} {name} {len(data)}\n".encode() + data)
    return h.hexdigest()[:12]


def test_label_is_the_series_hash(tmp_path):
    d = make_series(tmp_path, SERIES, THREE)
    (d / "src" / "sglang").mkdir(parents=True)
    (d / "src" / "sglang" / "new.py").write_text("X = 1\n")
    label = patchset.release_label(patchset.select(["ddtree", "fork", "topk"], d))
    assert label == expected_label(d) and re.fullmatch(r"[0-9a-f]{12}", label)
    # Every config that uses a patched feature gets the same label: one build.
    assert patchset.release_label(patchset.select(["ddtree"], d)) == label
    assert patchset.release_label([]) == "stock"


@pytest.mark.parametrize("change", ["diff", "src", "src-rename", "series"])
def test_label_changes_with_one_byte_of_any_input(tmp_path, change):
    d = make_series(tmp_path, SERIES, THREE)
    (d / "src" / "sglang").mkdir(parents=True)
    (d / "src" / "sglang" / "new.py").write_text("X = 1\n")
    first = patchset.release_label(patchset.select(["ddtree"], d))
    assert patchset.release_label(patchset.select(["ddtree"], d)) == first  # stable
    if change == "diff":
        (d / "0003-topk.patch").write_bytes(b"topk bytes!\n")
    elif change == "src":
        (d / "src" / "sglang" / "new.py").write_text("X = 2\n")
    elif change == "src-rename":
        (d / "src" / "sglang" / "new.py").rename(d / "src" / "sglang" / "other.py")
    else:
        (d / "series").write_text(SERIES + "# a comment\n")
    assert patchset.release_label(patchset.select(["ddtree"], d)) != first


def test_all_decimal_hash_gets_a_letter(tmp_path, monkeypatch):
    d = make_series(tmp_path, SERIES, THREE)

    class Digits:
        def update(self, _data):
            pass

        def hexdigest(self):
            return "0123456789" * 7

    monkeypatch.setattr(patchset.hashlib, "sha256", Digits)
    assert patchset.release_label(patchset.select(["ddtree"], d)) == "x12345678901"


def test_real_series_parses():
    series_file = patchset.DEFAULT_PATCHES_DIR / "series"
    if not series_file.exists():
        pytest.skip("patches/sglang/series is not written yet")
    s = patchset.load()
    assert s.patches, "the series lists no patches"
    for p in s.patches:
        assert p.path.read_bytes().strip(), f"{p.name} is empty"
