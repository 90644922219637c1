"""A stand-in for the Hugging Face hub on loopback (test equipment, standard library only).

Serves the parts of the hub's HTTP API that the sgdeploy.host model modules use
(collections/ansible_collections/sgdeploy/host/plugins/module_utils/hf_fetch.py), and what
huggingface_hub's hf_hub_download/snapshot_download ask (tree listing, X-Repo-Commit, ETag), so a
client built on huggingface_hub (issue 35) can be tested against it:

    GET  /api/models/{org}/{name}/revision/{rev}[?blobs=true]   {"id", "sha", "siblings": [...]}
    GET  /api/models/{org}/{name}/tree/{rev}[?recursive=...]    [{"type": "file", "path", "size", "oid", "lfs"}]
    GET  /{org}/{name}/resolve/{rev}/{file}                     the file, with Range (206) support
    HEAD /{org}/{name}/resolve/{rev}/{file}                     its size (Content-Length, X-Linked-Size),
                                                                X-Repo-Commit, ETag

`rev` is a branch name the repository was registered with, or its commit sha. Sizes appear in
`siblings` only with `?blobs=true` (as on the hub), with `lfs.sha256` for weights and `blobId` (git's
blob sha1) for the others; a file's ETag is its sha256 for weights (LFS) and its blob id for the
others, as on the hub. The stand-in speaks plain HTTP only, no Xet (it sends no X-Xet-Hash), so
huggingface_hub downloads over HTTP with Range resumes even with hf_xet installed. With a token set,
every request without `Authorization: Bearer <token>` gets 401. Errors carry `X-Error-Code`
(RepoNotFound, RevisionNotFound, EntryNotFound) like the hub.

Switches for tests: `cut_after` (bytes of one file body, after which the connection is closed once:
a download cut midway), `down_after_cut` (after that cut, `down` is set: every request is answered by
closing the connection, a hub gone away, until a test clears `down`, or, with `down_for_requests` N, for the
next N requests only), `fake_sizes` (a size to
report for a file instead of its real one: a model too large for the disk), `rate` (bytes per second
of file bodies: a slow link, for progress lines). Counters: `bytes_served` (file bodies only),
`requests` (method, path, Range header).

    python tests/lab/hub_standin.py serve --bind 127.0.0.1 --port 0 [--token T] [--synthesize]

`--synthesize` answers for any ORG/NAME at any revision with a tiny model made up on the fly
(`tiny_model_files`), hybrid (Qwen3.6-like `layer_types`) when the name looks like Qwen3.5/3.6/Next.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import struct
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HYBRID_NAME_RE = re.compile(r"qwen3[._-]?(5|6)|qwen3[._-]?next", re.IGNORECASE)


# --------------------------------------------------------------------------------------------------
# Tiny model folders


def safetensors_bytes(n_floats: int, name: str = "model.embed_tokens.weight") -> bytes:
    """A valid safetensors file with one F32 tensor of `n_floats` values."""
    header = {name: {"dtype": "F32", "shape": [n_floats], "data_offsets": [0, 4 * n_floats]},
              "__metadata__": {"format": "pt"}}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    data = b"".join(struct.pack("<f", (i % 251) / 251.0) for i in range(n_floats))
    return struct.pack("<Q", len(raw)) + raw + data


def qwen36_like_config(hybrid: bool = True, layers: int = 8) -> dict:
    """A config.json shaped like Qwen3.6's: a text config whose layer_types mix linear and full attention."""
    if hybrid:
        types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    else:
        types = ["full_attention"] * layers
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "tiny_lab_model",
        "text_config": {
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": layers,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
            "layer_types": types, "max_position_embeddings": 4096,
        },
        "torch_dtype": "bfloat16",
    }


def tiny_model_files(hybrid: bool = True, weight_floats: int = 64 * 1024, extras: bool = True) -> dict[str, bytes]:
    """The files of a tiny model: config, weights, tokenizer; with `extras`, files a fetch must skip."""
    files = {
        "config.json": json.dumps(qwen36_like_config(hybrid), indent=2).encode(),
        "generation_config.json": json.dumps({"temperature": 0.7, "top_p": 0.8}).encode(),
        "model.safetensors": safetensors_bytes(weight_floats),
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}}}).encode(),
        "tokenizer_config.json": json.dumps({"tokenizer_class": "Qwen2Tokenizer", "model_max_length": 4096}).encode(),
        "vocab.json": json.dumps({"a": 0, "b": 1}).encode(),
        "merges.txt": b"#version: 0.2\na b\n",
        "chat_template.jinja": b"{% for m in messages %}{{ m.content }}{% endfor %}",
    }
    if extras:
        files.update({
            ".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n",
            "README.md": b"# tiny lab model\n",
            "pytorch_model.bin": b"\0" * 4096,            # skipped: safetensors exist
            "original/consolidated.00.pth": b"\0" * 4096,  # skipped: original/
            "modeling_tiny.py": b"# remote code\n",          # kept: *.py
        })
    return files


def write_model(folder, files: dict[str, bytes]) -> None:
    from pathlib import Path

    folder = Path(folder)
    for name, data in files.items():
        p = folder / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


# --------------------------------------------------------------------------------------------------
# The server


def is_lfs(name: str) -> bool:
    """Whether the hub keeps `name` in LFS (weights): its sha256 is listed and is its ETag."""
    return name.endswith((".safetensors", ".bin", ".pth"))


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324 - git's id


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str
    branches: tuple[str, ...] = ("main",)
    fake_sizes: dict[str, int] = field(default_factory=dict)


class HubStandin:
    """The stand-in hub, run in a thread of the test process."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, token: str | None = None, synthesize: bool = False):
        self.token = token
        self.synthesize = synthesize
        self.repos: dict[str, list[Repo]] = {}
        self.cut_after: int | None = None
        self.down_after_cut = False
        self.down = False
        self.down_for_requests: int | None = None  # after the cut: back once this many requests were refused
        self.rate: float | None = None  # bytes per second of file bodies (a slow link), None: unlimited
        self.bytes_served = 0
        self.requests: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()
        standin = self

        class Handler(_Handler):
            hub = standin

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def add_repo(self, repo: str, files: dict[str, bytes], commit: str | None = None,
                 branches: tuple[str, ...] = ("main",), fake_sizes: dict[str, int] | None = None) -> Repo:
        if commit is None:
            h = hashlib.sha1()  # noqa: S324 - a made-up commit id
            for name in sorted(files):
                h.update(name.encode() + b"\0" + files[name])
            commit = h.hexdigest()
        r = Repo(dict(files), commit, tuple(branches), dict(fake_sizes or {}))
        self.repos.setdefault(repo, []).insert(0, r)  # a newer commit's branches win
        return r

    def find(self, repo: str, rev: str) -> Repo | None | str:
        """The Repo for repo@rev; 'no-repo' or 'no-revision' when there is none."""
        if repo not in self.repos:
            if self.synthesize and re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
                name = repo.split("/", 1)[1]
                files = tiny_model_files(hybrid=bool(HYBRID_NAME_RE.search(name)), weight_floats=1024, extras=False)
                self.add_repo(repo, files, branches=(rev,))
            else:
                return "no-repo"
        for r in self.repos[repo]:
            if rev == r.commit or rev in r.branches:
                return r
        if self.synthesize:
            first = self.repos[repo][-1]
            return self.add_repo(repo, first.files, branches=(rev,))
        return "no-revision"

    def reset_counters(self) -> None:
        with self.lock:
            self.bytes_served = 0
            self.requests.clear()

    def start(self) -> HubStandin:
        self.thread = threading.Thread(target=self.server.serve_forever, name="hub-standin", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> HubStandin:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    hub: HubStandin
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # quiet
        pass

    def _error(self, code: int, message: str, error_code: str | None = None) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if error_code:
            self.send_header("X-Error-Code", error_code)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _authorized(self) -> bool:
        if not self.hub.token:
            return True
        return self.headers.get("Authorization") == f"Bearer {self.hub.token}"

    def do_HEAD(self):  # noqa: N802
        self.do_GET()

    def do_GET(self):  # noqa: N802
        parsed = urllib.parse.urlparse(self.path)
        path = urllib.parse.unquote(parsed.path)
        with self.hub.lock:
            self.hub.requests.append((self.command, path, self.headers.get("Range")))
        if self.hub.down:
            with self.hub.lock:
                if self.hub.down_for_requests is not None:
                    self.hub.down_for_requests -= 1
                    if self.hub.down_for_requests <= 0:
                        self.hub.down, self.hub.down_for_requests = False, None
            self.close_connection = True
            return
        if not self._authorized():
            return self._error(401, "Invalid credentials in Authorization header", "GatedRepo")
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path)
        if m:
            return self._info(m.group(1), m.group(2), "blobs=true" in (parsed.query or ""))
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?", path)
        if m:
            return self._tree(m.group(1), m.group(2), (m.group(3) or "").lstrip("/"))
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            return self._file(m.group(1), m.group(2), m.group(3))
        return self._error(404, "not found")

    def _repo(self, repo: str, rev: str) -> Repo | None:
        r = self.hub.find(repo, rev)
        if r == "no-repo":
            self._error(404, f"Repository not found: {repo}", "RepoNotFound")
            return None
        if r == "no-revision":
            self._error(404, f"Revision not found: {rev}", "RevisionNotFound")
            return None
        return r

    def _info(self, repo: str, rev: str, blobs: bool) -> None:
        r = self._repo(repo, rev)
        if r is None:
            return
        siblings = []
        for name, data in sorted(r.files.items()):
            s: dict = {"rfilename": name}
            if blobs:
                size = r.fake_sizes.get(name, len(data))
                s["size"] = size
                s["blobId"] = git_blob_id(data)
                if is_lfs(name):
                    s["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": size, "pointerSize": 134}
            siblings.append(s)
        body = json.dumps({"id": repo, "modelId": repo, "sha": r.commit, "private": bool(self.hub.token),
                           "siblings": siblings}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _tree(self, repo: str, rev: str, under: str) -> None:
        r = self._repo(repo, rev)
        if r is None:
            return
        entries = []
        for name, data in sorted(r.files.items()):
            if under and not name.startswith(under.rstrip("/") + "/"):
                continue
            size = r.fake_sizes.get(name, len(data))
            e: dict = {"type": "file", "path": name, "size": size, "oid": git_blob_id(data)}
            if is_lfs(name):
                e["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": size, "pointerSize": 134}
            entries.append(e)
        body = json.dumps(entries).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _file(self, repo: str, rev: str, name: str) -> None:
        r = self._repo(repo, rev)
        if r is None:
            return
        if name not in r.files:
            return self._error(404, f"Entry not found: {name}", "EntryNotFound")
        data = r.files[name]
        size = len(data)
        start, end = 0, size - 1
        rng = self.headers.get("Range")
        status = 200
        if rng:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if not m:
                return self._error(416, f"bad range {rng}")
            start = int(m.group(1))
            end = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        body = data[start:end + 1]
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Linked-Size", str(r.fake_sizes.get(name, size)))
        self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest() if is_lfs(name) else git_blob_id(data)}"')
        self.send_header("X-Repo-Commit", r.commit)
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if self.command == "HEAD":
            return
        cut = None
        with self.hub.lock:
            if self.hub.cut_after is not None and len(body) > self.hub.cut_after:
                cut, self.hub.cut_after = self.hub.cut_after, None  # one cut only
        if cut is not None:
            self.wfile.write(body[:cut])
            self.wfile.flush()
            with self.hub.lock:
                self.hub.bytes_served += cut
                self.hub.down = self.hub.down_after_cut
            self.close_connection = True
            try:
                self.connection.shutdown(2)
            except OSError:
                pass
            return
        if self.hub.rate:
            step = max(1, int(self.hub.rate / 20))  # 20 writes a second
            for i in range(0, len(body), step):
                self.wfile.write(body[i:i + step])
                self.wfile.flush()
                with self.hub.lock:
                    self.hub.bytes_served += len(body[i:i + step])
                time.sleep(step / self.hub.rate)
            return
        self.wfile.write(body)
        with self.hub.lock:
            self.hub.bytes_served += len(body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("serve")
    p.add_argument("--bind", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--token", default=None)
    p.add_argument("--synthesize", action="store_true")
    args = parser.parse_args(argv)
    if not args.bind.startswith("127."):
        print(f"--bind: {args.bind!r}: the stand-in serves loopback only (127.0.0.0/8)", file=sys.stderr)
        return 2
    hub = HubStandin(args.bind, args.port, args.token, args.synthesize)
    print(hub.url, flush=True)
    try:
        hub.server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
