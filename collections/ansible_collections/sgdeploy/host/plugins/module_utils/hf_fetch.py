"""Fetching a model from a Hugging Face hub (or a mirror speaking its API) onto the host.

Two halves. What to fetch (the commit a revision points at, the files with sizes and checksums)
comes from the hub's API through `Hub`, standard library only, so the plan (sgdeploy.host.sglang_model_plan)
and check mode work before anything is installed on the host. The transfer is huggingface_hub's, run by
`HubDownloader` with the Python of the hub venv that the sglang_models role installs from pinned,
hash-checked wheels (roles/sglang_models/files/hf_download.py): for each file, get_hf_file_metadata at
the resolved commit and http_get into `<dest>.incomplete/<file>.part`, resuming with an HTTP Range request
from what the `.part` holds. Then each `.part` is checked against the file list's size and checksum and
renamed to its name; then the marker, the owner and the rename of the staging folder into place. While
it runs, the fetch keeps `<dest>.progress.json` up to date (bytes and files done, elapsed), which
sgdeploy.host.sglang_model_fetch_progress reads to print progress.

The token is an argument of `Hub` (from the module's token file), sent by `Hub` only in the
Authorization header and handed to the hub venv's process on its standard input; it is never in an
argv, an environment or a file written here.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path, PurePosixPath

from ansible_collections.sgdeploy.host.plugins.module_utils.model_folders import (
    CHUNK,
    PART_SUFFIX,
    ModelError,
    UsageError,
    check_space,
    ensure_dir,
    folder_files,
    human,
    install_folder,
    marker_matches_hf,
    pinned_and_complete,
    read_marker,
    stage_bytes,
    stage_of,
    write_marker,
)

DEFAULT_ENDPOINT = "https://huggingface.co"
PROGRESS_SUFFIX = ".progress.json"
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

# What a model needs: weights, configs, tokenizer, chat templates, remote code.
WEIGHT_PATTERNS = ("*.safetensors",)
FALLBACK_WEIGHT_PATTERNS = ("*.bin",)  # only when the repository has no safetensors
NEEDED_PATTERNS = ("*.json", "*.py", "*.jinja", "*.model", "*.tiktoken", "tokenizer*", "vocab.*",
                   "merges.txt", "*.txt")
SKIPPED_DIRS = ("original",)
SKIPPED_NAMES = (".gitattributes", "README.md", "LICENSE", "LICENSE.txt", "USE_POLICY.md")


def check_names(repo: str, revision: str) -> None:
    if not REPO_RE.match(repo or ""):
        raise UsageError(f"repo: {repo!r}: must be ORG/NAME (letters, digits, '.', '_', '-')")
    if not REVISION_RE.match(revision or ""):
        raise UsageError(f"revision: {revision!r}: must be a commit hash, branch or tag (letters, digits, '.', "
                         "'_', '-')")


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

    def explain(self, exc: Exception, what: str) -> ModelError:
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
        cause = getattr(exc, "reason", None) or exc
        return ModelError(f"{what}: cannot reach {self.endpoint}: {cause}")

    def model_info(self, repo: str, revision: str) -> dict:
        """`GET /api/models/{repo}/revision/{rev}?blobs=true`: commit sha and siblings with sizes."""
        quoted_rev = urllib.parse.quote(revision, safe="")
        url = f"{self.endpoint}/api/models/{repo}/revision/{quoted_rev}?blobs=true"
        try:
            with urllib.request.urlopen(self._request(url), timeout=self.timeout) as resp:
                data = json.loads(resp.read().decode("utf-8"))
        except (urllib.error.URLError, OSError) as exc:
            raise self.explain(exc, f"model {repo}@{revision}") from None
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
            raise self.explain(exc, f"file {name} of {repo}@{commit}") from None
        if size is None:
            raise ModelError(f"file {name} of {repo}@{commit}: {self.endpoint} gave no size")
        return int(size)

    def file_url(self, repo: str, commit: str, name: str) -> str:
        return (f"{self.endpoint}/{repo}/resolve/{urllib.parse.quote(commit, safe='')}/"
                f"{urllib.parse.quote(name)}")


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
        given = s.get("lfs")
        lfs: dict = given if isinstance(given, dict) else {}
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
# Progress file


def progress_path(dest: Path) -> Path:
    return dest.with_name(dest.name + PROGRESS_SUFFIX)


class Progress:
    """What a running fetch has done, kept in `<dest>.progress.json` (written at most twice a second)."""

    def __init__(self, dest: Path | None, label: str, bytes_total: int = 0, files_total: int = 0,
                 bytes_done: int = 0):
        self.path = progress_path(dest) if dest is not None else None
        self.label = label
        self.started = time.time()
        self.bytes_total, self.files_total = bytes_total, files_total
        self.bytes_done, self.files_done = bytes_done, 0
        self.bytes = 0  # downloaded in this run
        self.restarted = 0
        self._written = 0.0

    def add(self, n: int) -> None:
        self.bytes += n
        self.bytes_done += n
        self.write()

    def file_done(self) -> None:
        self.files_done += 1
        self.write(force=True)

    def state(self, state: str = "running", message: str = "") -> dict:
        return {"pid": os.getpid(), "state": state, "label": self.label, "started": self.started,
                "updated": time.time(), "bytes_done": self.bytes_done, "bytes_total": self.bytes_total,
                "files_done": self.files_done, "files_total": self.files_total, "message": message}

    def write(self, state: str = "running", message: str = "", force: bool = False) -> None:
        if self.path is None or (not force and time.monotonic() - self._written < 0.5):
            return
        self._written = time.monotonic()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(self.path.name + f".tmp-{os.getpid()}")
            tmp.write_text(json.dumps(self.state(state, message)))
            os.replace(tmp, self.path)
        except OSError:
            pass  # progress is for people; a full disk fails the transfer itself


def read_progress(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def progress_line(p: dict, now: float | None = None) -> str:
    now = time.time() if now is None else now
    elapsed = max(0, int(now - float(p.get("started") or now)))
    return (f"{p.get('label')}: {human(p.get('bytes_done', 0))} of {human(p.get('bytes_total', 0))}, "
            f"{p.get('files_done', 0)} of {p.get('files_total', 0)} files, {elapsed} s elapsed")


# --------------------------------------------------------------------------------------------------
# Checks of what was transferred


def _hasher(entry: dict):
    if "sha256" in entry:
        return hashlib.sha256()
    if "blob_id" in entry:
        h = hashlib.sha1()  # noqa: S324 - git's blob id, a checksum, not a security boundary
        h.update(f"blob {entry['size']}\0".encode())
        return h
    return None


def _expected(entry: dict) -> str:
    """The digest `_hasher(entry)` must give; asked only of an entry it gives a hasher for."""
    expected = entry.get("sha256") or entry.get("blob_id")
    if expected is None:
        raise AssertionError(f"file {entry.get('name')}: no sha256 or blob_id to check it against")
    return expected


def safe_rel(name: str) -> str:
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise ModelError(f"file name {name!r} from the hub leaves the model folder: refused")
    return p.as_posix()


# --------------------------------------------------------------------------------------------------
# The transfer: huggingface_hub in the hub venv


HUB_ROOT = "/opt/sglang-deploy/hub"
HUB_PYTHON = HUB_ROOT + "/venv/bin/python"
HUB_SCRIPT = HUB_ROOT + "/hf_download.py"


class HubDownloader:
    """The role's hf_download.py run by the hub venv's Python: `python -I hf_download.py`, the request on stdin.

    The child's environment is built here, not inherited: no HF_TOKEN of the caller and no token file
    (the token goes on stdin), telemetry and progress bars off, a HOME and HF_HOME of its own that are
    removed afterwards, the endpoint as HF_ENDPOINT (a mirror works the same way) and HF_HUB_OFFLINE=0
    for this transfer only (the service's unit keeps HF_HUB_OFFLINE=1).
    """

    def __init__(self, hub: Hub, python: str = HUB_PYTHON, script: str = HUB_SCRIPT):
        self.hub, self.python, self.script = hub, python, script

    def check(self) -> None:
        for what, path in (("hub_python", self.python), ("hub_script", self.script)):
            if not os.path.isfile(path):
                raise ModelError(f"{what} {path}: not found on the host: the sglang_models role installs the hub "
                                 "venv (huggingface_hub) before a fetch")

    def env(self, home: str) -> dict:
        timeout = str(max(1, int(self.hub.timeout)))
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": home,
                "HF_HOME": os.path.join(home, "hf-home"), "HF_ENDPOINT": self.hub.endpoint,
                "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1", "HF_HUB_DISABLE_XET": "1", "HF_HUB_ETAG_TIMEOUT": timeout,
                "HF_HUB_DOWNLOAD_TIMEOUT": timeout}

    def run(self, request: dict, log, tick=None) -> dict:
        """One run of the script; its result. Resume events go to `log`; `tick` runs while it works."""
        request = dict(request, endpoint=self.hub.endpoint, token=self.hub.token, timeout=self.hub.timeout)
        result: dict | None = None
        with tempfile.TemporaryDirectory(prefix="sgdeploy-hub-") as home, tempfile.TemporaryFile() as out, \
                tempfile.TemporaryFile() as err:
            proc = subprocess.Popen([self.python, "-I", self.script], stdin=subprocess.PIPE, stdout=out, stderr=err,
                                    env=self.env(home), cwd=home)
            try:
                proc.stdin.write(json.dumps(request).encode())  # type: ignore[union-attr]
                proc.stdin.close()  # type: ignore[union-attr]
            except BrokenPipeError:
                pass
            seen = 0
            while True:
                done = proc.poll() is not None
                out.seek(seen)
                lines = out.read().decode("utf-8", "replace").splitlines(keepends=True)
                for line in lines:
                    if not line.endswith("\n") and not done:
                        break  # half a line: read it whole next time
                    seen += len(line.encode())
                    event = _event(line)
                    if event.get("event") == "resume":
                        log(str(event.get("message", "")))
                    elif "ok" in event:
                        result = event
                if done:
                    break
                if tick is not None:
                    tick()
                time.sleep(0.25)
            err.seek(0)
            tail = [ln.strip() for ln in err.read().decode("utf-8", "replace").splitlines() if ln.strip()]
        if result is None:
            text = " | ".join(tail[-3:]) or f"exit {proc.returncode}"
            if self.hub.token:
                text = text.replace(self.hub.token, "***")
            return {"ok": False, "kind": "other", "message": f"the hub client {self.python} gave no result: {text}"}
        return result


def _event(line: str) -> dict:
    try:
        event = json.loads(line)
    except ValueError:
        return {}
    return event if isinstance(event, dict) else {}


def _hub_error(hub: Hub, result: dict, what: str) -> ModelError:
    """An HTTP refusal reported by huggingface_hub, in the words Hub.explain uses for the plan's."""
    code, reason = result.get("status"), result.get("error_code") or result.get("message", "")
    if code == 401:
        hint = ("a token was sent and refused: check sglang_models_hf_token" if hub.token else
                "no token was sent: the repository is gated or private; set sglang_models_hf_token (Ansible Vault)")
        return ModelError(f"{what}: 401 unauthorized at {hub.endpoint} ({hint})")
    if code == 403:
        return ModelError(f"{what}: 403 forbidden at {hub.endpoint} (accept the model's terms on the hub with the "
                          "token's account)")
    if code == 404:
        return ModelError(f"{what}: not found at {hub.endpoint} ({reason}): check the repository name and the "
                          "revision")
    return ModelError(f"{what}: HTTP {code} {reason} from {hub.endpoint}")


def finish_file(entry: dict, stage: Path, what: str) -> None:
    """A transferred `.part`: its size and checksum against the file list, then renamed to its name."""
    rel = safe_rel(entry["name"])
    final, part = stage / rel, stage / (rel + PART_SUFFIX)
    if final.is_file() and final.stat().st_size == entry["size"]:
        return
    got = part.stat().st_size if part.is_file() else 0
    if got != entry["size"]:
        if got > entry["size"]:
            part.unlink()
        raise ModelError(f"{what}: file {rel}: {got} bytes after the transfer, the file list says {entry['size']}: "
                         "run again to fetch it")
    h = _hasher(entry)
    if h is not None:
        with part.open("rb") as fh:
            for chunk in iter(lambda: fh.read(CHUNK), b""):
                h.update(chunk)
        if h.hexdigest() != _expected(entry):
            part.unlink()
            raise ModelError(f"{what}: file {rel}: checksum mismatch (got {h.hexdigest()[:16]}, expected "
                             f"{_expected(entry)[:16]}); the partial file was removed: run again to fetch it")
    os.replace(part, final)


def _transfer(downloader: HubDownloader, repo: str, commit: str, stage: Path, files: list[dict],
              progress: Progress, retries: int, log) -> None:
    """The files not yet in the stage, through the hub venv; progress follows the stage's bytes."""
    todo = []
    for f in files:
        final = stage / safe_rel(f["name"])
        if not (final.is_file() and final.stat().st_size == f["size"]):
            todo.append({"name": f["name"], "size": f["size"], "etag": f.get("sha256") or f.get("blob_id")})
    start = stage_bytes(stage, files)

    def tick() -> None:
        have = stage_bytes(stage, files)
        progress.bytes = max(0, have - start)
        progress.bytes_done = have
        progress.files_done = sum(1 for f in files if (stage / safe_rel(f["name"])).is_file())
        progress.write()

    if todo:
        result = downloader.run({"repo": repo, "commit": commit, "stage": str(stage), "files": todo,
                                 "retries": retries}, log, tick)
        tick()
        if isinstance(result.get("bytes"), int):
            progress.bytes = result["bytes"]
        if not result.get("ok"):
            what = f"model {progress.label}"
            if result.get("kind") == "http":
                raise _hub_error(downloader.hub, result, f"{what}: file {result.get('file')}")
            if result.get("kind") == "connection":
                raise ModelError(f"{what}: {result.get('message')}; the partial download is kept in {stage}: "
                                 "run again to resume")
            raise ModelError(f"{what}: {result.get('message')}")
    for f in files:
        finish_file(f, stage, f"model {progress.label}")
        progress.files_done = sum(1 for g in files if (stage / safe_rel(g["name"])).is_file())
    progress.bytes_done = sum(f["size"] for f in files)


def fetch(hub: Hub, repo: str, revision: str, dest: Path, allow_patterns: list[str] | None = None,
          owner: str | None = None, retries: int = 3, min_free_bytes: int = 0, log=None,
          check_mode: bool = False, track: bool = True, downloader: HubDownloader | None = None) -> dict:
    """Put repo@revision into `dest`. Returns {"changed", "bytes_downloaded", "files", "dest", ...}.

    In check mode, asks the hub and reports what would be fetched (`bytes_to_transfer`, `file_list`)
    without writing anything. With `track`, keeps `<dest>.progress.json` while it transfers.
    """
    log = log or (lambda msg: None)
    label = f"{repo}@{revision}"
    if track and not check_mode:
        try:
            progress_path(dest).unlink()  # an earlier run's, never this one's
        except OSError:
            pass
    if pinned_and_complete(dest, repo, revision) and not allow_patterns:
        m = read_marker(dest) or {}
        return {"changed": False, "dest": str(dest), "commit": revision, "bytes_downloaded": 0,
                "bytes_to_transfer": 0, "files": len(m.get("files", [])), "bytes": m.get("total_bytes", 0),
                "file_list": m.get("files", [])}
    commit, files = remote_files(hub, repo, revision, allow_patterns)
    total = sum(f["size"] for f in files)
    result = {"dest": str(dest), "commit": commit, "files": len(files), "bytes": total, "file_list": files}
    if marker_matches_hf(dest, repo, revision, files):
        return dict(result, changed=False, bytes_downloaded=0, bytes_to_transfer=0)
    stage = stage_of(dest)
    have = stage_bytes(stage, files)
    check_space([{"role": "model", "label": label, "local_dir": str(dest), "bytes": total,
                  "missing_bytes": total - have}], min_free_bytes)
    if check_mode:
        return dict(result, changed=True, bytes_downloaded=0, bytes_to_transfer=total - have)
    downloader = downloader or HubDownloader(hub)
    downloader.check()
    progress = Progress(dest if track else None, label, total, len(files), have)
    progress.write(force=True)
    try:
        ensure_dir(stage, owner)
        _transfer(downloader, repo, commit, stage, files, progress, retries, log)
        # Anything in the stage that is not in the file list (an older selection) does not belong.
        wanted = {safe_rel(f["name"]) for f in files}
        for p in folder_files(stage):
            if p.relative_to(stage).as_posix() not in wanted:
                p.unlink()
        for p in stage.rglob("*" + PART_SUFFIX):
            p.unlink()
        write_marker(stage, {"source": "hf", "repo": repo, "revision": revision, "commit": commit,
                             "endpoint": hub.endpoint, "files": files, "total_bytes": total})
        install_folder(stage, dest, owner)
    except BaseException as exc:
        progress.write("failed", str(exc), force=True)
        raise
    progress.write("done", force=True)
    return dict(result, changed=True, bytes_downloaded=progress.bytes, bytes_to_transfer=total - have,
                elapsed=round(time.time() - progress.started, 1))


# --------------------------------------------------------------------------------------------------
# The token on the host: a root-only file for the length of a fetch


TOKEN_DIR = "/run/sgdeploy-models"


def write_token_file(token: str, directory: str = TOKEN_DIR) -> str:
    """Put `token` in a new file only root can read (mode 0600 in a 0700 folder); its path."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    fd, path = tempfile.mkstemp(prefix="hf-token-", dir=directory)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, token.encode())
    finally:
        os.close(fd)
    return path


def read_token_file(path: str, remove: bool = False) -> str | None:
    """The token in `path`, refusing a file others may read; with `remove`, the file is removed once read."""
    if not path:
        return None
    try:
        st = os.stat(path)
        if st.st_mode & 0o077 or st.st_uid != os.geteuid():
            raise UsageError(f"hf_token_file {path}: must be readable by its owner only (mode 0600)")
        with open(path, encoding="utf-8") as fh:
            token = fh.read().strip() or None
    except FileNotFoundError:
        raise UsageError(f"hf_token_file {path}: no such file") from None
    if remove:
        os.unlink(path)
    return token
