"""A unit in systemd's restart delay holds its port again in seconds: the plan stops it like a serving
one, and the wait for free ports names a port kept by something the deploy does not stop instead of
waiting out its whole timeout.

Found in the lab (2026-12-03, tests/lab/test_interrupts.py, the recovery case): the old unit, restored by
a recovery while a stray process held its port, crash-looped; the next deploy planned while it sat in its
restart delay (ActiveState `activating`), so it stopped nothing, then waited 720 s for port 30000, which
the unit had taken back by itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "collections"))

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_plan as planmod  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_units as units  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.modules import sglang_deploy_wait as waitmod  # noqa: E402
from test_host_modules import deploy_of, host, put_running  # noqa: E402, F401  (host is a fixture)


def test_a_unit_in_its_restart_delay_is_stopped_by_a_deploy_of_its_own_config(host):  # noqa: F811
    paths, fake = host
    put_running(paths, fake, "cfg", "[Service]\n")
    fake.active.discard("sglang-cfg.service")
    fake.states["sglang-cfg.service"] = "activating"  # Restart=on-failure, waiting RestartSec
    out = planmod.plan(deploy_of("cfg", digest="d-cfg", release="r-old"), 8, paths.state_dir, sockets=[])
    assert out["stop_units"] == ["sglang-cfg.service"]
    assert out["unchanged"] is False  # the same unit and release, but it does not serve: switched again


def test_a_crash_looping_config_on_the_port_is_replaced_not_ignored(host):  # noqa: F811
    paths, fake = host
    put_running(paths, fake, "old", "[Service]\n")
    fake.active.discard("sglang-old.service")
    fake.states["sglang-old.service"] = "activating"
    out = planmod.plan(deploy_of("new"), 8, paths.state_dir, sockets=[])
    assert out["stop_units"] == ["sglang-old.service"] and out["replaces"] == ["old"]


def test_a_serving_unit_of_the_same_config_is_still_unchanged(host):  # noqa: F811
    paths, fake = host
    put_running(paths, fake, "cfg", "[Service]\n")
    out = planmod.plan(deploy_of("cfg", digest="d-cfg", release="r-old"), 8, paths.state_dir, sockets=[])
    assert out["unchanged"] is True


def _wait_params(stopping):
    return {"units": stopping, "ports": [["127.0.1.1", 30000]]}


def _listener(unit):
    return [{"address": "127.0.1.1", "port": 30000, "pids": [4242], "process": "python3", "unit": unit, "line": ""}]


def test_a_port_kept_by_a_unit_the_deploy_does_not_stop_ends_the_wait_naming_it(host, monkeypatch):  # noqa: F811
    monkeypatch.setattr(units, "port_free", lambda a, p: False)
    monkeypatch.setattr(units, "listeners", lambda: _listener("sglang-cfg.service"))
    monkeypatch.setattr(waitmod, "FOREIGN_GRACE_S", 0.3)
    now = waitmod.time.time()
    state, detail = waitmod._stopped(_wait_params([]), now + 720, now + 20)
    assert state == "held", detail
    assert detail == ("port 127.0.1.1:30000 is held by python3 (pid 4242, unit sglang-cfg.service), "
                      "which this deploy does not stop")


def test_a_port_kept_by_the_draining_unit_is_waited_for(host, monkeypatch):  # noqa: F811
    monkeypatch.setattr(units, "port_free", lambda a, p: False)
    monkeypatch.setattr(units, "listeners", lambda: _listener("sglang-old.service"))
    monkeypatch.setattr(waitmod, "FOREIGN_GRACE_S", 0.3)
    now = waitmod.time.time()
    state, detail = waitmod._stopped(_wait_params(["sglang-old.service"]), now + 720, now + 1.5)
    assert state == "waiting", detail
    assert "ports in use: 127.0.1.1:30000" in detail


def test_a_deactivating_unit_is_still_running_for_the_wait(host, monkeypatch):  # noqa: F811
    _paths, fake = host
    fake.states["sglang-old.service"] = "deactivating"
    monkeypatch.setattr(units, "port_free", lambda a, p: True)
    now = waitmod.time.time()
    state, detail = waitmod._stopped(_wait_params(["sglang-old.service"]), now + 720, now + 1)
    assert state == "waiting" and "still running: sglang-old.service" in detail, detail
