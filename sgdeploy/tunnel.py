"""SSH to an inventory host from the controller: run a command, or forward a local port to the service.

The service binds to a host address (loopback by default, 127.0.1.N in the lab) that the controller
may not reach; the sweep benchmarks it through a tunnel instead::

    with tunnel.forward(target, remote_port=30000, remote_host="127.0.0.1") as url:
        bench.run(url, ...)            # url is http://127.0.0.1:<free local port>

Fabric (paramiko) with the inventory's ``ansible_host``, ``ansible_port``, ``ansible_user`` and
``ansible_ssh_private_key_file``. Host keys are accepted on first sight, as Ansible does with
``host_key_checking = False`` (the project's ansible.cfg).
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass


class TunnelError(Exception):
    """SSH or the forward failed: one line naming the host and the reason."""


@dataclass(frozen=True)
class Target:
    """How to reach one inventory host over SSH."""

    name: str
    address: str
    user: str | None = None
    port: int = 22
    key_file: str | None = None

    @classmethod
    def from_hostvars(cls, name: str, hostvars: dict) -> Target:
        port = hostvars.get("ansible_port") or hostvars.get("ansible_ssh_port") or 22
        return cls(name=name, address=str(hostvars.get("ansible_host") or name),
                   user=hostvars.get("ansible_user") or hostvars.get("ansible_ssh_user"),
                   port=int(port), key_file=hostvars.get("ansible_ssh_private_key_file"))


def connection(target: Target, connect_timeout: float = 30):
    from fabric import Connection

    kwargs: dict = {"key_filename": target.key_file} if target.key_file else {}
    return Connection(target.address, user=target.user, port=target.port, connect_kwargs=kwargs,
                      connect_timeout=connect_timeout)


def free_local_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(target: Target, command: str, timeout: float = 120) -> tuple[int, str, str]:
    """Run ``command`` on the host; (exit status, stdout, stderr). SSH failures raise TunnelError."""
    try:
        with connection(target) as conn:
            result = conn.run(command, hide=True, warn=True, timeout=timeout, in_stream=False)
    except Exception as err:  # paramiko and invoke raise many kinds; all mean "could not run it"
        raise TunnelError(f"ssh {target.user or ''}{'@' if target.user else ''}{target.address}: "
                          f"{type(err).__name__}: {err}") from None
    return result.exited, result.stdout, result.stderr


class _Forwarder(threading.Thread):
    """Accept local connections and pipe each through a ``direct-tcpip`` channel of the SSH transport.

    Fabric's own ``Connection.forward_local`` listens with a backlog of 1 and resets some of several
    simultaneous connections (a bench at concurrency 4 lost about one request in sixteen): this keeps
    Fabric's connection and does the forwarding with a normal backlog, one thread per connection.
    """

    def __init__(self, transport, local_port: int, remote_host: str, remote_port: int):
        super().__init__(daemon=True, name=f"tunnel-{local_port}")
        self.transport, self.remote = transport, (remote_host, remote_port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", local_port))
        self.listener.listen(64)
        self.listener.settimeout(0.2)
        self.stopping = threading.Event()
        self.pipes: list[threading.Thread] = []
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                sock, peer = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pipe = threading.Thread(target=self._pipe, args=(sock, peer), daemon=True)
            pipe.start()
            self.pipes.append(pipe)

    def _pipe(self, sock: socket.socket, peer) -> None:
        try:
            channel = self.transport.open_channel("direct-tcpip", self.remote, peer, timeout=30)
        except Exception as err:  # the remote end refused, or the transport is gone
            self.errors.append(f"{type(err).__name__}: {err}")
            sock.close()
            return
        try:
            open_ends = {sock, channel}
            while open_ends and not self.stopping.is_set():
                ready, _, _ = select.select(list(open_ends), [], [], 0.5)
                for end in ready:
                    data = end.recv(65536)
                    other = channel if end is sock else sock
                    if data:
                        other.sendall(data)
                        continue
                    open_ends.discard(end)  # one side finished sending: pass the half-close on
                    if end is sock:  # the other end is the channel
                        channel.shutdown_write()
                    else:
                        with contextlib.suppress(OSError):
                            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            channel.close()
            sock.close()

    def stop(self) -> None:
        self.stopping.set()
        self.listener.close()
        self.join(timeout=5)
        for pipe in self.pipes:
            pipe.join(timeout=5)


@contextlib.contextmanager
def forward(target: Target, remote_port: int, remote_host: str = "127.0.0.1",
            local_port: int | None = None) -> Iterator[str]:
    """Forward ``127.0.0.1:<local_port>`` (a free port by default) to ``remote_host:remote_port`` as
    seen from the host. Yields the local base URL (``http://127.0.0.1:<port>``); closes on exit."""
    local_port = local_port or free_local_port()
    conn = connection(target)
    forwarder = None
    try:
        try:
            conn.open()
            forwarder = _Forwarder(conn.transport, local_port, remote_host, remote_port)
        except Exception as err:
            raise TunnelError(f"ssh tunnel 127.0.0.1:{local_port} -> {target.address} -> "
                              f"{remote_host}:{remote_port}: {type(err).__name__}: {err}") from None
        forwarder.start()
        yield f"http://127.0.0.1:{local_port}"
    finally:
        if forwarder is not None:
            forwarder.stop()
        conn.close()
