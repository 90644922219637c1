"""The module sgdeploy.host.sglang_replicas_plan as the role sglang_replicas uses it: registered with
``failed_when: false`` (which sets the result's ``failed`` to false), so the role refuses a rollout when the result
has no ``plan``. A refusal must therefore come without ``plan``: a router that stays down used to return one, the
role went on, and the canary's take-out failed after its timeout instead of the plan's one-line refusal
(tests/lab/test_replica_faults.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "collections"))

from ansible.module_utils import basic  # noqa: E402
from ansible.module_utils.common.text.converters import to_bytes  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_router_api as api  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.modules import sglang_replicas_plan as mod  # noqa: E402

BIND = "127.0.0.1"
PORT = 31700


def _layout() -> dict:
    replicas = [{"index": i, "name": f"x-r{i}", "unit_name": f"sglang-x-r{i}.service", "port": PORT + 1 + 2 * i,
                 "nccl_port": PORT + 2 + 2 * i, "gpus": [i], "url": f"http://{BIND}:{PORT + 1 + 2 * i}"}
                for i in (0, 1)]
    return {"config": "x", "bind_address": BIND, "gpus": [0, 1], "replicas": replicas,
            "router": {"unit_name": f"sglang-router-{PORT}.service", "port": PORT, "metrics_port": PORT + 5,
                       "url": f"http://{BIND}:{PORT}"}}


def _run(tmp_path, monkeypatch, capsys, state: str, healthy: bool, workers=None) -> dict:
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    urls = " ".join(r["url"] for r in _layout()["replicas"])
    (unit_dir / f"sglang-router-{PORT}.service").write_text(
        f"[Service]\nExecStart=/opt/r/python launch.py --host {BIND} --port {PORT} --prometheus-port {PORT + 5} "
        f"--worker-urls {urls}\n")
    monkeypatch.setattr(mod.units, "listeners", lambda: [])
    monkeypatch.setattr(mod.units, "show", lambda unit, *props: {"ActiveState": state})
    monkeypatch.setattr(mod.sglang_http, "is_healthy", lambda url, timeout=5.0: healthy)
    monkeypatch.setattr(mod.api, "workers", workers or (lambda url: {}))
    args = {"layout": _layout(), "gpu_count": 8, "router_wait_s": 0, "state_dir": str(tmp_path / "state"),
            "unit_dir": str(unit_dir)}
    monkeypatch.setattr(basic, "_ANSIBLE_ARGS", to_bytes(json.dumps({"ANSIBLE_MODULE_ARGS": args})))
    monkeypatch.setattr(basic, "_ANSIBLE_PROFILE", "legacy")
    monkeypatch.setattr(basic, "_PARSED_MODULE_ARGS", None, raising=False)
    with pytest.raises(SystemExit):
        mod.main()
    return json.loads(capsys.readouterr().out)


def test_a_router_that_stays_down_is_refused_without_a_plan(tmp_path, monkeypatch, capsys):
    result = _run(tmp_path, monkeypatch, capsys, state="inactive", healthy=False)
    assert result.get("failed") is True
    assert "plan" not in result, "with failed_when: false the role reads a result with a plan as a success"
    assert result["msg"].startswith(f"router sglang-router-{PORT}.service is inactive, not active and answering "
                                    f"http://{BIND}:{PORT}/health after ")
    assert result["msg"].endswith("and deploy again")


def test_a_router_whose_worker_list_cannot_be_read_is_refused_without_a_plan(tmp_path, monkeypatch, capsys):
    def workers(url):
        raise api.RouterError(f"router {url} does not answer")

    result = _run(tmp_path, monkeypatch, capsys, state="active", healthy=True, workers=workers)
    assert result.get("failed") is True
    assert "plan" not in result
    assert "a rollout never skips taking replicas out of it" in result["msg"]


def test_a_running_router_gives_the_plan(tmp_path, monkeypatch, capsys):
    result = _run(tmp_path, monkeypatch, capsys, state="active", healthy=True)
    assert not result.get("failed") and result["plan"] and result["router"]["active"] is True
