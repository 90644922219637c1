"""The SGLang patch series: which patch carries which feature, and the release label.

`patches/sglang/series` lists one patch per line as `<file> <feature>`; `#` starts a comment.
A config selects features; its patch set is the ordered subset of the series carrying them.
The release label names the features and a hash of the selected patches' bytes
(docs/design.md, "Features and patches").
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
STOCK_LABEL = "stock"
LABEL_HASH_LEN = 8


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

    def select(self, features: Iterable[str]) -> list[Patch]:
        """The patches carrying `features`, in series order."""
        wanted = _check_features(features)
        missing = [f for f in wanted if f not in {p.feature for p in self.patches}]
        if missing:
            raise PatchSetError(
                f"feature {missing[0]!r} is wanted but {self.path} has no patch for it "
                f"(the series has: {', '.join(self.features()) or 'no patches'})"
            )
        return [p for p in self.patches if p.feature in wanted]

    def by_names(self, names: Iterable[str]) -> list[Patch]:
        """The named patches (file names as in the series), in series order."""
        known = {p.name: p for p in self.patches}
        names = [n.strip() for n in names if n.strip()]
        for n in names:
            if Path(n).name not in known and n not in known:
                raise PatchSetError(f"patch {n!r} is not in {self.path} (allowed: {', '.join(known) or 'none'})")
        chosen = {known.get(n) or known[Path(n).name] for n in names}
        return [p for p in self.patches if p in chosen]


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
    """The patch set for `features`, in series order."""
    return load(patches_dir).select(features)


def features_of(patches: Sequence[Patch]) -> tuple[str, ...]:
    present = {p.feature for p in patches}
    return tuple(f for f in FEATURES if f in present)


def release_label(patches: Sequence[Patch]) -> str:
    """`<features joined by .>.<8 hex of sha256 over the patch bytes in order>`, or `stock`."""
    if not patches:
        return STOCK_LABEL
    digest = hashlib.sha256()
    for p in patches:
        digest.update(p.read_bytes())
    return ".".join((*features_of(patches), digest.hexdigest()[:LABEL_HASH_LEN]))
