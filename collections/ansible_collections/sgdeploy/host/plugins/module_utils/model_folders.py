"""Model folders on a host: layout, completion markers, digests, atomic installs, prune.

Standard library only: Ansible ships this file with each sgdeploy.host module call, and the
controller (sgdeploy.models, sgdeploy.render) imports it from the collections folder.

Layout (docs/models.md):

    <root>/<org>--<name>/<revision>     source hf
    <root>/<name>/<sha16 or version>    source controller
    <path itself>                       source path

A finished folder holds `.sgdeploy-complete.json` (the marker): what was put there, every file with
its size and checksum. A folder is only ever created by renaming a complete staging folder
(`<dest>.incomplete`) into place, so a folder without a marker is never used.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pwd
import re
import shutil
import time
from pathlib import Path

MODELS_ROOT = "/var/lib/sglang/models"
STATE_ROOT = "/var/lib/sglang-deploy"
MARKER = ".sgdeploy-complete.json"
STAGE_SUFFIX = ".incomplete"
PART_SUFFIX = ".part"
CHUNK = 1 << 20
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
SOURCES = ("hf", "path", "controller")
EXEC_FLAGS = ("--model-path", "--speculative-draft-model-path")


class ModelError(Exception):
    """A problem to report as one line."""


class UsageError(ModelError):
    """Bad arguments."""


def os_error_line(what: str, exc: OSError) -> str:
    """One line for a failed file operation: what was being done, the reason, the file."""
    head = f"{what}: " if what else ""
    return f"{head}{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")


def local_dir(source: str, *, repo: str | None = None, revision: str | None = None, path: str | None = None,
              name: str | None = None, version: str | None = None, root: str = MODELS_ROOT) -> str:
    """The folder on the host the service loads from."""
    root = root.rstrip("/") or "/"
    if source == "hf":
        org, _, model = (repo or "").partition("/")
        return f"{root}/{org}--{model}/{revision}"
    if source == "path":
        return str(path)
    if source == "controller":
        return f"{root}/{name}/{version}"
    raise UsageError(f"source: {source!r}: must be one of {', '.join(SOURCES)}")


def stage_of(dest: Path) -> Path:
    return dest.with_name(dest.name + STAGE_SUFFIX)


def folder_files(folder: Path) -> list[Path]:
    """Every regular file below `folder`, sorted, without the marker and leftovers of a transfer."""
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for fn in sorted(filenames):
            p = Path(dirpath) / fn
            if fn == MARKER or fn.endswith(PART_SUFFIX) or not p.is_file() or p.is_symlink():
                continue
            out.append(p)
    return sorted(out, key=lambda p: p.relative_to(folder).as_posix())


def folder_digest(folder: Path) -> tuple[str, int, list[dict]]:
    """sha256 over the folder's relative paths, sizes and file sha256s; total bytes; the file list."""
    outer = hashlib.sha256()
    files, total = [], 0
    for p in folder_files(folder):
        rel = p.relative_to(folder).as_posix()
        h = hashlib.sha256()
        with p.open("rb") as fh:
            for chunk in iter(functools.partial(fh.read, CHUNK), b""):
                h.update(chunk)
        size = p.stat().st_size
        outer.update(f"{rel}\0{size}\0{h.hexdigest()}\n".encode())
        files.append({"name": rel, "size": size, "sha256": h.hexdigest()})
        total += size
    return outer.hexdigest(), total, files


def read_marker(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def files_present(folder: Path, files: list[dict]) -> bool:
    """Every listed file exists with its size (a cheap check; checksums were verified on arrival)."""
    for f in files:
        p = folder / f["name"]
        try:
            if not p.is_file() or p.stat().st_size != f["size"]:
                return False
        except OSError:
            return False
    return True


def _identity(files: list[dict]) -> list[tuple]:
    return sorted((f["name"], f["size"], f.get("sha256") or f.get("blob_id")) for f in files)


def marker_matches_hf(folder: Path, repo: str, revision: str, files: list[dict]) -> bool:
    m = read_marker(folder)
    return bool(m and m.get("source") == "hf" and m.get("repo") == repo and m.get("revision") == revision
                and _identity(m.get("files", [])) == _identity(files) and files_present(folder, files))


def pinned_and_complete(folder: Path, repo: str, revision: str) -> bool:
    """A commit hash never moves: a complete folder for it needs no question to the hub (offline redeploys)."""
    if not COMMIT_RE.match(revision):
        return False
    m = read_marker(folder)
    return bool(m and m.get("source") == "hf" and m.get("repo") == repo and m.get("revision") == revision
                and m.get("commit") == revision and files_present(folder, m.get("files", [])))


def marker_matches_controller(folder: Path, sha: str) -> bool:
    m = read_marker(folder)
    return bool(m and m.get("source") == "controller" and m.get("sha") == sha
                and files_present(folder, m.get("files", [])))


def write_marker(folder: Path, data: dict) -> None:
    data = dict(data, completed=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    tmp = folder / (MARKER + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, folder / MARKER)


def marker_summary(folder: Path) -> str:
    """A few lines naming what a folder holds (the before/after of a module's diff)."""
    m = read_marker(folder)
    if not m:
        return f"{folder}: absent\n" if not folder.exists() else f"{folder}: no completion marker\n"
    lines = [f"{folder}: {m.get('source')} {m.get('repo') or m.get('name')} "
             f"{m.get('revision') or m.get('version') or ''}".rstrip()]
    lines += [f"  {f['name']} {f['size']}" for f in m.get("files", [])]
    return "\n".join(lines) + "\n"


def files_summary(folder: Path, what: str, files: list[dict]) -> str:
    return "\n".join([f"{folder}: {what}"] + [f"  {f['name']} {f['size']}" for f in files]) + "\n"


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def existing_ancestor(path: Path) -> Path:
    p = path
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    return p


def _owner_ids(owner: str) -> tuple[int, int]:
    try:
        pw = pwd.getpwnam(owner)
    except KeyError:
        raise ModelError(f"owner {owner!r}: no such user on this host") from None
    return pw.pw_uid, pw.pw_gid


def chown_tree(folder: Path, owner: str | None) -> None:
    if not owner:
        return
    uid, gid = _owner_ids(owner)
    for dirpath, _dirnames, filenames in os.walk(folder):
        os.chown(dirpath, uid, gid)
        for fn in filenames:
            os.chown(os.path.join(dirpath, fn), uid, gid, follow_symlinks=False)


def ensure_dir(path: Path, owner: str | None) -> None:
    """Create `path` and its missing parents, the created ones owned by `owner` (mode 0755)."""
    created = []
    p = path
    while not p.exists() and p.parent != p:
        created.append(p)
        p = p.parent
    path.mkdir(parents=True, exist_ok=True)
    ids = _owner_ids(owner) if owner else None
    for c in created:
        c.chmod(0o755)
        if ids:
            os.chown(c, *ids)


def install_folder(stage: Path, dest: Path, owner: str | None) -> None:
    """Make `stage` readable, owned by `owner`, and rename it to `dest` (replacing an older copy)."""
    for dirpath, _dirnames, filenames in os.walk(stage):
        os.chmod(dirpath, 0o755)
        for fn in filenames:
            os.chmod(os.path.join(dirpath, fn), 0o644)
    chown_tree(stage, owner)
    ensure_dir(dest.parent, owner)
    if dest.exists():
        old = dest.with_name(f"{dest.name}.old-{os.getpid()}")
        os.rename(dest, old)
        os.rename(stage, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(stage, dest)


def stage_bytes(stage: Path, files: list[dict]) -> int:
    """Bytes of `files` already in a staging folder (finished files and `.part`s)."""
    have = 0
    for f in files:
        for p in (stage / f["name"], stage / (f["name"] + PART_SUFFIX)):
            if p.is_file():
                have += min(p.stat().st_size, f["size"])
                break
    return have


def check_space(items: list[dict], min_free_bytes: int) -> None:
    """Fail, naming each model, when the bytes still to transfer do not fit on their filesystems."""
    by_fs: dict[int, dict] = {}
    for it in items:
        if it["missing_bytes"] <= 0:
            continue
        anchor = existing_ancestor(Path(it["local_dir"]))
        st = os.stat(anchor)
        fs = by_fs.setdefault(st.st_dev, {"anchor": anchor, "free": shutil.disk_usage(anchor).free, "items": []})
        fs["items"].append(it)
    problems = []
    for fs in by_fs.values():
        need = sum(it["missing_bytes"] for it in fs["items"])
        if fs["free"] - need < min_free_bytes:
            what = " and ".join(f"{it['role']} {it['label']} ({human(it['bytes'])}, {human(it['missing_bytes'])} "
                                f"to transfer)" for it in fs["items"])
            keep = f", keeping {human(min_free_bytes)} free" if min_free_bytes else ""
            problems.append(f"not enough disk for {what}: needs {human(need)}{keep}, {human(fs['free'])} free "
                            f"on the filesystem of {fs['anchor']}; nothing was changed")
    if problems:
        raise ModelError("; ".join(problems))


# --------------------------------------------------------------------------------------------------
# Controller copies


def finish(stage: Path, dest: Path, sha: str, name: str, owner: str | None, version: str | None = None,
           check_mode: bool = False) -> dict:
    """Verify a copied folder against the controller's digest, mark it complete, rename it into place."""
    if marker_matches_controller(dest, sha) and not stage.exists():
        return {"changed": False, "dest": str(dest), "bytes": int((read_marker(dest) or {}).get("total_bytes", 0))}
    if check_mode:
        return {"changed": True, "dest": str(dest), "bytes": 0, "files": 0}
    if not stage.is_dir():
        raise ModelError(f"model {name}: no staging folder {stage} to install")
    got, total, files = folder_digest(stage)
    if got != sha:
        raise ModelError(f"model {name}: the copy in {stage} does not match the controller folder (sha {got[:16]}, "
                         f"expected {sha[:16]}); it was not installed")
    write_marker(stage, {"source": "controller", "name": name, "version": version, "sha": sha, "files": files,
                         "total_bytes": total})
    install_folder(stage, dest, owner)
    return {"changed": True, "dest": str(dest), "bytes": total, "files": len(files)}


# --------------------------------------------------------------------------------------------------
# Prune


def prunable(root: Path, keep: set[str]) -> list[str]:
    """`<root>/<name>/<version>` folders not in `keep` (and leftovers of aborted transfers)."""
    out: list[str] = []
    keep_resolved = {str(Path(k)) for k in keep}
    if not root.is_dir():
        return out
    for name_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for version_dir in sorted(p for p in name_dir.iterdir() if p.is_dir()):
            if str(version_dir) in keep_resolved:
                continue
            if version_dir.name.endswith(STAGE_SUFFIX) and str(version_dir)[: -len(STAGE_SUFFIX)] in keep_resolved:
                continue  # a resumable download for a model still wanted
            out.append(str(version_dir))
    return out


def prune(root: Path, keep: set[str]) -> list[str]:
    """Remove what `prunable` names (and name folders left empty); the removed folders."""
    removed = prunable(root, keep)
    for folder in removed:
        shutil.rmtree(folder)
    for name_dir in {Path(f).parent for f in removed}:
        if name_dir.is_dir() and not any(name_dir.iterdir()):
            name_dir.rmdir()
    return removed


def folders_in_use(state_root: Path, unit_dir: Path = Path("/etc/systemd/system")) -> set[str]:
    """Model folders named by installed units, by every config's previous unit, and by a switch in progress."""
    texts = []
    for p in list(unit_dir.glob("sglang-*.service")) + list((state_root / "txn" / "units").glob("*.service")):
        try:
            texts.append(p.read_text())
        except OSError:
            pass
    for prev in state_root.glob("*/previous.json"):
        try:
            data = json.loads(prev.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("unit_text"), str):
            texts.append(data["unit_text"])
    used = set()
    for text in texts:
        for line in text.splitlines():
            if line.startswith("ExecStart="):
                args = line[len("ExecStart="):].split()
                for i, a in enumerate(args[:-1]):
                    if a in EXEC_FLAGS:
                        used.add(args[i + 1].strip('"'))
    return used
