"""`sgdeploy tunnel` against a lab host: a local port reaches what listens on the host's service
address, over the real SSH of the inventory (issue 19's controller-side command)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SGDEPLOY = Path(sys.executable).parent / "sgdeploy"
PORT = 30555  # not a port the lab's deploy tests use
# Seconds `sgdeploy tunnel` may take to exit after Ctrl-C: under 1 s measured, 2 s per join at most, margin for a
# loaded CI machine.
EXIT_S = 20


def test_tunnel_forwards_a_local_port_to_the_service_address_on_the_host(lab, tmp_path):
    config = tmp_path / "tunnel-probe.yml"
    config.write_text(f"extends: ddtree-b15\nserving: {{port: {PORT}, nccl_port: {PORT + 1}}}\n")
    address = lab.address("lab1")
    # Something that answers HTTP where the config's service listens on lab1 (its bind address).
    pid = lab.ssh("lab1", f"mkdir -p /tmp/tunnel-probe && echo tunnel-probe-ok > /tmp/tunnel-probe/index.html; "
                          f"cd /tmp/tunnel-probe; setsid python3 -m http.server {PORT} --bind {address} "
                          "</dev/null >/dev/null 2>&1 & echo $!", timeout=30).stdout.strip()
    assert pid.isdigit(), pid
    # Started with SIGINT ignored, as a non-interactive shell starts a background job (a script's `cmd &`, CI):
    # Ctrl-C must still close it. Before the tunnel handled the signal itself it ran out its --seconds instead.
    proc = subprocess.Popen([str(SGDEPLOY), "tunnel", str(config), "--inventory", str(lab.inventory), "--host", "lab1",
                             "--seconds", "60"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        line = proc.stdout.readline()
        assert f" -> lab1 -> http://{address}:{PORT} (tunnel-probe); Ctrl-C closes it" in line, (
            line, proc.stderr.read() if proc.poll() is not None else "")
        url = line.split()[0]
        assert url.startswith("http://127.0.0.1:")
        body = ""
        for _ in range(20):  # the server on lab1 may take a moment to listen
            try:
                with urllib.request.urlopen(url + "/index.html", timeout=10) as response:
                    body = response.read().decode()
                break
            except OSError:
                time.sleep(0.5)
        assert body.strip() == "tunnel-probe-ok"
        # Ctrl-C with a forwarded connection open and idle: the tunnel closes its listening socket and every
        # channel first, then joins its threads and the SSH transport within 2 s each (tunnel.JOIN_S). It exits in
        # about 0.3 s; a tunnel that ignores Ctrl-C runs out its --seconds 60 (what CI's background run saw).
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=10):
            time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=EXIT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        lab.ssh("lab1", f"kill {pid}; rm -rf /tmp/tunnel-probe", check=False)


def test_tunnel_reaches_a_host_through_another_as_its_proxyjump(lab, tmp_path):
    """Issue 35: the tunnel honours the inventory's SSH settings. lab2's ``ansible_host`` is a name only lab1
    resolves (an /etc/hosts line there) and its ``ansible_ssh_common_args`` jump through lab1, so the local port
    reaches lab2's service only if the tunnel goes through lab1 as the inventory says."""
    if len(lab.hosts) < 2:
        pytest.skip("needs two lab hosts (LAB_HOSTS >= 2)")
    import yaml

    behind = "lab2-behind-lab1"
    config = tmp_path / "tunnel-probe.yml"
    config.write_text(f"extends: ddtree-b15\nserving: {{port: {PORT}, nccl_port: {PORT + 1}}}\n")
    data = yaml.safe_load(lab.inventory.read_text())
    lab2 = data["all"]["children"]["gpu_hosts"]["hosts"]["lab2"]
    lab2["ansible_host"] = behind
    lab2["ansible_ssh_common_args"] += f" -o ProxyJump=root@{lab.address('lab1')}"
    inventory = tmp_path / "jump.yml"
    inventory.write_text(yaml.safe_dump(data))
    address = lab.address("lab2")
    lab.ssh("lab1", f"echo '{address} {behind}' >> /etc/hosts")
    pid = lab.ssh("lab2", f"mkdir -p /tmp/tunnel-probe && echo via-lab1-ok > /tmp/tunnel-probe/index.html; "
                          f"cd /tmp/tunnel-probe; setsid python3 -m http.server {PORT} --bind {address} "
                          "</dev/null >/dev/null 2>&1 & echo $!", timeout=30).stdout.strip()
    proc = subprocess.Popen([str(SGDEPLOY), "tunnel", str(config), "--inventory", str(inventory), "--host", "lab2",
                             "--seconds", "60"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert f" -> lab2 -> http://{address}:{PORT} (tunnel-probe); Ctrl-C closes it" in line, (
            line, proc.stderr.read() if proc.poll() is not None else "")
        body = ""
        for _ in range(20):
            try:
                with urllib.request.urlopen(line.split()[0] + "/index.html", timeout=10) as response:
                    body = response.read().decode()
                break
            except OSError:
                time.sleep(0.5)
        assert body.strip() == "via-lab1-ok"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=EXIT_S) == 0  # SIGTERM closes it too (the first test: Ctrl-C, and how fast)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        lab.ssh("lab2", f"kill {pid}; rm -rf /tmp/tunnel-probe", check=False)
        lab.ssh("lab1", f"sed -i '/ {behind}$/d' /etc/hosts", check=False)


# --- No silent success, SERIAL, make status (issues 33 and 34) ------------------------------------------

USER_VARS = ("CONFIG", "INVENTORY", "LIMIT", "SERIAL", "LAB_HOSTS", "BUDGETS", "TOPK_CAPS", "CLIFF_DROP",
             "TIE_TOLERANCE", "HOST", "PATCHES", "PATCH", "INV")
EXAMPLE = ("give an Ansible inventory that lists the hosts in group gpu_hosts, as inventory/example.yml does")


def make(lab, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in lab.ansible_env().items()
           if not k.startswith(("MAKE", "MFLAGS")) and k not in USER_VARS}
    return subprocess.run(["make", "-s", "--no-print-directory", *args], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=timeout, check=False)


def refusal(proc: subprocess.CompletedProcess) -> str:
    """Exit 2 with one line (make's own `make: *** ... Error 2` aside), no play, no traceback."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "PLAY" not in out and "Traceback" not in out and "skipping: no hosts matched" not in out, out[-3000:]
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("make: ***")]
    assert len(lines) == 1 and proc.stdout == "", out[-3000:]
    return lines[0]


HOST_TARGETS = {"deploy": ["CONFIG=ddtree-b15"], "rollback": ["CONFIG=ddtree-b15"], "provision": [], "status": [],
                "build": ["CONFIG=ddtree-b15"], "verify": [], "plan": ["CONFIG=ddtree-b15"],
                "gate": ["CONFIG=ddtree-b15"], "sweep": ["CONFIG=ddtree-b15"], "reference": ["CONFIG=ddtree-b15"]}


def test_no_target_that_touches_hosts_succeeds_without_hosts(lab, tmp_path):
    """Before: warnings, `skipping: no hosts matched`, exit 0 (a LIMIT that matched nothing: Ansible's own
    error after a warning; a host outside gpu_hosts: exit 0)."""
    from test_deploy import HOST_FILES

    before = {host: lab.ssh(host, HOST_FILES).stdout for host in lab.hosts}
    missing = tmp_path / "prod.yml"
    for target, args in HOST_TARGETS.items():
        line = refusal(make(lab, target, *args, f"INVENTORY={missing}"))
        assert line == f"sgdeploy hosts: inventory {missing}: no such file or folder; {EXAMPLE}", (target, line)
    broken = tmp_path / "broken.yml"
    broken.write_text(lab.inventory.read_text().replace("gpu_hosts:", "gpu_hosts: [", 1))
    elsewhere = tmp_path / "elsewhere.yml"  # the lab's hosts, but not in gpu_hosts
    elsewhere.write_text(lab.inventory.read_text().replace("gpu_hosts:", "other_hosts:", 1))
    there = ", ".join(lab.hosts)
    for target in ("deploy", "status", "provision", "rollback"):
        args = HOST_TARGETS[target]
        line = refusal(make(lab, target, *args, f"INVENTORY={broken}"))
        assert line.startswith(f"sgdeploy hosts: inventory {broken}: Ansible cannot parse it: "), line
        line = refusal(make(lab, target, *args, f"INVENTORY={elsewhere}"))
        assert line == f"sgdeploy hosts: inventory {elsewhere}: group gpu_hosts has no host; {EXAMPLE}", line
        line = refusal(make(lab, target, *args, f"INVENTORY={lab.inventory}", "LIMIT=lab9"))
        assert line == (f"sgdeploy hosts: LIMIT 'lab9' matches no host in {lab.inventory} "
                        f"(hosts of gpu_hosts there: {there})"), line
    line = refusal(make(lab, "reference", "CONFIG=ddtree-b15", f"INVENTORY={lab.inventory}", "HOST=lab9"))
    assert line.startswith("sgdeploy hosts: HOST 'lab9' matches no host in "), line
    assert {host: lab.ssh(host, HOST_FILES).stdout for host in lab.hosts} == before


@pytest.mark.parametrize("value", ["abc", "0", "101%"])
def test_a_bad_serial_is_refused_before_anything_runs(lab, value):
    """Before: abc ended in Ansible's 'probably a bug' traceback; 0 deployed one host at a time."""
    from test_deploy import HOST_FILES

    before = lab.ssh("lab1", HOST_FILES).stdout
    for target in ("deploy", "rollback"):
        line = refusal(make(lab, target, "CONFIG=ddtree-b15", f"INVENTORY={lab.inventory}", "LIMIT=lab1",
                            f"SERIAL={value}"))
        assert line == (f"SERIAL='{value}' is not allowed: use a whole number of hosts at a time from 1 "
                        "(e.g. SERIAL=2) or a percentage from 1% to 100% (e.g. SERIAL=25%)"), line
    assert lab.ssh("lab1", HOST_FILES).stdout == before


def status_lines(proc: subprocess.CompletedProcess) -> list[str]:
    """The lines of the status table (the `msg` list of the last task), unquoted."""
    out = proc.stdout
    start = out.rindex('"msg": [')
    return [line.strip().rstrip(",").strip('"') for line in out[start:].splitlines()[1:]
            if line.strip().startswith('"')]


def test_status_shows_now_then_what_each_deploy_was(lab):
    """Before: no `now` table (a debug line per host, without numbers); an unchanged deploy showed `- -`;
    a manual rollback looked like any rolled back deploy; `make status LIMIT=lab1` said
    `localhost: UNREACHABLE`."""
    from test_deploy import RESET

    for host in lab.hosts:
        lab.ssh(host, RESET)
    first = make(lab, "deploy", "CONFIG=ddtree-b15", f"INVENTORY={lab.inventory}", "LIMIT=lab1")
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    again = make(lab, "deploy", "CONFIG=ddtree-b15", f"INVENTORY={lab.inventory}", "LIMIT=lab1")
    assert again.returncode == 0 and "unchanged" in again.stdout, (again.stdout + again.stderr)[-3000:]

    proc = make(lab, "status", f"INVENTORY={lab.inventory}", "LIMIT=lab1")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "localhost: UNREACHABLE" not in out and "UNREACHABLE" not in out, out[-3000:]
    lines = status_lines(proc)
    assert lines[0].startswith("now (what serves on each host"), lines
    assert lines[1].split()[:4] == ["host", "serves", "now", "state"], lines
    now = lines[2:lines.index("")]
    assert len(now) == 1 and now[0].split()[:3] == ["lab1", "ddtree-b15", "serving"], lines
    assert not any(line.startswith("localhost") for line in lines), lines
    history = lines[lines.index("") + 1:]
    row = next(line for line in history if line.startswith("ddtree-b15 "))
    assert " deploy, unchanged (numbers of " in row and " unchanged " in row, lines
    accept, tps = row.split()[-4:-2]
    assert float(accept) > 8 and float(tps) > 100, row  # the numbers the first deploy measured
    assert now[0].split()[-4:-2] == [accept, tps], (now, row)  # now: the same numbers, then when measured

    b32 = make(lab, "deploy", "CONFIG=ddtree-b32", f"INVENTORY={lab.inventory}", "LIMIT=lab1")
    assert b32.returncode == 0, (b32.stdout + b32.stderr)[-3000:]
    back = make(lab, "rollback", "CONFIG=ddtree-b32", f"INVENTORY={lab.inventory}", "LIMIT=lab1")
    assert back.returncode == 0, (back.stdout + back.stderr)[-3000:]
    proc = make(lab, "status", f"INVENTORY={lab.inventory}")  # every host
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    lines = status_lines(proc)
    now = lines[2:lines.index("")]
    assert [line.split()[:3] for line in now] == [["lab1", "ddtree-b15", "serving"], ["lab2", "-", "nothing"]], lines
    row = next(line for line in lines if line.startswith("ddtree-b32 "))
    assert " manual rollback to ddtree-b15 " in row and " rolled_back " in row, lines
