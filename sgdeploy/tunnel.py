"""SSH to an inventory host from the controller: run a command, or forward a local port to the service.

The service binds to a host address (loopback by default, 127.0.1.N in the lab) that the controller
may not reach; the sweep benchmarks it through a tunnel instead::

    with tunnel.forward(target, remote_port=30000, remote_host="127.0.0.1") as url:
        bench.run(url, ...)            # url is http://127.0.0.1:<free local port>

Fabric (paramiko) with the inventory's ``ansible_host``, ``ansible_port``, ``ansible_user`` and
``ansible_ssh_private_key_file``, and the SSH options Ansible's ssh connection would pass from
``ansible_ssh_common_args`` and ``ansible_ssh_extra_args`` that say where and how to connect:
``-o ProxyJump=`` / ``-J`` (a chain of jump hosts), ``-o ProxyCommand=``, ``-F`` (an ssh_config file),
``-i``, ``-p``, ``-l`` and ``-o Port/User/IdentityFile/ConnectTimeout``; ``~/.ssh/config`` and
``/etc/ssh/ssh_config`` apply as they do for ``ssh`` (Fabric reads them). Other options (host key
checking, multiplexing) do not change where the session goes and are left to Fabric. Host keys are
accepted on first sight, as Ansible does with ``host_key_checking = False`` (the project's ansible.cfg).
"""

from __future__ import annotations

import contextlib
import select
import shlex
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass


class TunnelError(Exception):
    """SSH or the forward failed: one line naming the host and the reason."""


# `-o Name=value` options of ssh that change where or how the session connects (lower-cased names).
_OPTIONS = {"proxyjump": "proxy_jump", "proxycommand": "proxy_command", "port": "port", "user": "user",
            "identityfile": "key_file", "connecttimeout": "connect_timeout"}


def ssh_args(text: str) -> dict:
    """The options of an ``ansible_ssh_common_args``/``ansible_ssh_extra_args`` string that say where and
    how to connect, as Target fields (``config_file`` for ``-F``). Raises TunnelError on a string shlex
    cannot split or an option without its value."""
    try:
        words = shlex.split(text or "")
    except ValueError as err:
        raise TunnelError(f"ansible_ssh_common_args/extra_args {text!r}: {err}") from None
    out: dict = {}
    flags = {"-J": "proxy_jump", "-i": "key_file", "-p": "port", "-l": "user", "-F": "config_file"}
    i = 0
    while i < len(words):
        word = words[i]
        flag, value = word[:2], word[2:]
        if flag in flags or flag == "-o":
            if not value:
                i += 1
                if i >= len(words):
                    raise TunnelError(f"ansible_ssh_common_args/extra_args {text!r}: {word} needs a value")
                value = words[i]
            if flag != "-o":
                out[flags[flag]] = value
            else:
                name, _, opt = value.replace("=", " ", 1).partition(" ")
                if not opt.strip() and i + 1 < len(words) and "=" not in value:
                    i += 1
                    opt = words[i]
                field = _OPTIONS.get(name.strip().lower())
                if field:
                    out[field] = opt.strip()
        i += 1
    return out


@dataclass(frozen=True)
class Target:
    """How to reach one inventory host over SSH."""

    name: str
    address: str
    user: str | None = None
    port: int | None = None             # None: ssh_config's Port, else 22
    key_file: str | None = None
    proxy_jump: str | None = None       # "[user@]host[:port][,...]": jump hosts, first to last
    proxy_command: str | None = None    # as ssh's ProxyCommand (%h, %p, %r expanded by Fabric)
    config_file: str | None = None      # an ssh_config file to read instead of ~/.ssh/config
    connect_timeout: float = 30

    @classmethod
    def from_hostvars(cls, name: str, hostvars: dict) -> Target:
        args: dict = {}
        for key in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
            args |= ssh_args(str(hostvars.get(key) or ""))
        port = hostvars.get("ansible_port") or hostvars.get("ansible_ssh_port") or args.get("port")
        try:
            port, timeout = (int(port) if port else None), float(args.get("connect_timeout") or 30)
        except ValueError:
            raise TunnelError(f"{name}: ssh port {port!r} or ConnectTimeout {args.get('connect_timeout')!r} "
                              "is not a number") from None
        return cls(name=name, address=str(hostvars.get("ansible_host") or name),
                   user=hostvars.get("ansible_user") or hostvars.get("ansible_ssh_user") or args.get("user"),
                   port=port, key_file=hostvars.get("ansible_ssh_private_key_file") or args.get("key_file"),
                   proxy_jump=args.get("proxy_jump"), proxy_command=args.get("proxy_command"),
                   config_file=args.get("config_file"), connect_timeout=timeout)


def _config(target: Target):
    from fabric import Config

    if target.config_file:
        return Config(runtime_ssh_path=target.config_file)
    return Config()


def _gateway(target: Target, kwargs: dict, config):
    """Fabric's gateway for the target: a ProxyCommand string, or a chain of jump hosts as nested
    Connections (each hop reached through the one before it, as ``ssh -J a,b`` does)."""
    from fabric import Connection

    if target.proxy_command and target.proxy_command.lower() != "none":
        return target.proxy_command
    if not target.proxy_jump or target.proxy_jump.lower() == "none":
        return None
    gateway = None
    for hop in (h.strip() for h in target.proxy_jump.split(",") if h.strip()):
        gateway = Connection(hop, connect_kwargs=dict(kwargs), connect_timeout=target.connect_timeout,
                             gateway=gateway, config=config)
    return gateway


def connection(target: Target, connect_timeout: float | None = None):
    from fabric import Connection

    kwargs: dict = {"key_filename": target.key_file} if target.key_file else {}
    config = _config(target)
    gateway = _gateway(target, kwargs, config)
    extra = {"gateway": gateway} if gateway is not None else {}
    return Connection(target.address, user=target.user, port=target.port, connect_kwargs=kwargs,
                      connect_timeout=connect_timeout or target.connect_timeout, config=config, **extra)


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
                    if other is channel:
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
