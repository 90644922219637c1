"""`sgdeploy tunnel` against a lab host: a local port reaches what listens on the host's service
address, over the real SSH of the inventory (issue 19's controller-side command)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SGDEPLOY = Path(sys.executable).parent / "sgdeploy"
PORT = 30555  # not a port the lab's deploy tests use


def test_tunnel_forwards_a_local_port_to_the_service_address_on_the_host(lab, tmp_path):
    config = tmp_path / "tunnel-probe.yml"
    config.write_text(f"extends: ddtree-b15\nserving: {{port: {PORT}, nccl_port: {PORT + 1}}}\n")
    address = lab.address("lab1")
    # Something that answers HTTP where the config's service listens on lab1 (its bind address).
    pid = lab.ssh("lab1", f"mkdir -p /tmp/tunnel-probe && echo tunnel-probe-ok > /tmp/tunnel-probe/index.html; "
                          f"cd /tmp/tunnel-probe; setsid python3 -m http.server {PORT} --bind {address} "
                          "</dev/null >/dev/null 2>&1 & echo $!", timeout=30).stdout.strip()
    assert pid.isdigit(), pid
    proc = subprocess.Popen([str(SGDEPLOY), "tunnel", str(config), "--inventory", str(lab.inventory), "--host", "lab1",
                             "--seconds", "60"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
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
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        lab.ssh("lab1", f"kill {pid}; rm -rf /tmp/tunnel-probe", check=False)
