"""Model weights on the host: fetch from a Hugging Face hub, finish controller copies, check space.

Runs on the host with the system python3 (standard library only), from the copy of the sgdeploy
package the deploy installs in /usr/local/lib/sgdeploy. The controller uses a few functions too
(`local_dir`, `folder_digest`, `pack`).

Layout (docs/models.md):

    /var/lib/sglang/models/<org>--<name>/<revision>     source hf
    /var/lib/sglang/models/<name>/<sha16 or version>    source controller
    <path itself>                                       source path

A finished folder holds `.sgdeploy-complete.json` (the marker): what was fetched, every file with
its size and checksum. A folder is only ever created by renaming a complete staging folder
(`<dest>.incomplete`) into place, so a folder without a marker is never used; downloads resume from
`.part` files in the staging folder with HTTP Range requests.

Commands (exit 0 success, 1 a check or transfer failed, 2 bad arguments; one line per problem):

    plan    --models-json JSON [--endpoint URL] [--min-free-gb G]   what to do; fails on missing
            models, an unreachable hub and too little disk, before anything changes
    fetch   --repo ORG/NAME --revision REV --dest DIR [--endpoint URL] [--allow-pattern P ...]
    finish  --stage DIR --dest DIR --sha SHA --name NAME    verify a copied folder, mark, rename
    pack    --src DIR --out TAR                               (controller) tar a folder once
    prune   --root DIR --keep-json JSON                       remove unused model folders

The Hugging Face token comes from the environment (HF_TOKEN), never from the command line.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import http.client
import json
import os
import pwd
import re
import shutil
import sys
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path, PurePosixPath

MODELS_ROOT = "/var/lib/sglang/models"
DEFAULT_ENDPOINT = "https://huggingface.co"
MARKER = ".sgdeploy-complete.json"
STAGE_SUFFIX = ".incomplete"
PART_SUFFIX = ".part"
CHUNK = 1 << 20
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
SOURCES = ("hf", "path", "controller")

# What a model needs: weights, configs, tokenizer, chat templates, remote code.
WEIGHT_PATTERNS = ("*.safetensors",)
FALLBACK_WEIGHT_PATTERNS = ("*.bin",)  # only when the repository has no safetensors
NEEDED_PATTERNS = ("*.json", "*.py", "*.jinja", "*.model", "*.tiktoken", "tokenizer*", "vocab.*",
                   "merges.txt", "*.txt")
SKIPPED_DIRS = ("original",)
SKIPPED_NAMES = (".gitattributes", "README.md", "LICENSE", "LICENSE.txt", "USE_POLICY.md")


class ModelError(Exception):
    """A problem to report as one line (exit 1)."""


class UsageError(ModelError):
    """Bad arguments (exit 2)."""


# --------------------------------------------------------------------------------------------------
# Names and folders


def local_dir(source: str, *, repo: str | None = None, revision: str | None = None, path: str | None = None,
              name: str | None = None, version: str | None = None, root: str = MODELS_ROOT) -> str:
    """The folder on the host the service loads from."""
    if source == "hf":
        org, _, model = (repo or "").partition("/")
        return f"{root}/{org}--{model}/{revision}"
    if source == "path":
        return str(path)
    if source == "controller":
        return f"{root}/{name}/{version}"
    raise UsageError(f"source: {source!r}: must be one of {', '.join(SOURCES)}")


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
            for chunk in iter(lambda: fh.read(CHUNK), b""):
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


def chown_tree(folder: Path, owner: str | None) -> None:
    if not owner:
        return
    try:
        pw = pwd.getpwnam(owner)
    except KeyError:
        raise ModelError(f"owner {owner!r}: no such user on this host") from None
    for dirpath, _dirnames, filenames in os.walk(folder):
        os.chown(dirpath, pw.pw_uid, pw.pw_gid)
        for fn in filenames:
            os.chown(os.path.join(dirpath, fn), pw.pw_uid, pw.pw_gid, follow_symlinks=False)


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


def ensure_dir(path: Path, owner: str | None) -> None:
    """Create `path` and its missing parents, the created ones owned by `owner`."""
    created = []
    p = path
    while not p.exists() and p.parent != p:
        created.append(p)
        p = p.parent
    path.mkdir(parents=True, exist_ok=True)
    for c in created:
        c.chmod(0o755)
        if owner:
            chown_tree_dir_only(c, owner)


def chown_tree_dir_only(path: Path, owner: str) -> None:
    try:
        pw = pwd.getpwnam(owner)
    except KeyError:
        raise ModelError(f"owner {owner!r}: no such user on this host") from None
    os.chown(path, pw.pw_uid, pw.pw_gid)


# --------------------------------------------------------------------------------------------------
# File selection


def select_files(siblings: list[dict], allow_patterns: list[str] | None = None) -> list[dict]:
    """The files a model needs from a repository's `siblings` (each with at least `rfilename`).

    With `allow_patterns`, exactly the files matching one of them (fnmatch on the path). Otherwise:
    safetensors weights (`*.bin` only when there are none), configs, tokenizer files, chat
    templates and remote code; nothing under `original/`, no README or .gitattributes.
    """
    names = [s for s in siblings if isinstance(s.get("rfilename"), str)]
    if allow_patterns:
        return [s for s in names if any(fnmatch.fnmatch(s["rfilename"], p) for p in allow_patterns)]

    def base(s: dict) -> str:
        return PurePosixPath(s["rfilename"]).name

    def kept(s: dict) -> bool:
        parts = PurePosixPath(s["rfilename"]).parts
        return not (parts[0] in SKIPPED_DIRS or any(p.startswith(".") for p in parts)
                    or base(s) in SKIPPED_NAMES)

    candidates = [s for s in names if kept(s)]
    has_safetensors = any(fnmatch.fnmatch(base(s), p) for s in candidates for p in WEIGHT_PATTERNS)
    weights = WEIGHT_PATTERNS if has_safetensors else WEIGHT_PATTERNS + FALLBACK_WEIGHT_PATTERNS
    return [s for s in candidates if any(fnmatch.fnmatch(base(s), p) for p in weights + NEEDED_PATTERNS)]


# --------------------------------------------------------------------------------------------------
# The hub


class Hub:
    """The parts of the Hugging Face hub HTTP API a fetch uses."""

    def __init__(self, endpoint: str, token: str | None = None, timeout: float = 60.0):
        self.endpoint = endpoint.rstrip("/")
        self.token = token or None
        self.timeout = timeout
        parsed = urllib.parse.urlparse(self.endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise UsageError(f"endpoint: {endpoint!r}: must be an http(s) URL such as {DEFAULT_ENDPOINT}")

    def _request(self, url: str, method: str = "GET", headers: dict | None = None) -> urllib.request.Request:
        req = urllib.request.Request(url, method=method, headers=dict(headers or {}))
        req.add_header("User-Agent", "sgdeploy-models/1")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        return req

    def _explain(self, exc: Exception, what: str) -> ModelError:
        if isinstance(exc, urllib.error.HTTPError):
            code = exc.code
            reason = exc.headers.get("X-Error-Code") or exc.reason
            if code == 401:
                hint = ("a token was sent and refused: check sglang_models_hf_token" if self.token else
                        "no token was sent: the repository is gated or private; set sglang_models_hf_token "
                        "(Ansible Vault)")
                return ModelError(f"{what}: 401 unauthorized at {self.endpoint} ({hint})")
            if code == 403:
                return ModelError(f"{what}: 403 forbidden at {self.endpoint} (accept the model's terms on the "
                                  "hub with the token's account)")
            if code == 404:
                return ModelError(f"{what}: not found at {self.endpoint} ({reason}): check the repository "
                                  "name and the revision")
            return ModelError(f"{what}: HTTP {code} {reason} from {self.endpoint}")
        reason = getattr(exc, "reason", None) or exc
        return ModelError(f"{what}: cannot reach {self.endpoint}: {reason}")

    def model_info(self, repo: str, revision: str) -> dict:
        """`GET /api/models/{repo}/revision/{rev}?blobs=true`: commit sha and siblings with sizes."""
        quoted_rev = urllib.parse.quote(revision, safe="")
        url = f"{self.endpoint}/api/models/{repo}/revision/{quoted_rev}?blobs=true"
        try:
            with urllib.request.urlopen(self._request(url), timeout=self.timeout) as resp:
                data = json.loads(resp.read().decode("utf-8"))
        except (urllib.error.URLError, OSError) as exc:
            raise self._explain(exc, f"model {repo}@{revision}") from None
        except ValueError:
            raise ModelError(f"model {repo}@{revision}: {self.endpoint} did not answer with JSON") from None
        if not isinstance(data, dict) or not isinstance(data.get("siblings"), list):
            raise ModelError(f"model {repo}@{revision}: {self.endpoint} answered without a file list (siblings)")
        return data

    def file_size(self, repo: str, commit: str, name: str) -> int:
        """Size of one file by HEAD, for hubs that do not list sizes."""
        url = self.file_url(repo, commit, name)
        try:
            with urllib.request.urlopen(self._request(url, "HEAD"), timeout=self.timeout) as resp:
                size = resp.headers.get("X-Linked-Size") or resp.headers.get("Content-Length")
        except (urllib.error.URLError, OSError) as exc:
            raise self._explain(exc, f"file {name} of {repo}@{commit}") from None
        if size is None:
            raise ModelError(f"file {name} of {repo}@{commit}: {self.endpoint} gave no size")
        return int(size)

    def file_url(self, repo: str, commit: str, name: str) -> str:
        return (f"{self.endpoint}/{repo}/resolve/{urllib.parse.quote(commit, safe='')}/"
                f"{urllib.parse.quote(name)}")

    def open_file(self, repo: str, commit: str, name: str, offset: int):
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        return urllib.request.urlopen(self._request(self.file_url(repo, commit, name), headers=headers),
                                      timeout=self.timeout)


def remote_files(hub: Hub, repo: str, revision: str, allow_patterns: list[str] | None = None) -> tuple[str, list[dict]]:
    """The commit a revision points at and the files to fetch: name, size, sha256 (LFS) or blob_id."""
    info = hub.model_info(repo, revision)
    commit = str(info.get("sha") or revision)
    chosen = select_files(info["siblings"], allow_patterns)
    if not chosen:
        names = ", ".join(s.get("rfilename", "?") for s in info["siblings"][:8]) or "(none)"
        raise ModelError(f"model {repo}@{revision}: no model files to fetch at {hub.endpoint} (files: {names}); "
                         "allow_patterns selects them")
    if not any(s["rfilename"] == "config.json" for s in chosen):
        raise ModelError(f"model {repo}@{revision}: the repository has no config.json at the top: not a model "
                         "SGLang can load")
    files = []
    for s in chosen:
        lfs = s.get("lfs") if isinstance(s.get("lfs"), dict) else {}
        size = lfs.get("size", s.get("size"))
        if size is None:
            size = hub.file_size(repo, commit, s["rfilename"])
        entry = {"name": s["rfilename"], "size": int(size)}
        if lfs.get("sha256"):
            entry["sha256"] = lfs["sha256"]
        elif s.get("blobId"):
            entry["blob_id"] = s["blobId"]
        files.append(entry)
    return commit, files


# --------------------------------------------------------------------------------------------------
# Fetch


def _hasher(entry: dict):
    if "sha256" in entry:
        return hashlib.sha256()
    if "blob_id" in entry:
        h = hashlib.sha1()  # noqa: S324 - git's blob id, a checksum, not a security boundary
        h.update(f"blob {entry['size']}\0".encode())
        return h
    return None


def _expected(entry: dict) -> str | None:
    return entry.get("sha256") or entry.get("blob_id")


def _safe_rel(name: str) -> str:
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise ModelError(f"file name {name!r} from the hub leaves the model folder: refused")
    return p.as_posix()


def download_file(hub: Hub, repo: str, commit: str, entry: dict, stage: Path, progress: dict) -> None:
    """One file into `stage`, resuming its `.part`; verified, then renamed to its name."""
    rel = _safe_rel(entry["name"])
    final = stage / rel
    part = stage / (rel + PART_SUFFIX)
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.is_file() and final.stat().st_size == entry["size"]:
        return
    size = entry["size"]
    offset = part.stat().st_size if part.is_file() else 0
    if offset > size:
        part.unlink()
        offset = 0
    h = _hasher(entry)
    if h is not None and offset:
        with part.open("rb") as fh:
            for chunk in iter(lambda: fh.read(CHUNK), b""):
                h.update(chunk)
    if offset < size or size == 0:
        try:
            resp = hub.open_file(repo, commit, rel, offset)
        except urllib.error.HTTPError as exc:
            if exc.code == 416 and offset == size:
                resp = None
            else:
                raise hub._explain(exc, f"file {rel} of {repo}@{commit}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise hub._explain(exc, f"file {rel} of {repo}@{commit}") from None
        if resp is not None:
            with resp:
                if offset and resp.status != 206:
                    # The server ignored the Range header: start this file again.
                    offset = 0
                    h = _hasher(entry)
                    if resp.status == 200:
                        progress["restarted"] += 1
                mode = "ab" if offset else "wb"
                got = offset
                with part.open(mode) as out:
                    while True:
                        try:
                            chunk = resp.read(CHUNK)
                        except (OSError, ValueError, http.client.HTTPException) as exc:
                            raise _Interrupted(f"{rel}: transfer broke at {human(got)} of {human(size)}: {exc}") \
                                from None
                        if not chunk:
                            break
                        out.write(chunk)
                        got += len(chunk)
                        progress["bytes"] += len(chunk)
                        if h is not None:
                            h.update(chunk)
                        if got > size:
                            break
    got = part.stat().st_size if part.is_file() else 0
    if got < size:
        raise _Interrupted(f"{rel}: transfer ended at {human(got)} of {human(size)}")
    if got > size:
        part.unlink()
        raise ModelError(f"file {rel} of {repo}@{commit}: the hub sent {got} bytes, the file list says {size}")
    if h is not None and h.hexdigest() != _expected(entry):
        part.unlink()
        raise ModelError(f"file {rel} of {repo}@{commit}: checksum mismatch (got {h.hexdigest()[:16]}, expected "
                         f"{_expected(entry)[:16]}); the partial file was removed")
    os.replace(part, final)
    progress["files"] += 1


class _Interrupted(ModelError):
    """A transfer that stopped early; the `.part` stays for the next attempt."""


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


def _stage_bytes(stage: Path, files: list[dict]) -> int:
    have = 0
    for f in files:
        for p in (stage / f["name"], stage / (f["name"] + PART_SUFFIX)):
            if p.is_file():
                have += min(p.stat().st_size, f["size"])
                break
    return have


def fetch(hub: Hub, repo: str, revision: str, dest: Path, allow_patterns: list[str] | None = None,
          owner: str | None = None, retries: int = 3, min_free_bytes: int = 0, log=None) -> dict:
    """Put repo@revision into `dest`. Returns {"changed", "bytes_downloaded", "files", "dest", ...}."""
    log = log or (lambda msg: None)
    if pinned_and_complete(dest, repo, revision) and not allow_patterns:
        m = read_marker(dest) or {}
        return {"changed": False, "dest": str(dest), "commit": revision, "bytes_downloaded": 0,
                "files": len(m.get("files", [])), "bytes": m.get("total_bytes", 0)}
    commit, files = remote_files(hub, repo, revision, allow_patterns)
    total = sum(f["size"] for f in files)
    if marker_matches_hf(dest, repo, revision, files):
        return {"changed": False, "dest": str(dest), "commit": commit, "bytes_downloaded": 0, "files": len(files),
                "bytes": total}
    stage = dest.with_name(dest.name + STAGE_SUFFIX)
    missing = total - _stage_bytes(stage, files)
    check_space([{"role": "model", "label": f"{repo}@{revision}", "local_dir": str(dest), "bytes": total,
                  "missing_bytes": missing}], min_free_bytes)
    ensure_dir(stage, owner)
    progress = {"bytes": 0, "files": 0, "restarted": 0}
    for entry in files:
        attempt = 0
        while True:
            try:
                download_file(hub, repo, commit, entry, stage, progress)
                break
            except _Interrupted as exc:
                attempt += 1
                if attempt > retries:
                    raise ModelError(f"model {repo}@{revision}: {exc}; the partial download is kept in {stage}: "
                                     "run again to resume") from None
                log(f"{exc}; resuming (attempt {attempt + 1} of {retries + 1})")
                time.sleep(min(2 ** attempt, 10) * 0.25)
    # Anything in the stage that is not in the file list (an older selection) does not belong.
    wanted = {_safe_rel(f["name"]) for f in files}
    for p in folder_files(stage):
        if p.relative_to(stage).as_posix() not in wanted:
            p.unlink()
    for p in stage.rglob("*" + PART_SUFFIX):
        p.unlink()
    write_marker(stage, {"source": "hf", "repo": repo, "revision": revision, "commit": commit,
                         "endpoint": hub.endpoint, "files": files, "total_bytes": total})
    install_folder(stage, dest, owner)
    return {"changed": True, "dest": str(dest), "commit": commit, "bytes_downloaded": progress["bytes"],
            "files": len(files), "bytes": total}


# --------------------------------------------------------------------------------------------------
# Plan (read-only): what each model of a deploy needs, checked before anything changes


def plan(models: list[dict], hub: Hub | None, min_free_bytes: int = 0) -> list[dict]:
    problems: list[str] = []
    out: list[dict] = []
    for m in models:
        role, source, dest = m.get("role", "model"), m.get("source"), Path(str(m.get("local_dir")))
        item = {"role": role, "source": source, "local_dir": str(dest), "bytes": 0, "missing_bytes": 0,
                "action": "none"}
        try:
            if source == "hf":
                item["label"] = f"{m['repo']}@{m['revision']}"
                if pinned_and_complete(dest, m["repo"], m["revision"]) and not m.get("allow_patterns"):
                    item["bytes"] = int((read_marker(dest) or {}).get("total_bytes", 0))
                    out.append(item)
                    continue
                if hub is None:
                    raise UsageError("an endpoint is required for source hf")
                commit, files = remote_files(hub, m["repo"], m["revision"], m.get("allow_patterns") or None)
                item["commit"] = commit
                item["bytes"] = sum(f["size"] for f in files)
                if not marker_matches_hf(dest, m["repo"], m["revision"], files):
                    stage = dest.with_name(dest.name + STAGE_SUFFIX)
                    item["missing_bytes"] = item["bytes"] - _stage_bytes(stage, files)
                    item["action"] = "fetch"
            elif source == "path":
                item["label"] = str(dest)
                if not dest.is_dir():
                    raise ModelError(f"{role} path {dest}: no such folder on this host (source: path expects the "
                                     "weights there already, e.g. on shared storage)")
                if not (dest / "config.json").is_file():
                    raise ModelError(f"{role} path {dest}: the folder has no config.json: not a model folder")
            elif source == "controller":
                item["label"] = f"{m['name']} (controller {m.get('controller_path')})"
                item["bytes"] = int(m.get("bytes") or 0)
                marker = read_marker(dest)
                if marker and marker.get("sha") != m["sha"] and m.get("version_given"):
                    raise ModelError(f"{role} {m['name']} version {m['version']} on this host has other content "
                                     f"(sha {str(marker.get('sha'))[:16]}) than the controller folder "
                                     f"(sha {m['sha'][:16]}): give the changed folder a new version")
                if not marker_matches_controller(dest, m["sha"]):
                    item["missing_bytes"] = item["bytes"]
                    item["action"] = "copy"
            else:
                raise UsageError(f"{role} source: {source!r}: must be one of {', '.join(SOURCES)}")
        except KeyError as exc:
            problems.append(f"{role}: the deploy description lacks {exc.args[0]!r}")
            continue
        except ModelError as exc:
            problems.append(str(exc))
            continue
        out.append(item)
    if problems:
        raise ModelError("; ".join(problems))
    check_space(out, min_free_bytes)
    return out


# --------------------------------------------------------------------------------------------------
# Controller copies


def pack(src: Path, out: Path) -> bool:
    """Tar `src` (its files, relative) into `out` once; False when `out` already exists."""
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


def finish(stage: Path, dest: Path, sha: str, name: str, owner: str | None, version: str | None = None) -> dict:
    """Verify a copied folder against the controller's digest, mark it complete, rename it into place."""
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


def prune(root: Path, keep: set[str]) -> list[str]:
    """Remove `<root>/<name>/<version>` folders not in `keep` (and leftovers of aborted copies)."""
    removed = []
    keep_resolved = {str(Path(k)) for k in keep}
    if not root.is_dir():
        return removed
    for name_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for version_dir in sorted(p for p in name_dir.iterdir() if p.is_dir()):
            if str(version_dir) in keep_resolved:
                continue
            if version_dir.name.endswith(STAGE_SUFFIX) and str(version_dir)[: -len(STAGE_SUFFIX)] in keep_resolved:
                continue  # a resumable download for a model still wanted
            shutil.rmtree(version_dir)
            removed.append(str(version_dir))
        if not any(name_dir.iterdir()):
            name_dir.rmdir()
    return removed


EXEC_FLAGS = ("--model-path", "--speculative-draft-model-path")


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
                args = line.removeprefix("ExecStart=").split()
                for i, a in enumerate(args[:-1]):
                    if a in EXEC_FLAGS:
                        used.add(args[i + 1].strip('"'))
    return used


# --------------------------------------------------------------------------------------------------
# Command line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        sys.stderr.write(f"python3 -m sgdeploy.models: error: {message}\n")
        sys.exit(2)


def _token() -> str | None:
    return os.environ.get("HF_TOKEN") or None


def _log(msg: str) -> None:
    sys.stderr.write(f"models: {msg}\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="python3 -m sgdeploy.models", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="check every model of a deploy; change nothing")
    p.add_argument("--models-json", required=True, help="JSON list (the deploy description's models)")
    p.add_argument("--endpoint", default=DEFAULT_ENDPOINT)
    p.add_argument("--min-free-gb", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=60.0)

    p = sub.add_parser("fetch", help="fetch a Hugging Face repository at a revision into a folder")
    p.add_argument("--repo", required=True)
    p.add_argument("--revision", required=True)
    p.add_argument("--dest", required=True, type=Path)
    p.add_argument("--endpoint", default=DEFAULT_ENDPOINT)
    p.add_argument("--allow-pattern", action="append", default=[])
    p.add_argument("--owner", default=None)
    p.add_argument("--retries", type=int, default=3)
    p.add_argument("--min-free-gb", type=float, default=0.0)
    p.add_argument("--timeout", type=float, default=60.0)

    p = sub.add_parser("finish", help="verify a copied folder, mark it complete, rename it into place")
    p.add_argument("--stage", required=True, type=Path)
    p.add_argument("--dest", required=True, type=Path)
    p.add_argument("--sha", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--version", default=None)
    p.add_argument("--owner", default=None)

    p = sub.add_parser("pack", help="(controller) tar a model folder once")
    p.add_argument("--src", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)

    p = sub.add_parser("prune", help="remove model folders that no unit, previous unit or deploy uses")
    p.add_argument("--root", type=Path, default=Path(MODELS_ROOT))
    p.add_argument("--state-dir", type=Path, default=Path("/var/lib/sglang-deploy"))
    p.add_argument("--keep-json", default="[]", help="JSON list of folders to keep besides those in use")

    args = parser.parse_args(argv)
    try:
        if args.command == "plan":
            try:
                models = json.loads(args.models_json)
            except ValueError:
                raise UsageError("--models-json: not valid JSON") from None
            if not isinstance(models, list):
                raise UsageError("--models-json: must be a JSON list of models")
            needs_hub = any(m.get("source") == "hf" for m in models if isinstance(m, dict))
            hub = Hub(args.endpoint, _token(), args.timeout) if needs_hub else None
            items = plan(models, hub, int(args.min_free_gb * 1e9))
            print(json.dumps({"models": items, "changed": False}))
        elif args.command == "fetch":
            if not REPO_RE.match(args.repo):
                raise UsageError(f"--repo: {args.repo!r}: must be ORG/NAME (letters, digits, '.', '_', '-')")
            if not REVISION_RE.match(args.revision):
                raise UsageError(f"--revision: {args.revision!r}: must be a commit hash, branch or tag "
                                 "(letters, digits, '.', '_', '-')")
            if args.retries < 0:
                raise UsageError(f"--retries: {args.retries}: must be 0 or more")
            hub = Hub(args.endpoint, _token(), args.timeout)
            result = fetch(hub, args.repo, args.revision, args.dest, args.allow_pattern or None, args.owner,
                           args.retries, int(args.min_free_gb * 1e9), log=_log)
            print(json.dumps(result))
        elif args.command == "finish":
            print(json.dumps(finish(args.stage, args.dest, args.sha, args.name, args.owner, args.version)))
        elif args.command == "pack":
            if not args.src.is_dir():
                raise UsageError(f"--src: {args.src}: no such folder")
            print(json.dumps({"changed": pack(args.src, args.out), "tar": str(args.out)}))
        elif args.command == "prune":
            keep = folders_in_use(args.state_dir) | set(json.loads(args.keep_json))
            removed = prune(args.root, keep)
            print(json.dumps({"changed": bool(removed), "removed": removed, "kept": sorted(keep)}))
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except ModelError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{args.command}: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
