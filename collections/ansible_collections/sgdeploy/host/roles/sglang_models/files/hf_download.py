"""Download files of a Hugging Face repository into a staging folder with huggingface_hub (host side).

Run by sgdeploy.host.sglang_model_fetch with the Python of the hub venv that the sglang_models role
installs from pinned, hash-checked wheels (hub-requirements.txt). Reads one JSON object from stdin:

    {"repo": "ORG/NAME", "commit": "<the commit the plan resolved>", "endpoint": "https://huggingface.co",
     "token": "..." or null, "stage": "<dest>.incomplete", "timeout": 60, "retries": 3,
     "files": [{"name": "config.json", "size": 1234, "etag": "<sha256 or git blob id>"}, ...]}

For each file, huggingface_hub does what it does well: `hf_hub_url` at the commit, `get_hf_file_metadata`
(the commit the hub serves it from, its ETag and size, where to download it from, the token as its
Authorization header) and `http_get`, which streams it with Range requests. The bytes go to our own
`<stage>/<file>.part`, opened for appending, so a later run resumes from what it holds; snapshot_download
and hf_hub_download are not used because their temporary file has a random name and is deleted on
failure. A transfer that breaks after huggingface_hub's own retries is resumed up to `retries` more
times. The module checks sizes and checksums and renames the `.part` files; this script only transfers.

The token comes on stdin only (never in argv or the environment) and is scrubbed from every message.
Standard output: one JSON line per event, {"event": "resume", "message": "..."}, then the result
{"ok": true, "bytes": N} or {"ok": false, "kind": "http"|"connection"|"changed"|"other", "file": NAME,
"status": <HTTP status or null>, "error_code": <X-Error-Code or null>, "bytes": N, "message": "..."}.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import urllib.parse
from pathlib import Path, PurePosixPath

PART_SUFFIX = ".part"
# http_get writes what it reads in chunks of huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE (10 MB), gathered
# by httpx: bytes read but not yet a whole chunk are lost when the stream breaks, and progress moves 10 MB at
# a time. None (httpx's iter_bytes default) writes each read from the network as it arrives: a broken
# download's `.part` holds every byte that came, and progress moves on a slow link.
NET_CHUNK = None


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


class Failed(Exception):
    def __init__(self, kind: str, message: str, status: int | None = None, error_code: str | None = None):
        super().__init__(message)
        self.kind, self.status, self.error_code = kind, status, error_code


class Job:
    def __init__(self, req: dict):
        self.req = req
        self.token = req.get("token") or None
        self.stage = Path(req["stage"])
        self.current: dict | None = None
        self.bytes = 0

    def emit(self, **event) -> None:
        line = json.dumps(event)
        if self.token:
            line = line.replace(self.token, "***")
        print(line, flush=True)

    def part(self, entry: dict) -> Path:
        p = PurePosixPath(entry["name"])
        if p.is_absolute() or ".." in p.parts or not p.parts:
            raise Failed("other", f"file name {entry['name']!r} leaves the model folder: refused")
        return self.stage / (p.as_posix() + PART_SUFFIX)

    def where(self, entry: dict) -> str:
        part = self.part(entry)
        have = part.stat().st_size if part.is_file() else 0
        return f"{entry['name']}: transfer ended at {human(have)} of {human(entry['size'])}"

    def metadata(self, entry: dict):
        """huggingface_hub's view of the file at the commit: checked against what the plan listed."""
        from huggingface_hub import get_hf_file_metadata, hf_hub_url

        url = hf_hub_url(self.req["repo"], entry["name"], revision=self.req["commit"], endpoint=self.req["endpoint"])
        meta = get_hf_file_metadata(url, token=self.token or False, timeout=self.req.get("timeout", 60),
                                    endpoint=self.req["endpoint"], library_name="sgdeploy")
        if meta.commit_hash and meta.commit_hash != self.req["commit"]:
            raise Failed("changed", f"{entry['name']}: the hub serves it from commit {meta.commit_hash}, not the "
                                    f"pinned {self.req['commit']}")
        if meta.etag and entry.get("etag") and meta.etag != entry["etag"]:
            raise Failed("changed", f"{entry['name']}: the hub's ETag {meta.etag[:16]} is not the listed "
                                    f"{entry['etag'][:16]}: the file changed on the hub since the plan")
        return url, meta

    def headers(self, url: str, location: str) -> dict:
        from huggingface_hub.utils import build_hf_headers

        headers = build_hf_headers(token=self.token or False, library_name="sgdeploy")
        if urllib.parse.urlsplit(location).netloc != urllib.parse.urlsplit(url).netloc:
            headers.pop("authorization", None)  # a signed CDN address: the token stays with the hub
        return headers

    def transfer(self, entry: dict) -> None:
        from huggingface_hub.file_download import http_get

        url, meta = self.metadata(entry)
        part = self.part(entry)
        part.parent.mkdir(parents=True, exist_ok=True)
        have = part.stat().st_size if part.is_file() else 0
        if have > entry["size"]:
            part.unlink()
            have = 0
        if have == entry["size"] and entry["size"] > 0:
            return
        with part.open("ab") as fh:
            http_get(meta.location or url, fh, resume_size=have, headers=self.headers(url, meta.location or url),
                     expected_size=entry["size"], displayed_filename=entry["name"])
        self.bytes += max(0, part.stat().st_size - have)

    def one(self, entry: dict) -> None:
        """One file, resumed up to `retries` times after a transfer that broke."""
        import httpx2
        from huggingface_hub.errors import HfHubHTTPError

        retries = int(self.req.get("retries", 3))
        attempt = 0
        self.current = entry
        while True:
            before = self.part(entry).stat().st_size if self.part(entry).is_file() else 0
            try:
                self.transfer(entry)
                return
            except HfHubHTTPError as exc:
                response = getattr(exc, "response", None)
                status = getattr(response, "status_code", None)
                code = response.headers.get("X-Error-Code") if response is not None else None
                if status is not None and status < 500 and status not in (408, 429):
                    raise Failed("http", one_line(exc), status, code) from None
                failure = f"HTTP {status}"
            except (httpx2.TransportError, OSError, TimeoutError) as exc:
                failure = one_line(exc)
            after = self.part(entry).stat().st_size if self.part(entry).is_file() else 0
            self.bytes += max(0, after - before)
            attempt += 1
            if attempt > retries:
                raise Failed("connection", f"{self.where(entry)} ({failure})")
            self.emit(event="resume", message=f"{self.where(entry)}; resuming (attempt {attempt + 1} of "
                                              f"{retries + 1})")
            time.sleep(min(2 ** attempt, 10) * 0.25)


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:400]


class ResumeLog(logging.Handler):
    """huggingface_hub's own resumes (a warning from http_get) become resume events."""

    def __init__(self, job: Job):
        super().__init__(logging.WARNING)
        self.job = job

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "resume" in msg.lower() and self.job.current is not None:
            self.job.emit(event="resume", message=f"{self.job.where(self.job.current)}; huggingface_hub "
                                                  "resuming with a Range request")


def main() -> int:
    req = json.loads(sys.stdin.read())
    job = Job(req)
    logging.getLogger("huggingface_hub").addHandler(ResumeLog(job))
    logging.getLogger("huggingface_hub").propagate = False
    os.umask(0o022)
    from huggingface_hub import constants

    constants.DOWNLOAD_CHUNK_SIZE = NET_CHUNK
    try:
        for entry in req["files"]:
            job.one(entry)
    except Failed as exc:
        job.emit(ok=False, kind=exc.kind, status=exc.status, error_code=exc.error_code, bytes=job.bytes,
                 file=(job.current or {}).get("name"), message=str(exc))
        return 1
    except Exception as exc:  # noqa: BLE001 - every failure becomes one JSON line for the module
        job.emit(ok=False, kind="other", status=None, error_code=None, bytes=job.bytes,
                 file=(job.current or {}).get("name"), message=f"{type(exc).__name__}: {one_line(exc)}")
        return 1
    job.emit(ok=True, bytes=job.bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
