"""The SGLang patch series and the release label of the one patched build.

`patches/sglang/` holds the series: `series` lists one diff per line as `<file> <feature>` (`#`
starts a comment; the feature says which part of the work the diff belongs to), the diffs edit
files that upstream ships, and `src/` holds every file the series adds, at its package path
(`src/sglang/srt/speculative/ddtree_tree.py`). One wheel carries all of it; the features are
switched by server flags of the patched SGLang, not by builds.

A config either needs the patched series (it uses a patched feature) or not: `select` returns the
whole series for any non-empty feature set and nothing for the empty one. The release label is
`stock` for the pristine wheel, else the series hash: the first 12 hex digits of sha256 over the
series file, every diff and every src file (names and bytes) (docs/build.md, "The label").
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

FEATURES: tuple[str, ...] = ("ddtree", "fork", "topk")
"""Patch features, in label order."""

DEFAULT_PATCHES_DIR = Path(__file__).resolve().parent.parent / "patches" / "sglang"
SERIES_NAME = "series"
SRC_NAME = "src"
STOCK_LABEL = "stock"
LABEL_HASH_LEN = 12


class PatchSetError(ValueError):
    """A series or a feature selection that cannot be used; the message is for people."""


@dataclass(frozen=True)
class Patch:
    name: str
    """File name as written in the series."""
    path: Path
    feature: str
    line: int
    """Line of the series that names it."""

    def read_bytes(self) -> bytes:
        return self.path.read_bytes()


@dataclass(frozen=True)
class Series:
    path: Path
    patches: tuple[Patch, ...]

    @property
    def directory(self) -> Path:
        return self.path.parent

    def features(self) -> tuple[str, ...]:
        present = {p.feature for p in self.patches}
        return tuple(f for f in FEATURES if f in present)

    @property
    def src_dir(self) -> Path:
        return self.directory / SRC_NAME

    def select(self, features: Iterable[str]) -> list[Patch]:
        """The whole series when `features` is not empty (one patched build), else nothing."""
        wanted = _check_features(features)
        missing = [f for f in FEATURES if f in wanted and f not in {p.feature for p in self.patches}]
        if missing:
            raise PatchSetError(
                f"feature {missing[0]!r} is wanted but {self.path} has no patch for it "
                f"(the series has: {', '.join(self.features()) or 'no patches'})"
            )
        return list(self.patches) if wanted else []


def _check_features(features: Iterable[str]) -> set[str]:
    wanted = set()
    for f in features:
        if f not in FEATURES:
            raise PatchSetError(f"unknown patch feature {f!r} (allowed: {', '.join(FEATURES)})")
        wanted.add(f)
    return wanted


def load(patches_dir: Path | str = DEFAULT_PATCHES_DIR) -> Series:
    """Parse `<patches_dir>/series`; every error names the file and line."""
    directory = Path(patches_dir)
    path = directory / SERIES_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PatchSetError(f"patch series not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PatchSetError(f"cannot read patch series {path}: {exc}") from None
    patches: list[Patch] = []
    seen: dict[str, int] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        where = f"{path}:{lineno}"
        if len(fields) != 2:
            raise PatchSetError(f"{where}: expected '<file> <feature>', got {line!r}")
        name, feature = fields
        if feature not in FEATURES:
            raise PatchSetError(f"{where}: unknown feature {feature!r} (allowed: {', '.join(FEATURES)})")
        if name in seen:
            raise PatchSetError(f"{where}: duplicate patch {name!r} (first listed at line {seen[name]})")
        if "/" in name or name in (".", ".."):
            raise PatchSetError(f"{where}: patch {name!r} must be a file name in {directory}, not a path")
        file = directory / name
        if not file.is_file():
            raise PatchSetError(f"{where}: patch file {name!r} not found in {directory}")
        seen[name] = lineno
        patches.append(Patch(name=name, path=file, feature=feature, line=lineno))
    return Series(path=path, patches=tuple(patches))


def select(features: Iterable[str], patches_dir: Path | str = DEFAULT_PATCHES_DIR) -> list[Patch]:
    """The patch set for `features`: the whole series, or nothing for the empty set."""
    return load(patches_dir).select(features)


def features_of(patches: Sequence[Patch]) -> tuple[str, ...]:
    present = {p.feature for p in patches}
    return tuple(f for f in FEATURES if f in present)


def src_files(src_dir: Path | str) -> list[tuple[str, Path]]:
    """(path inside the wheel, file) of every file under `src_dir`, sorted; caches are skipped."""
    root = Path(src_dir)
    if not root.is_dir():
        return []
    out = []
    for path in root.rglob("*"):
        rel = path.relative_to(root).as_posix()
        if "__pycache__" in path.parts or rel.endswith((".pyc", ".pyo")) or path.is_dir():
            continue
        if path.is_symlink() or not path.is_file():
            raise PatchSetError(f"{path}: only regular files can be laid over the wheel")
        out.append((rel, path))
    return sorted(out)


def release_label(patches: Sequence[Patch]) -> str:
    """`stock` for no patches, else the series hash (12 hex digits; docs/build.md).

    The hash covers the series file, every diff it lists and every file under `src/` of the
    patches' directory, each framed by its kind, name and length, so renaming or moving a file
    changes the label too. An all-decimal hash would be rewritten by PEP 440 normalisation
    (`+0123...` becomes `+123...`), so such a hash gets an `x` in place of its first digit.
    """
    if not patches:
        return STOCK_LABEL
    directory = patches[0].path.parent
    series = load(directory)
    digest = hashlib.sha256()

    def put(kind: str, name: str, data: bytes) -> None:
        digest.update(f"{kind} {name} {len(data)}\n".encode())
        digest.update(data)

    put("series", SERIES_NAME, series.path.read_bytes())
    for p in series.patches:
        put("diff", p.name, p.read_bytes())
    for rel, path in src_files(series.src_dir):
        put("src", rel, path.read_bytes())
    label = digest.hexdigest()[:LABEL_HASH_LEN]
    return "x" + label[1:] if label.isdigit() else label
