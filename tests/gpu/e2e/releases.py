"""Rebuild the release folders of the end-to-end harness from the bundle (GPU machine; run.sh calls it).

    python tests/gpu/e2e/releases.py BUNDLE ROOT     ->  ROOT/<key>/sglang/... for the base and every overlay

The base (``sglang-base.tar.xz``, the full patched wheel trimmed) is unpacked once as ``ROOT/<base key>``;
every ``overlay-<key>.tar.xz`` + ``overlay-<key>.json`` (bundle.py) becomes ``ROOT/<key>``: a copy of the
base with the overlay's files written over it and its ``removed`` files deleted.
"""

from __future__ import annotations

import json
import shutil
import sys
import tarfile
from pathlib import Path


def _extract(archive: Path, dest: Path) -> None:
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")


def assemble(bundle: Path, root: Path) -> dict[str, Path]:
    base_key = json.loads((bundle / "base.json").read_text())["key"]
    root.mkdir(parents=True, exist_ok=True)
    base = root / base_key
    if not (base / ".complete").exists():
        shutil.rmtree(base, ignore_errors=True)
        _extract(bundle / "sglang-base.tar.xz", base)
        (base / ".complete").touch()
    out = {base_key: base}
    for meta_path in sorted(bundle.glob("overlay-*.json")):
        key = meta_path.name[len("overlay-"):-len(".json")]
        meta = json.loads(meta_path.read_text())
        dest = root / key
        if not (dest / ".complete").exists():
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(base, dest, ignore=shutil.ignore_patterns(".complete"))
            for name in meta["removed"] + meta["changed"]:
                (dest / name).unlink(missing_ok=True)
            _extract(bundle / f"overlay-{key}.tar.xz", dest)
            missing = [n for n in meta["changed"] if not (dest / n).is_file()]
            if missing:
                raise SystemExit(f"overlay {key}: {len(missing)} files missing after extraction, e.g. {missing[0]}")
            (dest / ".complete").touch()
        out[key] = dest
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: releases.py BUNDLE ROOT")
    for k, p in assemble(Path(sys.argv[1]), Path(sys.argv[2])).items():
        print(k, p)
