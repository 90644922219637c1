"""The simulated engine over several hosts (test equipment): `--nnodes`, `--node-rank`, `--dist-init-addr`.

As SGLang: every rank joins rank 0 at `--dist-init-addr HOST:PORT`; rank 0 alone serves HTTP, and only once
every rank has joined; a rank that dies takes the engine down. Here a rank joins by opening a TCP connection
to rank 0's dist-init port and sending `rank R`; it keeps the connection open while it runs.

- Rank 0 (`Leader`): listens on the dist-init port; its health stays 503 until all `nnodes - 1` other ranks
  joined; if a joined rank's connection drops, it logs why and exits 1 at once (systemd sees the failure).
  On a clean stop it tells the ranks `bye` before it exits.
- Rank R > 0 (`follow`): no HTTP server; connects (retrying for SGLANG_SIM_JOIN_TIMEOUT_S, default 600 s),
  then waits: rank 0's `bye` exits 0, the connection dropping without it exits 1. As SGLang 0.5.23
  (`entrypoints/engine.py:Engine._launch_subprocesses`, node_rank >= 1), once joined it IGNORES SIGTERM (it only
  logs it: such a rank cannot drain alone, rank 0's ShutdownReq broadcast stops it), so under systemd's KillMode=mixed
  only rank 0's clean stop or SIGKILL (TimeoutStopSec) ends it. Before it joined, SIGTERM exits 0 (SGLang installs
  that handler only once its schedulers are ready). SIGINT exits 0.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable

Log = Callable[[str], None]


def split_addr(text: str) -> tuple[str, int]:
    """`HOST:PORT` or `[V6]:PORT` -> (host, port); ValueError when it is neither."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"--dist-init-addr {text!r}: give HOST:PORT")
    return host.strip("[]"), int(port)


def check_args(args, error: Callable[[str], None]) -> None:
    """The parser's checks of the three flags (SGLang's: a rank below nnodes, the address with nnodes > 1)."""
    if not 1 <= args.nnodes <= 64:
        error(f"argument --nnodes: invalid value {args.nnodes}: must be between 1 and 64")
    if not 0 <= args.node_rank < args.nnodes:
        error(f"argument --node-rank: invalid value {args.node_rank}: must be between 0 and --nnodes - 1")
    if args.nnodes > 1:
        if not args.dist_init_addr:
            error("--dist-init-addr is required with --nnodes above 1")
        try:
            split_addr(args.dist_init_addr)
        except ValueError as exc:
            error(str(exc))


def _exit(log: Log, code: int, msg: str) -> None:
    log(msg)
    os._exit(code)


class Leader:
    """Rank 0's side: the dist-init listener and the joined ranks' connections."""

    def __init__(self, args, log: Log):
        self.nnodes, self.log = args.nnodes, log
        host, port = split_addr(args.dist_init_addr)
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError as exc:
            self.sock.close()
            raise OSError(f"dist-init port {host}:{port} is already in use" if exc.errno == 98
                          else f"cannot listen on dist-init {host}:{port}: {exc.strerror or exc}") from None
        self.sock.listen(16)
        self.ranks: dict[int, socket.socket] = {}
        self.joined = threading.Event()
        self.closing = False
        self.lock = threading.Lock()
        log(f"dist-init: rank 0 of {self.nnodes}, listening on {host}:{port} for ranks 1..{self.nnodes - 1}")
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn, peer), daemon=True).start()

    def _one(self, conn: socket.socket, peer) -> None:
        conn.settimeout(10)
        try:
            line = conn.makefile("r").readline().strip()
        except OSError:
            conn.close()
            return
        conn.settimeout(None)
        parts = line.split()
        if len(parts) != 2 or parts[0] != "rank" or not parts[1].isdigit() or not 1 <= int(parts[1]) < self.nnodes:
            self.log(f"dist-init: refused {peer[0]}: said {line[:60]!r}, not 'rank R' with R in 1..{self.nnodes - 1}")
            conn.close()
            return
        rank = int(parts[1])
        with self.lock:
            if rank in self.ranks or self.joined.is_set() and rank not in self.ranks:
                # A rank that joins twice, or after the engine formed: SGLang's NCCL group cannot take it.
                _exit(self.log, 1, f"ERROR: dist-init: rank {rank} joined again from {peer[0]} after the engine "
                                   "formed; the process group is broken; exiting with status 1")
            self.ranks[rank] = conn
            self.log(f"dist-init: rank {rank} joined from {peer[0]} ({len(self.ranks)} of {self.nnodes - 1})")
            if len(self.ranks) == self.nnodes - 1:
                self.joined.set()
        data = b""
        try:
            while True:
                chunk = conn.recv(64)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        if not self.closing:
            _exit(self.log, 1, f"ERROR: rank {rank} left the engine (its connection from {peer[0]} closed): NCCL "
                               "watchdog: the process group is broken; exiting with status 1")

    def wait_joined(self, stop: threading.Event) -> bool:
        """Until every rank joined (True) or a stop signal came (False); logs every 20 s."""
        waited = 0.0
        while not self.joined.wait(0.5):
            if stop.is_set():
                return False
            waited += 0.5
            if waited % 20 == 0:
                self.log(f"dist-init: waiting for ranks ({len(self.ranks)} of {self.nnodes - 1} joined, "
                         f"{waited:g} s)")
        self.log(f"dist-init: all {self.nnodes} ranks joined")
        return True

    def close(self) -> None:
        """A clean stop: the ranks are told, then their connections closed."""
        self.closing = True
        with self.lock:
            for conn in self.ranks.values():
                try:
                    conn.sendall(b"bye\n")
                    conn.close()
                except OSError:
                    pass
        self.sock.close()


def follow(args, log: Log) -> int:
    """A rank above 0: join rank 0, then run until stopped or until rank 0 goes away."""
    host, port = split_addr(args.dist_init_addr)
    stop = threading.Event()
    joined = threading.Event()

    def on_term(signum, _frame):
        if signum == signal.SIGTERM and joined.is_set():
            # SGLang 0.5.23's handler on node_rank >= 1: it logs and carries on.
            log(f"SIGTERM received on node_rank {args.node_rank}; waiting for the rank-0 ShutdownReq broadcast to "
                "stop the schedulers.")
            return
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    timeout = float(os.environ.get("SGLANG_SIM_JOIN_TIMEOUT_S") or 600)
    log(f"dist-init: rank {args.node_rank} of {args.nnodes}; no HTTP server on this rank (rank 0 serves); "
        f"joining {host}:{port}")
    deadline = time.monotonic() + timeout
    conn = None
    while conn is None:
        if stop.is_set():
            log("Received SIGTERM before joining; exiting")
            return 0
        try:
            conn = socket.create_connection((host, port), timeout=2)
        except OSError as exc:
            if time.monotonic() > deadline:
                log(f"ERROR: dist-init: cannot join rank 0 at {host}:{port} within {timeout:g} s: "
                    f"{exc.strerror or exc}; exiting with status 1")
                return 1
            stop.wait(0.5)
    conn.sendall(f"rank {args.node_rank}\n".encode())
    conn.settimeout(0.5)
    joined.set()
    log(f"dist-init: joined rank 0 at {host}:{port}")
    data = b""
    while not stop.is_set():
        try:
            chunk = conn.recv(64)
        except TimeoutError:
            continue
        except OSError:
            chunk = b""
        if not chunk:
            if b"bye" in data:
                log("dist-init: rank 0 stopped cleanly; exiting")
                return 0
            log("ERROR: rank 0 went away (the dist-init connection closed): NCCL watchdog: the process group is "
                "broken; exiting with status 1")
            return 1
        data += chunk
    log("Received SIGINT: leaving the engine; exiting")
    conn.close()
    return 0
