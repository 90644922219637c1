"""The engine API key on the host (issue 34 item 2): read from the unit's environment file, sent as a
bearer token by the gates' one HTTP helper to the origins it was authorized for, and to no other."""

from __future__ import annotations

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "collections"))

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_units as units  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_http  # noqa: E402

KEY = "sk-engine-7f3a9c"


@pytest.fixture(autouse=True)
def no_keys():
    sglang_http._KEYS.clear()
    yield
    sglang_http._KEYS.clear()


def unit_props(env_file: Path, name: str | None = "SGLANG_ENGINE_KEY"):
    environment = "CUDA_VISIBLE_DEVICES=0 PATH=/usr/bin" + (f" SGDEPLOY_API_KEY_ENV={name}" if name else "")

    def show(unit, *props):
        assert unit == "sglang-c.service" and set(props) == {"Environment", "EnvironmentFiles"}
        return {"Environment": environment, "EnvironmentFiles": f"{env_file} (ignore_errors=no)"}
    return show


def test_the_key_is_the_variable_the_unit_names_in_its_environment_file(tmp_path):
    env = tmp_path / "c.env"
    env.write_text(f'HF_TOKEN="hf"\nSGLANG_ENGINE_KEY="{KEY}"\n')
    assert units.engine_key("sglang-c.service", show_unit=unit_props(env)) == KEY


def test_a_unit_without_a_key_setting_has_none(tmp_path):
    env = tmp_path / "c.env"
    env.write_text(f'SGLANG_ENGINE_KEY="{KEY}"\n')
    assert units.engine_key("sglang-c.service", show_unit=unit_props(env, None)) is None


def test_a_unit_that_names_a_key_its_file_lacks_is_one_line_without_any_value(tmp_path):
    env = tmp_path / "c.env"
    env.write_text(f'HF_TOKEN="{KEY}"\n')
    with pytest.raises(units.EngineKeyError) as err:
        units.engine_key("sglang-c.service", show_unit=unit_props(env))
    msg = str(err.value)
    assert msg == (f"sglang-c.service: SGDEPLOY_API_KEY_ENV=SGLANG_ENGINE_KEY, but no environment file of the unit "
                   f"({env}) sets SGLANG_ENGINE_KEY (serving.api_key_secret)")
    assert KEY not in msg and "\n" not in msg


def test_a_missing_environment_file_is_a_missing_key(tmp_path):
    with pytest.raises(units.EngineKeyError, match="no environment file of the unit"):
        units.engine_key("sglang-c.service", show_unit=unit_props(tmp_path / "absent.env"))


def test_the_key_goes_to_the_authorized_origin_only():
    sglang_http.authorize("http://10.0.0.5:30000", KEY)
    assert sglang_http.headers_for("http://10.0.0.5:30000/generate") == {"Authorization": f"Bearer {KEY}"}
    assert sglang_http.headers_for("http://10.0.0.5:30000") == {"Authorization": f"Bearer {KEY}"}
    for other in ("http://10.0.0.5:30001/generate", "http://10.0.0.6:30000/generate",
                  "https://10.0.0.5:30000/generate", "http://10.0.0.5/generate", "not a url", ""):
        assert sglang_http.headers_for(other) == {}, other
    sglang_http.authorize("http://10.0.0.5:30000/", "")
    assert sglang_http.headers_for("http://10.0.0.5:30000/generate") == {}


def test_a_default_port_is_the_same_origin():
    sglang_http.authorize("http://engine.example", KEY)
    assert sglang_http.headers_for("http://ENGINE.example:80/generate") == {"Authorization": f"Bearer {KEY}"}


def test_authorizing_a_malformed_url_is_one_line():
    with pytest.raises(sglang_http.UsageError, match="is not a service address"):
        sglang_http.authorize("engine:30000", KEY)


class _Keyed(BaseHTTPRequestHandler):
    """A keyed engine: 401 without the key except on /health; records what each request carried."""

    seen: list = []

    def _answer(self):
        auth = self.headers.get("Authorization")
        type(self).seen.append((self.server.server_address[1], self.path, auth))
        if self.path != "/health" and auth != f"Bearer {KEY}":
            code, body = 401, b'{"error": "Unauthorized"}'
        else:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            code, body = 200, json.dumps({"text": " Paris", "meta_info": {}}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def engines():
    _Keyed.seen = []
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _Keyed) for _ in range(2)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    yield [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
    for s in servers:
        s.shutdown()
        s.server_close()


def test_warm_up_and_generate_send_the_key_to_their_engine_and_not_to_another(engines):
    keyed, other = engines
    assert sglang_http.answer(keyed) == "/generate answered HTTP 401"  # before authorize: what a deploy saw
    sglang_http.authorize(keyed, KEY)
    assert sglang_http.answer(keyed) == ""
    assert sglang_http.is_healthy(keyed)
    assert sglang_http.generate(keyed, "The capital of France is", 4, 10)["text"] == " Paris"
    assert sglang_http.answer(other) == "/generate answered HTTP 401"
    port = int(other.rsplit(":", 1)[1])
    assert all(auth is None for p, _, auth in _Keyed.seen if p == port)
    assert [auth for p, path, auth in _Keyed.seen if p != port and path == "/generate"] == [
        None, f"Bearer {KEY}", f"Bearer {KEY}"]


def test_an_answer_that_fails_does_not_show_the_key(engines):
    keyed, _ = engines
    sglang_http.authorize(keyed, "wrong-" + KEY)
    with pytest.raises(sglang_http.ServingError) as err:
        sglang_http.generate(keyed, "x", 2, 10)
    assert str(err.value).startswith("/generate answered HTTP 401") and KEY not in str(err.value)


def test_the_sweep_refuses_a_keyed_config_in_one_line(tmp_path):
    from sgdeploy import sweep

    path = tmp_path / "keyed.yml"
    path.write_text("extends: ddtree-b15\nserving: {api_key_secret: SGLANG_ENGINE_KEY}\n")
    with pytest.raises(sweep.UsageError) as err:
        sweep.load_base(str(path))
    assert str(err.value) == (
        f"--config {path}: serving.api_key_secret 'SGLANG_ENGINE_KEY': not swept (the sweep benchmarks from the "
        "controller, and the engines' API key stays on the host); sweep a copy of it without "
        "serving.api_key_secret on a loopback address, then deploy the best budget with make deploy")


def fake_systemctl(tmp_path: Path, env_file: Path) -> Path:
    """A `systemctl` on PATH that shows a keyed, active unit (the modules read the key's name through it)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "systemctl"
    script.write_text("#!/bin/sh\n[ \"$1\" = show ] || exit 0\n"
                      "echo ActiveState=active\necho NRestarts=0\n"
                      "echo 'Environment=PATH=/usr/bin SGDEPLOY_API_KEY_ENV=SGLANG_ENGINE_KEY'\n"
                      f"echo 'EnvironmentFiles={env_file} (ignore_errors=no)'\n")
    script.chmod(0o755)
    return folder


def test_the_wait_module_warms_up_a_keyed_engine_with_its_key_from_the_host(tmp_path, engines, monkeypatch):
    from test_models import run_module

    keyed, other = engines
    env = tmp_path / "c.env"
    env.write_text(f'SGLANG_ENGINE_KEY="{KEY}"\n')
    monkeypatch.setenv("PATH", f"{fake_systemctl(tmp_path, env)}:{os.environ['PATH']}")
    args = {"what": "healthy", "url": keyed, "unit": "sglang-c.service", "answers": 2, "timeout_s": 20,
            "poll_s": 10, "state_dir": str(tmp_path / "state")}
    rc, result = run_module("sglang_deploy_wait", args, tmp_path)
    assert rc == 0 and result["ok"] and result["state"] == "healthy", result
    assert KEY not in json.dumps(result)
    assert [auth for _, path, auth in _Keyed.seen if path == "/generate"] == [f"Bearer {KEY}"] * 2

    env.write_text('HF_TOKEN="x"\n')  # the unit names a key its file lacks: one line, no value
    rc, result = run_module("sglang_deploy_wait", args, tmp_path)
    assert rc == 1 and result["msg"] == (
        f"wait healthy: sglang-c.service: SGDEPLOY_API_KEY_ENV=SGLANG_ENGINE_KEY, but no environment file of "
        f"the unit ({env}) sets SGLANG_ENGINE_KEY (serving.api_key_secret)"), result


def test_the_gate_module_refuses_a_unit_whose_key_is_missing_in_one_line(tmp_path, monkeypatch):
    from test_models import run_module

    env = tmp_path / "c.env"
    env.write_text('HF_TOKEN="x"\n')
    monkeypatch.setenv("PATH", f"{fake_systemctl(tmp_path, env)}:{os.environ['PATH']}")
    rc, result = run_module("sglang_gate", {"url": "http://127.0.0.1:9", "unit": "sglang-c.service",
                                            "speculative": True, "thresholds": {}}, tmp_path)
    assert rc == 1 and result["msg"].startswith("gates: sglang-c.service: SGDEPLOY_API_KEY_ENV=SGLANG_ENGINE_KEY, "
                                                 "but no environment file of the unit"), result
