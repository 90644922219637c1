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


def test_select_keeps_series_order(tmp_path):
    d = make_series(tmp_path, SERIES, THREE)
    chosen = patchset.select(["topk", "ddtree"], d)
    assert [p.name for p in chosen] == ["0001-ddtree.patch", "0003-topk.patch"]
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


def test_by_names_checks_membership(tmp_path):
    d = make_series(tmp_path, SERIES, THREE)
    s = patchset.load(d)
    assert [p.name for p in s.by_names(["0003-topk.patch", "0001-ddtree.patch"])] == [
        "0001-ddtree.patch",
        "0003-topk.patch",
    ]
    with pytest.raises(PatchSetError, match=r"patch '0009-x.patch' is not in .*series \(allowed: 0001"):
        s.by_names(["0009-x.patch"])


def test_label_format_and_hash(tmp_path):
    d = make_series(tmp_path, SERIES, THREE)
    chosen = patchset.select(["ddtree", "fork", "topk"], d)
    label = patchset.release_label(chosen)
    expected = hashlib.sha256(b"ddtree bytes\nfork bytes\ntopk bytes\n").hexdigest()[:8]
    assert label == f"ddtree.fork.topk.{expected}"
    assert re.fullmatch(r"[a-z.]+\.[0-9a-f]{8}", label)
    assert patchset.release_label(patchset.select(["ddtree"], d)).startswith("ddtree.")
    assert patchset.release_label([]) == "stock"


def test_label_is_stable_and_changes_with_one_byte(tmp_path):
    d = make_series(tmp_path, SERIES, THREE)
    first = patchset.release_label(patchset.select(["ddtree", "fork"], d))
    assert patchset.release_label(patchset.select(["fork", "ddtree"], d)) == first
    (d / "0002-fork.patch").write_bytes(b"fork bytes!\n")
    changed = patchset.release_label(patchset.select(["ddtree", "fork"], d))
    assert changed != first and changed.startswith("ddtree.fork.")
    # A patch the set does not select does not move the label.
    (d / "0003-topk.patch").write_bytes(b"other\n")
    assert patchset.release_label(patchset.select(["ddtree", "fork"], d)) == changed


def test_real_series_parses():
    series_file = patchset.DEFAULT_PATCHES_DIR / "series"
    if not series_file.exists():
        pytest.skip("patches/sglang/series is not written yet")
    s = patchset.load()
    assert s.patches, "the series lists no patches"
    for p in s.patches:
        assert p.path.read_bytes().strip(), f"{p.name} is empty"
