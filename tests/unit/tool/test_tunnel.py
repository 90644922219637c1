"""The tunnel reaches a host the way Ansible's ssh does (issue 35): the inventory's SSH settings (ProxyJump,
ProxyCommand, -i/-p/-l, -o Key=Value) and ~/.ssh/config, and it closes every connection and process it
opened, the jump host's too (Fabric 3.2.3's ``Connection.close()`` leaves the gateway open; an earlier
attempt at this hung CI on it).

The SSH servers are in-process (tests/unit/ssh_stub.py). Every test that opens a tunnel runs it on a thread
with a deadline, so a tunnel that hangs fails the test in seconds instead of hanging the run.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import socket
import sys
import threading
import time
import urllib.request
from pathlib import Path

import paramiko
import pytest
from ssh_stub import SSHServer

from sgdeploy import tunnel

DEADLINE = 30  # seconds for one tunnel's whole life in these tests; they take about one


@pytest.fixture(scope="module")
def client_key(tmp_path_factory) -> tuple[paramiko.RSAKey, str]:
    key = paramiko.RSAKey.generate(2048)
    path = tmp_path_factory.mktemp("key") / "id_rsa"
    key.write_private_key_file(str(path))
    return key, str(path)


@pytest.fixture(autouse=True)
def no_user_ssh(tmp_path, monkeypatch):
    """No ~/.ssh/config, keys or agent of the user running the tests."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


@pytest.fixture
def web():
    """An HTTP server on 127.0.0.1 that answers every GET with its path: what the tunnel forwards to."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            body = f"reached {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def within(seconds: float, fn):
    """fn() on a thread; fails the test if it has not returned after ``seconds`` (a hang fails fast)."""
    box: dict = {}

    def call():
        try:
            box["value"] = fn()
        except BaseException as err:  # handed to the test's thread
            box["error"] = err

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s: the tunnel hangs"
    if "error" in box:
        raise box["error"]
    return box.get("value")


def client_transports() -> list[paramiko.Transport]:
    """The controller side's SSH transports still alive (the stub servers' are server_mode)."""
    return [t for t in threading.enumerate()
            if isinstance(t, paramiko.Transport) and not t.server_mode and t.is_alive()]


def children_running(word: str) -> list[int]:
    """This process's children whose command line contains ``word`` (zombies included)."""
    pids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread or a child that ended meanwhile
            for pid in (task / "children").read_text().split():
                if word.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    pids.append(int(pid))
    return pids


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


# --------------------------------------------------------------------------------------------------
# Through a jump host: forwards, and closes the jump host's connection too


def test_a_tunnel_through_a_proxyjump_forwards_and_closes_the_jump_connection(client_key, web):
    key, key_file = client_key
    with SSHServer("jumper", key) as jump, SSHServer("deployer", key) as host:
        target = tunnel.Target.from_hostvars("gpu-01", {
            "ansible_host": "127.0.0.1", "ansible_port": host.port, "ansible_user": "deployer",
            "ansible_ssh_private_key_file": key_file,
            "ansible_ssh_common_args": f"-o StrictHostKeyChecking=no -o ProxyJump=jumper@127.0.0.1:{jump.port}"})
        assert target.jump == (f"jumper@127.0.0.1:{jump.port}",)

        def use():
            with tunnel.forward(target, remote_port=web, remote_host="127.0.0.1") as url:
                return fetch(url + "/health"), len(jump.open_transports()), len(host.open_transports())

        body, jump_open, host_open = within(DEADLINE, use)
        assert body == "reached /health"
        assert (jump_open, host_open) == (1, 1)
        # the jump host was asked for the host's sshd, the host for the service: the route went through both
        assert jump.destinations == [("127.0.0.1", host.port)]
        assert host.destinations == [("127.0.0.1", web)]
        # closed: the jump host's connection as well as the host's, and no SSH thread left on this side
        assert host.open_transports(wait=5) == []
        assert jump.open_transports(wait=5) == []
        assert client_transports() == []


def test_a_chain_of_two_jump_hosts(client_key, web):
    key, key_file = client_key
    with SSHServer("root", key) as outer, SSHServer("root", key) as inner, SSHServer("root", key) as host:
        target = tunnel.Target.from_hostvars("gpu-01", {
            "ansible_host": "127.0.0.1", "ansible_port": host.port, "ansible_user": "root",
            "ansible_ssh_private_key_file": key_file,
            "ansible_ssh_extra_args": f"-J root@127.0.0.1:{outer.port},root@127.0.0.1:{inner.port}"})

        def use():
            with tunnel.forward(target, remote_port=web) as url:
                return fetch(url + "/x")

        assert within(DEADLINE, use) == "reached /x"
        assert outer.destinations == [("127.0.0.1", inner.port)]
        assert inner.destinations == [("127.0.0.1", host.port)]
        assert [s.open_transports(wait=5) for s in (outer, inner, host)] == [[], [], []]
        assert client_transports() == []


def test_when_the_host_refuses_the_key_the_jump_connection_is_closed_all_the_same(client_key, web):
    key, key_file = client_key
    with SSHServer("root", key) as jump, SSHServer("root", paramiko.RSAKey.generate(1024)) as host:
        target = tunnel.Target.from_hostvars("gpu-01", {
            "ansible_host": "127.0.0.1", "ansible_port": host.port, "ansible_user": "root",
            "ansible_ssh_private_key_file": key_file,
            "ansible_ssh_common_args": f"-o ProxyJump=root@127.0.0.1:{jump.port}"})

        def use():
            with tunnel.forward(target, remote_port=web):
                pass

        with pytest.raises(tunnel.TunnelError) as err:
            within(DEADLINE, use)
        message = str(err.value)  # (paramiko's reason for a refused key file varies with the key's type)
        assert message.startswith("ssh tunnel 127.0.0.1:") and "\n" not in message
        assert f"-> root@127.0.0.1 (via ProxyJump root@127.0.0.1:{jump.port}) -> 127.0.0.1:{web}: " in message
        assert jump.open_transports(wait=5) == [] and host.open_transports(wait=5) == []
        assert client_transports() == []


RELAY = ("import os,socket,sys,threading;s=socket.create_connection((sys.argv[1],int(sys.argv[2])))\n"
         "def up():\n while (d:=os.read(0,65536)): s.sendall(d)\n s.shutdown(socket.SHUT_WR)\n"
         "threading.Thread(target=up,daemon=True).start()\n"
         "while (d:=s.recv(65536)): sys.stdout.buffer.write(d); sys.stdout.buffer.flush()\n")


def test_a_proxycommand_from_ssh_config_is_ended_and_reaped(client_key, web, tmp_path):
    """ssh_config (Fabric's default) applies where the inventory sets nothing; its ProxyCommand process is
    terminated and waited for when the tunnel closes (paramiko's close() only signals it: a zombie)."""
    key, key_file = client_key
    relay = tmp_path / "relay-tunnel-test.py"
    relay.write_text(RELAY)
    (tmp_path / ".ssh").mkdir()
    with SSHServer("ops", key) as host:
        (tmp_path / ".ssh" / "config").write_text(
            f"Host gpu-alias\n  HostName 127.0.0.1\n  Port {host.port}\n  User ops\n"
            f"  ProxyCommand {sys.executable} {relay} %h %p\n")
        target = tunnel.Target.from_hostvars("gpu-01", {"ansible_host": "gpu-alias",
                                                        "ansible_ssh_private_key_file": key_file})

        def use():
            with tunnel.forward(target, remote_port=web) as url:
                return fetch(url + "/p"), children_running(relay.name)

        body, during = within(DEADLINE, use)
        assert body == "reached /p" and len(during) == 1
        assert children_running(relay.name) == []
        assert host.open_transports(wait=5) == [] and client_transports() == []


@pytest.fixture
def flood():
    """A TCP server on 127.0.0.1 that sends without end to whoever connects (a stream the client stopped
    reading), and one that accepts and stays silent: what keeps a tunnel's connections open at Ctrl-C."""
    listeners, stop = [], threading.Event()

    def serve(listener, talk: bool):
        conns = []
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conns.append(conn)
            if talk:
                threading.Thread(target=lambda c=conn: _send_until_closed(c, stop), daemon=True).start()

    ports = {}
    for name, talk in (("flood", True), ("silent", False)):
        listener = socket.create_server(("127.0.0.1", 0))
        listeners.append(listener)
        threading.Thread(target=serve, args=(listener, talk), daemon=True).start()
        ports[name] = listener.getsockname()[1]
    yield ports
    stop.set()
    for listener in listeners:
        listener.close()


def _send_until_closed(conn: socket.socket, stop: threading.Event) -> None:
    with contextlib.suppress(OSError):
        while not stop.is_set():
            conn.sendall(b"x" * 65536)


@pytest.mark.parametrize("server", ["flood", "silent"])
def test_the_tunnel_closes_in_seconds_with_connections_open(client_key, flood, server):
    """Ctrl-C (leaving ``forward``) while connections through the tunnel are open: one whose client stopped
    reading a stream (its pipe blocked writing to the client), or idle ones. The tunnel closed its listening
    socket and channels only after joining each pipe for up to 5 s: two stuck connections took over 10 s."""
    key, key_file = client_key
    with SSHServer("root", key) as host:
        target = tunnel.Target.from_hostvars("gpu-01", {
            "ansible_host": "127.0.0.1", "ansible_port": host.port, "ansible_user": "root",
            "ansible_ssh_private_key_file": key_file})
        clients: list[socket.socket] = []

        def use():
            with tunnel.forward(target, remote_port=flood[server]) as url:
                port = int(url.rsplit(":", 1)[1])
                for _ in range(2):
                    clients.append(socket.create_connection(("127.0.0.1", port)))
                    clients[-1].sendall(b"GET / HTTP/1.1\r\n")  # and never reads the answer
                time.sleep(1.5)  # the streams fill every buffer on the way: the pipes block
                started = time.monotonic()
            return time.monotonic() - started

        try:
            took = within(DEADLINE, use)
        finally:
            for c in clients:
                c.close()
        assert took < 3, f"the tunnel took {took:.1f} s to close"
        assert host.open_transports(wait=5) == [] and client_transports() == []


# --------------------------------------------------------------------------------------------------
# The inventory's settings, as Ansible's ssh applies them (nothing opened)


def test_the_inventory_variables_win_over_the_args_and_the_first_value_wins():
    t = tunnel.Target.from_hostvars("gpu-01", {
        "ansible_host": "10.0.0.11", "ansible_port": 2222, "ansible_user": "ubuntu",
        "ansible_ssh_private_key_file": "/keys/a",
        "ansible_ssh_common_args": "-p 23 -l admin -i /keys/b -o ProxyCommand='nc -x proxy:1080 %h %p' "
                                   "-o StrictHostKeyChecking=no -C",
        "ansible_ssh_extra_args": "-o ProxyJump=bastion -oUserKnownHostsFile=/dev/null"})
    assert (t.address, t.port, t.user, t.key_files) == ("10.0.0.11", 2222, "ubuntu", ("/keys/a", "/keys/b"))
    # ProxyCommand came first: ssh uses it, not the later ProxyJump; its tokens are expanded
    assert t.proxy_command == "nc -x proxy:1080 10.0.0.11 2222" and t.jump == ()


def test_args_fill_what_the_variables_leave_unset():
    t = tunnel.Target.from_hostvars("gpu-01", {"ansible_ssh_common_args": "-J ops@bastion:2200,jump2 -p 2022 -l me"})
    assert (t.address, t.port, t.user, t.jump) == ("gpu-01", 2022, "me", ("ops@bastion:2200", "jump2"))
    route = tunnel.Route(t)
    conn = route.connection()
    (first, second, last) = route.hops
    assert last is conn and conn.gateway is second and second.gateway is first and first.gateway is None
    assert (first.user, first.host, first.port) == ("ops", "bastion", 2200)
    assert (conn.user, conn.host, conn.port, conn.connect_timeout) == ("me", "gpu-01", 2022, tunnel.TIMEOUT)
    for hop in route.hops:  # timeouts on every hop
        assert hop.connect_kwargs["banner_timeout"] == hop.connect_kwargs["auth_timeout"] == tunnel.TIMEOUT
        assert hop.connect_kwargs["channel_timeout"] == tunnel.TIMEOUT and hop.connect_timeout == tunnel.TIMEOUT


def test_ssh_config_applies_where_the_inventory_sets_nothing(tmp_path):
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(
        "Host cfgjump\n  User jumpuser\nHost *\n  User cfguser\n  Port 2201\n  ProxyJump cfgjump\n")
    conn = tunnel.Route(tunnel.Target.from_hostvars("a", {"ansible_host": "gpu-7"})).connection()
    assert (conn.user, conn.port, conn.gateway.host, conn.gateway.user) == ("cfguser", 2201, "cfgjump", "jumpuser")
    assert conn.gateway.gateway is None  # Host * names the jump host too: it does not jump through itself
    # the inventory wins: its user and port, and ProxyJump=none turns ssh_config's jump off
    conn = tunnel.Route(tunnel.Target.from_hostvars("a", {
        "ansible_host": "gpu-7", "ansible_user": "inv", "ansible_port": 22,
        "ansible_ssh_common_args": "-o ProxyJump=none"})).connection()
    assert (conn.user, conn.port, conn.gateway) == ("inv", 22, None)


@pytest.mark.parametrize("args, named", [
    ("-o Ciphers=aes128-ctr", "-o Ciphers=aes128-ctr"),
    ("-F /etc/other_ssh_config", "-F"),
    ("-o StrictHostKeyChecking=no -L 8080:localhost:80", "-L"),
    ("-o ProxyJump=bad:port", "'bad:port'"),
    ("gpu-01", "'gpu-01'"),
])
def test_options_the_tunnel_cannot_honour_are_refused_naming_option_and_host(args, named):
    with pytest.raises(tunnel.SSHSettingsError) as err:
        tunnel.Target.from_hostvars("gpu-01", {"ansible_ssh_extra_args": args})
    message = str(err.value)
    assert message.startswith("host gpu-01: ") and named in message and "\n" not in message
