"""tests/lab/unhealthy_window.py: the window arithmetic, the failure kinds and its input checks."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "lab"))

import unhealthy_window as uw  # noqa: E402


def test_a_window_runs_from_the_first_failure_to_the_next_success():
    samples = [(0.0, "ok"), (0.1, "refused"), (0.2, "refused"), (0.7, "ok"), (0.8, "broken"), (0.9, "ok")]
    assert uw.windows(samples) == [
        {"from": 0.1, "seconds": 0.6, "kinds": ["refused"], "closed": True},
        {"from": 0.8, "seconds": 0.1, "kinds": ["broken"], "closed": True},
    ]


def test_a_window_still_open_at_the_end_is_marked_so():
    assert uw.windows([(0.0, "ok"), (1.0, "refused"), (1.5, "refused")]) == [
        {"from": 1.0, "seconds": 0.5, "kinds": ["refused"], "closed": False}]


class _Answer(BaseHTTPRequestHandler):
    status = 200

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps({"text": "hi"}).encode()
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture()
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_probe_tells_ok_turned_away_an_error_and_nothing_listening_apart(server, monkeypatch):
    assert uw.probe(server, 5) == "ok"
    monkeypatch.setattr(_Answer, "status", 503)  # loading or draining: turned away, nothing dropped
    assert uw.probe(server, 5) == "rejected"
    monkeypatch.setattr(_Answer, "status", 500)
    assert uw.probe(server, 5) == "broken"
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    port = srv.server_address[1]
    srv.server_close()  # nothing listens there now
    assert uw.probe(f"http://127.0.0.1:{port}", 5) == "refused"


def test_measure_is_bounded_by_its_request_count_and_returns_the_commands_status(server):
    out = uw.measure(server, [sys.executable, "-c", "import time; time.sleep(0.5)"], rate=20, max_requests=5,
                     max_seconds=30)
    assert out["requests"] == 5 and out["ok"] == 5 and out["rc"] == 0 and out["windows"] == []


@pytest.mark.parametrize("args, message", [
    (["--url", "http://10.0.0.1:30000", "--", "true"], "inside 127.0.0.0/8 only"),
    (["--url", "http://127.0.0.1:30000", "--rate", "500", "--", "true"], "at most 50 requests per second"),
    (["--url", "http://127.0.0.1:30000", "--max-requests", "0", "--", "true"], "give a number above 0"),
    (["--url", "http://127.0.0.1:30000"], "give the command to measure"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    proc = subprocess.run([sys.executable, str(REPO / "tests/lab/unhealthy_window.py"), *args], capture_output=True,
                          text=True, timeout=30, check=False)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr
