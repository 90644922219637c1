"""SSH to an inventory host from the controller: run a command, or forward a local port to the service.

The service binds to a host address (loopback by default, 127.0.1.N in the lab) that the controller
may not reach; the sweep benchmarks it through a tunnel instead::

    with tunnel.forward(target, remote_port=30000, remote_host="127.0.0.1") as url:
        bench.run(url, ...)            # url is http://127.0.0.1:<free local port>

Fabric (paramiko), reaching the host the way Ansible's ssh does (issue 35): ``Target.from_hostvars`` takes
the inventory's ``ansible_host``, ``ansible_port``, ``ansible_user``, ``ansible_ssh_private_key_file`` and
the options of ``ansible_ssh_args``, ``ansible_ssh_common_args`` and ``ansible_ssh_extra_args`` (``-o
Key=Value``, ``-J``, ``-i``, ``-p``, ``-l``); ``~/.ssh/config`` (Fabric's default) fills in what they leave
unset. As with OpenSSH the first value of an option wins, in Ansible's order: ``ansible_ssh_args``, then
the port, key and user variables, then the common args, then the extra args, then ssh_config. Options that
only tune ssh's own behaviour (``StrictHostKeyChecking``, ``ControlMaster``, ``LogLevel``, ...) change
nothing here; an option the tunnel cannot honour is refused, in one line naming it and the host.

A ``ProxyJump`` (from the inventory or ssh_config) becomes a chain of Fabric ``gateway=Connection(...)``
hops, a ``ProxyCommand`` paramiko's ``ProxyCommand``. Every hop has connect, banner, auth and channel
timeouts, and the tunnel closes every connection it opened (the jump hosts' too: Fabric 3.2.3's
``Connection.close()`` leaves the gateway open) and ends every ``ProxyCommand`` process (terminate, then
wait) in its own ``finally``. Jump hosts are offered the inventory's key as well as their own (OpenSSH's
``-J`` would offer only ssh_config's). Host keys are accepted on first sight, as Ansible does with
``host_key_checking = False`` (the project's ansible.cfg).
"""

from __future__ import annotations

import contextlib
import select
import shlex
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

# Seconds for each step of each hop: the TCP connect, the server's banner, authentication, a channel open.
TIMEOUT = 30
# Seconds to wait for a closed SSH transport's thread (and the tunnel's own threads) to end.
JOIN_S = 2.0
# ProxyJump chains longer than this (through ssh_config's ProxyJump of the hops) are refused: a loop.
MAX_HOPS = 8
# ssh options that tune only ssh's own behaviour: the tunnel's connection is the same without them.
# (Host keys: accepted on first sight, as the project's ansible.cfg has Ansible do; ConnectTimeout: every
# hop has TIMEOUT, as Ansible passes its own -o ConnectTimeout before the inventory's options.)
HARMLESS_OPTIONS = frozenset(o.lower() for o in (
    "StrictHostKeyChecking", "UserKnownHostsFile", "GlobalKnownHostsFile", "CheckHostIP", "HashKnownHosts",
    "UpdateHostKeys", "VerifyHostKeyDNS", "LogLevel", "BatchMode", "ControlMaster", "ControlPath",
    "ControlPersist", "Compression", "ConnectTimeout", "ConnectionAttempts", "ServerAliveInterval",
    "ServerAliveCountMax", "TCPKeepAlive", "PasswordAuthentication", "KbdInteractiveAuthentication",
    "ChallengeResponseAuthentication", "GSSAPIAuthentication", "GSSAPIDelegateCredentials",
    "PreferredAuthentications", "PubkeyAuthentication", "IdentitiesOnly", "AddKeysToAgent", "ForwardAgent",
    "ForwardX11", "RequestTTY", "SendEnv", "SetEnv", "EscapeChar", "VisualHostKey", "NumberOfPasswordPrompts",
    "ExitOnForwardFailure", "ClearAllForwardings",
))
# ssh flags without a value that change nothing here (-C compression, -q quiet, -v verbose, -T no tty, ...).
HARMLESS_FLAGS = frozenset("CqvTtnNAaxXYkKs46")
# ssh flags with a value that the tunnel maps to an option; any other is refused.
VALUE_FLAGS = {"J": "proxyjump", "i": "identityfile", "p": "port", "l": "user"}
HOST_VARS = ("ansible_ssh_args", "ansible_ssh_common_args", "ansible_ssh_extra_args")


class TunnelError(Exception):
    """SSH or the forward failed: one line naming the host and the reason."""


class SSHSettingsError(TunnelError):
    """The inventory asks for an SSH setting the tunnel cannot honour (a usage error: nothing was opened)."""


@dataclass(frozen=True)
class Target:
    """How to reach one inventory host over SSH. ``None``: not set by the inventory (ssh_config decides)."""

    name: str
    address: str
    user: str | None = None
    port: int | None = None
    key_files: tuple[str, ...] = ()
    jump: tuple[str, ...] = ()            # ProxyJump hops, ``[user@]host[:port]``, the first one nearest
    proxy_command: str | None = None      # tokens (%h %p %r %n) already expanded
    host_name: str | None = None          # -o HostName (ssh_config is still looked up by ``address``)
    timeout: float = TIMEOUT
    no_proxy: bool = field(default=False)  # ProxyJump/ProxyCommand=none: ssh_config's proxy does not apply

    @property
    def key_file(self) -> str | None:
        return self.key_files[0] if self.key_files else None

    @classmethod
    def from_hostvars(cls, name: str, hostvars: dict) -> Target:
        """The inventory host's SSH settings, as Ansible's ssh would apply them. SSHSettingsError names an
        option the tunnel cannot honour."""
        address = str(hostvars.get("ansible_host") or hostvars.get("ansible_ssh_host") or name)
        opts: dict[str, str] = {}
        keys: list[str] = []

        def take(key: str, value: str) -> None:
            if key == "identityfile":
                keys.append(value)
            elif key not in opts:  # ssh: the first value of an option wins
                opts[key] = value

        # Ansible's ssh command line: ansible_ssh_args, then -o Port/IdentityFile/User from the variables,
        # then the common args and the extra args.
        _parse_args(name, "ansible_ssh_args", hostvars.get("ansible_ssh_args"), take)
        port = hostvars.get("ansible_port") or hostvars.get("ansible_ssh_port")
        if port:
            take("port", str(port))
        if hostvars.get("ansible_ssh_private_key_file"):
            take("identityfile", str(hostvars["ansible_ssh_private_key_file"]))
        user = hostvars.get("ansible_user") or hostvars.get("ansible_ssh_user")
        if user:
            take("user", str(user))
        for var in HOST_VARS[1:]:
            _parse_args(name, var, hostvars.get(var), take)
        return cls._from_options(name, address, opts, tuple(keys))

    @classmethod
    def _from_options(cls, name: str, address: str, opts: dict[str, str], keys: tuple[str, ...]) -> Target:
        port: int | None = None
        if "port" in opts:
            try:
                port = int(opts["port"])
            except ValueError:
                raise SSHSettingsError(f"host {name}: SSH port '{opts['port']}' is not a number") from None
        # ProxyJump and ProxyCommand exclude each other; ssh uses the one given first (opts keeps the order).
        proxy = next((k for k in opts if k in ("proxyjump", "proxycommand")), None)
        value = opts.get(proxy or "", "")
        jump: tuple[str, ...] = ()
        command = None
        if proxy == "proxyjump" and value.lower() != "none":
            jump = tuple(h.strip() for h in value.split(",") if h.strip())
            for hop in jump:
                _hop_parts(name, hop)  # refuses a malformed hop now
        elif proxy == "proxycommand" and value.lower() != "none":
            command = _expand(value, opts.get("hostname") or address, port or 22, opts.get("user"), address)
        return cls(name=name, address=address, user=opts.get("user"), port=port, key_files=keys, jump=jump,
                   proxy_command=command, host_name=opts.get("hostname"),
                   no_proxy=proxy is not None and value.lower() == "none")

    def describe(self) -> str:
        who = f"{self.user}@" if self.user else ""
        via = (f" (via ProxyJump {','.join(self.jump)})" if self.jump
               else " (via ProxyCommand)" if self.proxy_command else "")
        return f"{who}{self.address}{via}"


def _parse_args(host: str, var: str, value, take) -> None:
    """Feed the options of one ssh argument string to ``take(option, value)``, lower-case option names."""
    if not value:
        return
    try:
        words = shlex.split(str(value))
    except ValueError as err:
        raise SSHSettingsError(f"host {host}: {var}: cannot split '{value}': {err}") from None
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("-") or len(word) < 2:
            raise SSHSettingsError(f"host {host}: {var}: '{word}' is not an ssh option; the sweep's SSH tunnel "
                                   "honours -o Key=Value, -J, -i, -p and -l")
        flag, rest = word[1], word[2:]
        if flag in HARMLESS_FLAGS and all(c in HARMLESS_FLAGS for c in rest):
            i += 1
            continue
        if flag != "o" and flag not in VALUE_FLAGS:
            raise SSHSettingsError(f"host {host}: {var}: ssh option {word} cannot be honoured by the sweep's SSH "
                                   "tunnel (Fabric); it honours -o Key=Value, -J, -i, -p and -l")
        if not rest:
            i += 1
            if i == len(words):
                raise SSHSettingsError(f"host {host}: {var}: ssh option {word} has no value")
            rest = words[i]
        i += 1
        if flag != "o":
            take(VALUE_FLAGS[flag], rest)
            continue
        key, _, val = rest.partition("=") if "=" in rest.split(" ", 1)[0] else rest.partition(" ")
        key, val = key.strip().lower(), val.strip()
        if key in ("hostname", "port", "user", "identityfile", "proxyjump", "proxycommand"):
            take(key, val)
        elif key not in HARMLESS_OPTIONS:
            raise SSHSettingsError(f"host {host}: {var}: ssh option -o {rest} cannot be honoured by the sweep's SSH "
                                   "tunnel (Fabric); remove it or reach the host without it")


def _hop_parts(host: str, hop: str) -> tuple[str | None, str, int | None]:
    """``[ssh://][user@]host[:port]`` -> (user, host, port)."""
    spec = hop.removeprefix("ssh://")
    user, _, rest = spec.rpartition("@")
    port: str | None = None
    if rest.startswith("["):  # [IPv6]:port
        address, _, tail = rest[1:].partition("]")
        port = tail.removeprefix(":") or None
    else:
        address, _, port = rest.partition(":")
    if not address or (port and not port.isdigit()):
        raise SSHSettingsError(f"host {host}: ProxyJump hop '{hop}' is not [user@]host[:port]")
    return user or None, address, int(port) if port else None


def _expand(command: str, hostname: str, port: int, user: str | None, original: str) -> str:
    """ssh's ProxyCommand tokens: %h (the host name), %p, %r (the user), %n (the host as given), %%."""
    import getpass

    tokens = {"h": hostname, "p": str(port), "r": user or getpass.getuser(), "n": original, "%": "%"}
    out, i = [], 0
    while i < len(command):
        if command[i] == "%" and i + 1 < len(command) and command[i + 1] in tokens:
            out.append(tokens[command[i + 1]])
            i += 2
        else:
            out.append(command[i])
            i += 1
    return "".join(out)


def _hop_class():
    from fabric import Connection
    from paramiko.proxy import ProxyCommand

    class Hop(Connection):
        """A Fabric Connection that remembers the ProxyCommand it starts (Fabric keeps no handle on it)."""

        proxy: ProxyCommand | None = None

        def open_gateway(self):
            if isinstance(self.gateway, str):  # tokens already expanded: no second pass through SSHConfig
                self.proxy = ProxyCommand(self.gateway)
                return self.proxy
            return super().open_gateway()

    return Hop


class Route:
    """The Fabric connections to one target, the jump hosts' first; ``close`` closes every one of them."""

    def __init__(self, target: Target):
        self.target = target
        self.hops: list = []  # every Connection built, the target's last

    def _connection(self, host: str, user: str | None, port: int | None, gateway):
        kwargs: dict = {"banner_timeout": self.target.timeout, "auth_timeout": self.target.timeout,
                  "channel_timeout": self.target.timeout}
        if self.target.key_files:
            kwargs["key_filename"] = list(self.target.key_files)
        conn = _hop_class()(host, user=user, port=port, gateway=False, connect_timeout=int(self.target.timeout),
                            connect_kwargs=kwargs)
        conn.gateway = gateway
        return conn

    def _gateway_from_ssh_config(self, conn, depth: int):
        """What ssh_config says for a host that the inventory gives no proxy: ProxyJump hops (Fabric's
        gateway Connections, built here with the timeouts) or a ProxyCommand string."""
        jump = conn.ssh_config.get("proxyjump", "none")
        hops = tuple(h.strip() for h in jump.split(",") if h.strip())
        if hops and _hop_parts(self.target.name, hops[0])[1] in (conn.host, conn.original_host):
            return None  # a wildcard Host block naming the jump host itself (Fabric's own rule)
        if jump.lower() != "none":
            return self._chain(hops, depth + 1)
        command = conn.ssh_config.get("proxycommand", "none")
        return None if command.lower() == "none" else command

    def _chain(self, hops: tuple[str, ...], depth: int = 0):
        """The gateway Connection for ``hops`` (first one nearest the controller), recursively."""
        if depth + len(hops) > MAX_HOPS:
            raise SSHSettingsError(f"host {self.target.name}: more than {MAX_HOPS} ProxyJump hops "
                                   "(ssh_config's ProxyJump of a jump host loops?)")
        gateway = None
        for i, hop in enumerate(hops):
            user, host, port = _hop_parts(self.target.name, hop)
            conn = self._connection(host, user, port, gateway)
            if i == 0:
                conn.gateway = self._gateway_from_ssh_config(conn, depth + len(hops))
            self.hops.append(conn)
            gateway = conn
        return gateway

    def connection(self):
        """The target's Connection (not opened); its gateways are built and remembered."""
        t = self.target
        gateway = self._chain(t.jump) if t.jump else t.proxy_command
        conn = self._connection(t.address, t.user, t.port, gateway)
        if t.host_name:
            conn.host = t.host_name
        if gateway is None and not t.no_proxy:
            conn.gateway = self._gateway_from_ssh_config(conn, 0)
        self.hops.append(conn)
        return conn

    def open(self):
        conn = self.connection()
        conn.open()
        return conn

    def close(self) -> None:
        """Close every connection (the target's first, then its jump hosts'), join their transport threads,
        and end every ProxyCommand process: whatever Fabric's ``Connection.close()`` leaves open."""
        for conn in reversed(self.hops):
            transport = conn.client.get_transport()
            with contextlib.suppress(Exception):
                conn.close()
            with contextlib.suppress(Exception):
                conn.client.close()  # also a transport that never finished connecting
            if transport is not None:
                with contextlib.suppress(Exception):
                    transport.close()
                if transport.is_alive():  # closed: its thread ends within its 0.1 s socket polls
                    transport.join(timeout=JOIN_S)
            if conn.proxy is not None:
                _end(conn.proxy.process)
        self.hops.clear()


def _end(process: subprocess.Popen) -> None:
    """Terminate a ProxyCommand process and wait for it (no zombie), killing it if it lingers."""
    if process.poll() is None:
        with contextlib.suppress(OSError):
            process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
    for pipe in (process.stdin, process.stdout, process.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


def free_local_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(target: Target, command: str, timeout: float = 120) -> tuple[int, str, str]:
    """Run ``command`` on the host; (exit status, stdout, stderr). SSH failures raise TunnelError."""
    route = Route(target)
    try:
        conn = route.open()
        result = conn.run(command, hide=True, warn=True, timeout=timeout, in_stream=False)
    except TunnelError:
        raise
    except Exception as err:  # paramiko and invoke raise many kinds; all mean "could not run it"
        raise TunnelError(f"ssh {target.describe()}: {type(err).__name__}: {err}") from None
    finally:
        route.close()
    return result.exited, result.stdout, result.stderr


class _Forwarder(threading.Thread):
    """Accept local connections and pipe each through a ``direct-tcpip`` channel of the SSH transport.

    Fabric's own ``Connection.forward_local`` listens with a backlog of 1 and resets some of several
    simultaneous connections (a bench at concurrency 4 lost about one request in sixteen): this keeps
    Fabric's connection and does the forwarding with a normal backlog, one thread per connection.
    ``stop`` closes the listening socket and every connection's socket and channel first, so a pipe blocked
    on either end returns at once, then joins the threads within one short deadline.
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
        self.lock = threading.Lock()
        self.pipes: list[threading.Thread] = []
        self.open: set = set()  # the sockets and channels of the connections being piped
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
            with self.lock:
                self.pipes = [p for p in self.pipes if p.is_alive()]
                self.pipes.append(pipe)
            pipe.start()

    def _track(self, end) -> bool:
        """Note an open end of a connection, for ``stop`` to close; False (and it is closed) when stopping."""
        with self.lock:
            if not self.stopping.is_set():
                self.open.add(end)
                return True
        _close(end)
        return False

    def _pipe(self, sock: socket.socket, peer) -> None:
        if not self._track(sock):
            return
        channel = None
        try:
            try:
                channel = self.transport.open_channel("direct-tcpip", self.remote, peer, timeout=30)
            except Exception as err:  # the remote end refused, or the transport is gone
                self.errors.append(f"{type(err).__name__}: {err}")
                return
            if not self._track(channel):
                return
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
        except (OSError, EOFError, ValueError):  # an end closed under it (by ``stop``, or the transport went)
            pass
        finally:
            for end in (channel, sock):
                if end is not None:
                    with self.lock:
                        self.open.discard(end)
                    _close(end)

    def stop(self, wait: float = JOIN_S) -> None:
        """Stop accepting, close every connection's socket and channel, then join the threads: ``wait``
        seconds for all of them together (they are daemons: one that does not end in time does not hold the
        exit)."""
        with self.lock:
            self.stopping.set()
            ends, pipes = list(self.open), list(self.pipes)
            self.open.clear()
        _close(self.listener)
        for end in ends:
            _close(end)
        deadline = time.monotonic() + wait
        for thread in (self, *pipes):
            with contextlib.suppress(RuntimeError):  # never started
                thread.join(timeout=max(0.0, deadline - time.monotonic()))


def _close(end) -> None:
    """Close a socket (shut down first: a thread blocked reading or writing it returns) or a channel."""
    if isinstance(end, socket.socket):
        with contextlib.suppress(OSError):
            end.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(Exception):  # paramiko may raise anything on a transport already gone
        end.close()


@contextlib.contextmanager
def forward(target: Target, remote_port: int, remote_host: str = "127.0.0.1",
            local_port: int | None = None) -> Iterator[str]:
    """Forward ``127.0.0.1:<local_port>`` (a free port by default) to ``remote_host:remote_port`` as
    seen from the host. Yields the local base URL (``http://127.0.0.1:<port>``); closes every connection
    it opened (the jump hosts' too) on exit."""
    local_port = local_port or free_local_port()
    route = Route(target)
    forwarder = None
    try:
        try:
            conn = route.open()
            forwarder = _Forwarder(conn.transport, local_port, remote_host, remote_port)
        except TunnelError:
            raise
        except Exception as err:
            raise TunnelError(f"ssh tunnel 127.0.0.1:{local_port} -> {target.describe()} -> "
                              f"{remote_host}:{remote_port}: {type(err).__name__}: {err}") from None
        forwarder.start()
        yield f"http://127.0.0.1:{local_port}"
    finally:
        if forwarder is not None:
            forwarder.stop()
        route.close()
