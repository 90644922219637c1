"""In-process SSH servers for tests (paramiko ``ServerInterface``): public-key authentication of one user
and key, ``direct-tcpip`` channels piped to the TCP address they name (what a jump host and the host at
the end of a tunnel do), nothing else. Each server records the destinations it was asked for and keeps
its transports, so a test can tell which hops a tunnel went through and that every one was closed.

    with SSHServer(user="root", key=client_key) as jump, SSHServer(user="root", key=client_key) as host:
        ... jump.port, host.port, jump.destinations, jump.open_transports() ...
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time

import paramiko

_HOST_KEY: paramiko.RSAKey | None = None


def host_key() -> paramiko.RSAKey:
    global _HOST_KEY
    if _HOST_KEY is None:
        _HOST_KEY = paramiko.RSAKey.generate(2048)
    return _HOST_KEY


class _Interface(paramiko.ServerInterface):
    def __init__(self, server: SSHServer):
        self.server = server
        self.wanted: dict[int, tuple[str, int]] = {}

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        ok = username == self.server.user and key == self.server.key
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED if kind == "direct-tcpip" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_direct_tcpip_request(self, chanid, origin, destination):
        self.wanted[chanid] = (str(destination[0]), int(destination[1]))
        self.server.destinations.append(self.wanted[chanid])
        return paramiko.OPEN_SUCCEEDED


class SSHServer:
    """One SSH server on 127.0.0.1:<free port>, serving each connection on a thread of its own."""

    def __init__(self, user: str, key: paramiko.PKey):
        self.user, self.key = user, key
        self.destinations: list[tuple[str, int]] = []
        self.transports: list[paramiko.Transport] = []
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True, name=f"ssh-stub-{self.port}")

    def __enter__(self) -> SSHServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.listener.close()
        self.thread.join(timeout=5)
        for t in self.transports:
            t.close()

    def open_transports(self, wait: float = 0) -> list[paramiko.Transport]:
        """The server's transports still active (after waiting up to ``wait`` seconds for them to end)."""
        deadline = time.monotonic() + wait
        while True:
            active = [t for t in self.transports if t.is_active()]
            if not active or time.monotonic() >= deadline:
                return active
            time.sleep(0.05)

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        transport = paramiko.Transport(sock)
        transport.add_server_key(host_key())
        self.transports.append(transport)
        iface = _Interface(self)
        try:
            transport.start_server(server=iface)
        except (paramiko.SSHException, EOFError, OSError):
            return
        while transport.is_active() and not self.stopping.is_set():
            channel = transport.accept(timeout=0.2)
            if channel is not None:
                target = iface.wanted.get(channel.get_id())
                threading.Thread(target=_pipe, args=(channel, target), daemon=True).start()


def _pipe(channel: paramiko.Channel, target: tuple[str, int] | None) -> None:
    try:
        sock = socket.create_connection(target, timeout=5) if target else None
    except OSError:
        sock = None
    if sock is None:
        channel.close()
        return
    try:
        _copy(channel, sock)
    finally:
        for end in (channel, sock):
            with contextlib.suppress(Exception):  # the client may already have gone
                end.close()


def _copy(channel: paramiko.Channel, sock: socket.socket) -> None:
    ends: set = {sock, channel}
    while ends:
        ready, _, _ = select.select(list(ends), [], [], 0.5)
        if channel.closed:
            return
        for end in ready:
            try:
                data = end.recv(65536)
            except OSError:
                return
            other = channel if end is sock else sock
            if data:
                try:
                    other.sendall(data)
                except OSError:  # the client closed the channel while this end was sending
                    return
                continue
            ends.discard(end)
            if end is sock:
                channel.shutdown_write()
            else:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_WR)
