"""A scratch copy of patched SGLang to edit, and the diff written back into the series.

    python -m sgdeploy.patchwork work [--patch NAME] [--python 3.12]   # make patch-work [PATCH=...]
    python -m sgdeploy.patchwork diff --patch NAME                     # make patch-diff PATCH=...

`work` unpacks the pinned pristine wheel into `build/patchwork/tree/`, lays `patches/sglang/src/`
over it and applies the series up to and including NAME (default: all of it), the way the build
does. Edit upstream files there. `diff` compares every upstream file of the tree with the same file
after the patches before NAME and rewrites NAME as those differences, keeping the patch's header
(everything before its first file header). The tree must have been made for NAME (recorded in
`build/patchwork/PATCH`), so edits of later patches never leak into an earlier one. New files go in
`patches/sglang/src/`, not in a diff: `diff` refuses a new file in the tree, naming it.

Exit status: 0 done, 1 failed (patch does not apply, new file in the tree, download), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import difflib
import shutil
import sys
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

from sgdeploy import patchset, wheel
from sgdeploy.patchset import Patch, PatchSetError, Series
from sgdeploy.wheel import BuildError, UsageError

DEFAULT_WORK = wheel.REPO_ROOT / "build" / "patchwork"
DEFAULT_PYTHON = "3.12"  # the cp312 wheel is the one the GPU hosts run
STATE_NAME = "PATCH"


def _find(series: Series, name: str | None) -> int:
    """Index of patch `name` in the series (the last one when None)."""
    if not series.patches:
        raise UsageError(f"{series.path} lists no patches")
    if name is None:
        return len(series.patches) - 1
    names = [p.name for p in series.patches]
    base = Path(name).name
    for i, n in enumerate(names):
        if base in (n, n.removesuffix(".patch")):
            return i
    raise UsageError(f"PATCH={name}: not in {series.path} (allowed: {', '.join(names)})")


def _upstream(pins: wheel.Pins, python: str, downloads: Path, log: Callable[[str], None]) -> Path:
    return wheel.fetch_upstream(pins, pins.for_python(python), downloads, log=log)


def _unpack(zf: zipfile.ZipFile, root: Path) -> None:
    for info in zf.infolist():
        if not info.is_dir():
            wheel._extract(zf, info, root)


def work(
    series: Series,
    name: str | None = None,
    python: str = DEFAULT_PYTHON,
    out: Path = DEFAULT_WORK,
    downloads: Path = wheel.DEFAULT_DOWNLOADS,
    pins: wheel.Pins | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """Make `out/tree`: pristine + src + the series up to `name`; returns the tree."""
    index = _find(series, name)
    pins = pins or wheel.load_pins()
    upstream = _upstream(pins, python, downloads, log)
    tree = out / "tree"
    if out.exists():
        shutil.rmtree(out)
    tree.mkdir(parents=True)
    src = patchset.src_files(series.src_dir)
    with zipfile.ZipFile(upstream) as zf:
        wheel.check_layout({i.filename for i in zf.infolist() if not i.is_dir()}, series.patches, src)
        _unpack(zf, tree)
    for rel, path in src:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, tree / rel)
    wheel.apply_patches(tree, series.patches[: index + 1], log)
    (out / STATE_NAME).write_text(f"{series.patches[index].name} {python}\n")
    log(f"{tree}: pristine {pins.version} + {patchset.SRC_NAME}/ + series up to {series.patches[index].name}")
    return tree


def _header(patch: Patch) -> str:
    """The patch's text before its first file header (`diff --git`, or `---` followed by `+++`)."""
    lines = patch.read_bytes().decode("utf-8").splitlines(keepends=True)
    for i, line in enumerate(lines):
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if line.startswith("diff --git ") or (line.startswith("--- ") and nxt.startswith("+++ ")):
            return "".join(lines[:i])
    return "".join(lines)


def _udiff(name: str, old: bytes, new: bytes) -> str:
    a = old.decode("utf-8").splitlines(keepends=True)
    b = new.decode("utf-8").splitlines(keepends=True)
    out = [f"diff --git a/{name} b/{name}\n"]
    for line in difflib.unified_diff(a, b, f"a/{name}", f"b/{name}", n=3):
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def diff(
    series: Series,
    name: str,
    out: Path = DEFAULT_WORK,
    downloads: Path = wheel.DEFAULT_DOWNLOADS,
    pins: wheel.Pins | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """Rewrite patch `name` from `out/tree`; returns the patch file."""
    index = _find(series, name)
    patch = series.patches[index]
    tree = out / "tree"
    state = (out / STATE_NAME).read_text().split() if (out / STATE_NAME).is_file() else []
    if not state or state[0] != patch.name:
        made = state[0] if state else "nothing"
        raise BuildError(f"{out} holds {made}, not {patch.name}: run `make patch-work PATCH={patch.name}` first")
    pins = pins or wheel.load_pins()
    upstream = _upstream(pins, state[1], downloads, log)
    before = series.patches[:index]
    src = {rel for rel, _ in patchset.src_files(series.src_dir)}
    with zipfile.ZipFile(upstream) as zf, tempfile.TemporaryDirectory(prefix="sgdeploy-patchwork-") as tmp:
        members = {i.filename: i for i in zf.infolist() if not i.is_dir()}
        base_root = Path(tmp)
        earlier = wheel.touched_paths(before) & members.keys()
        for n in sorted(earlier):
            wheel._extract(zf, members[n], base_root)
        wheel.apply_patches(base_root, before, log=lambda m: None)
        for path in sorted(tree.rglob("*")):
            rel = path.relative_to(tree).as_posix()
            if path.is_file() and rel not in members and rel not in src and "__pycache__" not in path.parts:
                raise BuildError(
                    f"{path} is a new file: put it in {series.src_dir}/{rel} instead of a diff"
                )
        parts = []
        for n in sorted(members):
            mine = tree / n
            new = mine.read_bytes() if mine.is_file() else None
            old = (base_root / n).read_bytes() if n in earlier else zf.read(members[n])
            if new is None:
                raise BuildError(f"{mine} is missing: a diff of the series may not delete upstream files")
            if new != old:
                parts.append(_udiff(n, old, new))
        text = _header(patch) + "".join(parts)
        check = base_root / ".check.patch"
        check.write_text(text, encoding="utf-8")
        for n in sorted(_named(parts) - earlier):  # the new diff must apply where the build applies it
            wheel._extract(zf, members[n], base_root)
        probe = Patch(name=patch.name, path=check, feature=patch.feature, line=patch.line)
        wheel.apply_patches(base_root, [probe], log=lambda m: None)
    patch.path.write_text(text, encoding="utf-8")
    added = sum(1 for ln in text.splitlines() if ln.startswith("+") and not ln.startswith("+++"))
    log(f"wrote {patch.path}: {len(parts)} file(s), {added} added line(s)")
    return patch.path


def _named(parts: Sequence[str]) -> set[str]:
    return {p.split("\n", 1)[0].rsplit(" b/", 1)[1] for p in parts}


def _say(message: str) -> None:
    print(message, file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sgdeploy.patchwork", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", choices=("work", "diff"))
    ap.add_argument("--patch", help="patch file name from the series (work: default the last; diff: required)")
    ap.add_argument("--python", default=DEFAULT_PYTHON, help="pristine wheel to start from (default %(default)s)")
    ap.add_argument("--out", type=Path, default=DEFAULT_WORK, help="scratch folder (default build/patchwork)")
    ap.add_argument("--patches-dir", type=Path, default=patchset.DEFAULT_PATCHES_DIR)
    args = ap.parse_args(argv)
    try:
        series = patchset.load(args.patches_dir)
        if args.action == "work":
            work(series, args.patch, args.python, args.out, log=_say)
        else:
            if not args.patch:
                raise UsageError("PATCH is required, e.g. make patch-diff PATCH=0002-ddtree-recurrent-state-forking")
            diff(series, args.patch, args.out, log=_say)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (BuildError, PatchSetError, OSError, UnicodeDecodeError) as exc:
        print(f"error: {exc}".splitlines()[0], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
