"""Model weights, the controller's side: names and folders of models, and packing controller folders.

What runs on the host (hub fetch, checks, markers, installs, prune) lives in the collection's
module_utils (`collections/ansible_collections/sgdeploy/host/plugins/module_utils/`), which Ansible
ships with each sgdeploy.host.sglang_model_* module call; nothing of this package goes to a host.
The controller needs a few of the same functions (`local_dir`, `folder_digest`, `MARKER`) and
imports them from there instead of writing them twice.

    python -m sgdeploy.models pack --src DIR --out TAR     tar a controller folder once

Exit 0 success, 2 bad arguments; one line per problem (docs/models.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
from pathlib import Path

from ansible_collections.sgdeploy.host.plugins.module_utils import model_folders
from ansible_collections.sgdeploy.host.plugins.module_utils.model_folders import (  # noqa: F401
    MARKER,
    MODELS_ROOT,
    SOURCES,
    ModelError,
    UsageError,
    folder_digest,
    folder_files,
    local_dir,
)

__all__ = ["MARKER", "MODELS_ROOT", "SOURCES", "ModelError", "UsageError", "folder_digest", "folder_files",
           "local_dir", "model_folders", "pack", "main"]


def pack(src: Path, out: Path) -> bool:
    """Tar `src` (its files, relative, owned by root) into `out` once; False when `out` already exists."""
    if out.is_file():
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    with tarfile.open(tmp, "w") as tar:
        for p in folder_files(src):
            info = tar.gettarinfo(str(p), arcname=p.relative_to(src).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode = 0o644
            with p.open("rb") as fh:
                tar.addfile(info, fh)
    os.replace(tmp, out)
    return True


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        sys.stderr.write(f"python -m sgdeploy.models: error: {message}\n")
        sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python -m sgdeploy.models", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="(controller) tar a model folder once")
    p.add_argument("--src", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    if not args.src.is_dir():
        print(f"--src: {args.src}: no such folder", file=sys.stderr)
        return 2
    try:
        print(json.dumps({"changed": pack(args.src, args.out), "tar": str(args.out)}))
    except OSError as exc:
        print(f"pack: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
