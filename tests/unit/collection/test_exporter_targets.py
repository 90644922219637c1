"""The per-host exporter's scrape targets and series (issue 36, docs/monitoring.md): generated from a host's deploy
state folder and router units, labelled host/config/release/replica, served as Prometheus HTTP service discovery;
only metrics paths are served. The real exporter and Prometheus run in tests/lab/test_monitoring.py."""

from __future__ import annotations

import json
import re
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "collections"))
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_exporter as ex  # noqa: E402

ROLES = REPO / "collections" / "ansible_collections" / "sgdeploy" / "host" / "roles"
ROUTER_UNIT = ("[Service]\nExecStart=/opt/sglang-router/0.3.2/venv/bin/python "
               "/opt/sglang-router/0.3.2/sglang_router_launch.py --host 10.0.0.5 --port 31200 "
               "--prometheus-host 10.0.0.5 "
               "--prometheus-port 31199 --policy round_robin "
               "--worker-urls http://10.0.0.5:31201 http://10.0.0.5:31203\n")


def _deploy(state: Path, name: str, port: int, release: str, bind: str = "10.0.0.5", records=()) -> None:
    folder = state / name
    (folder / "records").mkdir(parents=True)
    (folder / "current.json").write_text(json.dumps({
        "config": name, "unit_name": f"sglang-{name}.service", "release": release, "bind_address": bind,
        "ports": [port, port + 1], "gpus": [0]}))
    for stamp, outcome, rel in records:
        (folder / "records" / f"{stamp.replace('-', '').replace(':', '')}.json").write_text(json.dumps(
            {"config": name, "release": rel, "outcome": outcome, "finished": stamp}))


@pytest.fixture()
def host(tmp_path):
    state, units = tmp_path / "state", tmp_path / "units"
    units.mkdir()
    _deploy(state, "ddtree-b15-r0", 31201, "rel-new", records=[("2026-12-01T10:00:00Z", "deployed", "rel-old"),
                                                                ("2026-12-05T10:00:00Z", "deployed", "rel-new")])
    _deploy(state, "ddtree-b15-r1", 31203, "rel-new", records=[("2026-12-05T10:01:00Z", "deployed", "rel-new"),
                                                                ("2026-12-05T10:02:00Z", "unchanged", "rel-new")])
    # A single engine whose name merely ends like a replica's: no router fronts it on the port rule.
    _deploy(state, "plain-r2", 30000, "rel-x", bind="0.0.0.0",
            records=[("2026-12-04T08:00:00Z", "rolled_back", "rel-y")])
    (state / "runs").mkdir()  # the deploy role's scratch folder: no current.json, no target
    (units / "sglang-router-31200.service").write_text(ROUTER_UNIT)
    return state, units


def test_targets_of_a_host_with_replicas_behind_a_router_and_a_single_engine(host):
    state, units = host
    targets = ex.scrape_targets("gpu-01", str(state), str(units))
    assert targets == [
        {"job": "sgdeploy-host", "path": "/metrics", "labels": {"host": "gpu-01"}},
        {"job": "sglang-engine", "path": "/metrics/engine/ddtree-b15-r0",
         "labels": {"host": "gpu-01", "config": "ddtree-b15", "release": "rel-new", "replica": "0"}},
        {"job": "sglang-engine", "path": "/metrics/engine/ddtree-b15-r1",
         "labels": {"host": "gpu-01", "config": "ddtree-b15", "release": "rel-new", "replica": "1"}},
        {"job": "sglang-engine", "path": "/metrics/engine/plain-r2",
         "labels": {"host": "gpu-01", "config": "plain-r2", "release": "rel-x", "replica": ""}},
        {"job": "sglang-router", "path": "/metrics/router/31200",
         "labels": {"host": "gpu-01", "config": "ddtree-b15", "release": "rel-new", "replica": ""}},
    ]


def test_service_discovery_names_the_exporter_and_the_path_of_each_target(host):
    state, units = host
    doc = ex.discovery("sglang-router", "gpu-01", "10.0.0.5:9468", str(state), str(units))
    assert doc == [{"targets": ["10.0.0.5:9468"], "labels": {
        "__metrics_path__": "/metrics/router/31200", "host": "gpu-01", "config": "ddtree-b15", "release": "rel-new",
        "replica": ""}}]
    assert [g["labels"]["__metrics_path__"] for g in ex.discovery("sglang-engine", "gpu-01", "a:1", str(state),
                                                                   str(units))] == [
        "/metrics/engine/ddtree-b15-r0", "/metrics/engine/ddtree-b15-r1", "/metrics/engine/plain-r2"]


def test_routes_relay_only_deployed_engines_and_routers(host):
    state, units = host
    s, u = str(state), str(units)
    assert ex.route("/metrics", s, u) == ("own", None)
    assert ex.route("/metrics/engine/ddtree-b15-r1", s, u) == ("relay", "http://10.0.0.5:31203/metrics")
    assert ex.route("/metrics/engine/plain-r2", s, u) == ("relay", "http://127.0.0.1:30000/metrics")  # 0.0.0.0
    assert ex.route("/metrics/router/31200", s, u) == ("relay", "http://10.0.0.5:31199/metrics")
    assert ex.route("/metrics/targets/sglang-engine?x=1", s, u) == ("targets", "sglang-engine")
    for path in ("/generate", "/metrics/engine/nope", "/metrics/router/31201", "/metrics/engine/../../generate",
                 "/metrics/targets/other", "/metrics/engine/ddtree-b15-r0/extra", "/"):
        kind, reason = ex.route(path, s, u)
        assert kind is None and reason, path


def test_own_series_unit_state_restarts_and_the_latest_deploy_per_config(host):
    state, units = host
    states = {"sglang-ddtree-b15-r0.service": (1, 0), "sglang-ddtree-b15-r1.service": (1, 3),
              "sglang-plain-r2.service": (0, 0), "sglang-router-31200.service": (1, 1)}
    text = ex.own_metrics(str(state), str(units), states=states)
    series = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert series['sgdeploy_unit_active{unit="sglang-plain-r2.service",config="plain-r2",replica=""}'] == "0"
    restarts = 'sgdeploy_unit_restarts_total{unit="sglang-ddtree-b15-r1.service",config="ddtree-b15",replica="1"}'
    assert series[restarts] == "3"
    assert series['sgdeploy_unit_active{unit="sglang-router-31200.service",config="ddtree-b15",replica=""}'] == "1"
    deploys = {k: v for k, v in series.items() if k.startswith("sgdeploy_deploy_timestamp_seconds")}
    # The latest record with an outcome of deployed / rolled_back / failed (an unchanged run is not a deploy).
    assert deploys == {
        'sgdeploy_deploy_timestamp_seconds{config="ddtree-b15",replica="0",release="rel-new",outcome="deployed"}':
            "1796464800",
        'sgdeploy_deploy_timestamp_seconds{config="ddtree-b15",replica="1",release="rel-new",outcome="deployed"}':
            "1796464860",
        'sgdeploy_deploy_timestamp_seconds{config="plain-r2",replica="",release="rel-y",outcome="rolled_back"}':
            "1796371200",
    }
    assert re.search(r"^# TYPE sgdeploy_unit_restarts_total counter$", text, re.M)


def test_an_empty_host_has_only_the_exporter_target(tmp_path):
    assert ex.scrape_targets("h", str(tmp_path / "none"), str(tmp_path / "none")) == [
        {"job": "sgdeploy-host", "path": "/metrics", "labels": {"host": "h"}}]


def test_the_exporter_refuses_other_methods_and_a_down_engine_is_a_502(host):
    state, units = host
    server = ex.make_server("127.0.0.1", 0, "h", "x:1", str(state), str(units))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def status(url, method="GET"):
        try:
            req = urllib.request.Request(url, method=method, data=b"" if method != "GET" else None)
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    assert status(base + "/metrics")[0] == 200
    assert status(base + "/metrics", "POST")[0] == 405
    assert status(base + "/generate", "DELETE")[0] == 405
    assert status(base + "/generate")[0] == 404
    code, body = status(base + "/metrics/engine/plain-r2")  # nothing listens on 127.0.0.1:30000 here
    assert code == 502, body
    code, body = status(base + "/metrics/targets/sgdeploy-host")
    assert code == 200 and json.loads(body) == [{"targets": ["x:1"], "labels": {"__metrics_path__": "/metrics",
                                                                                  "host": "h"}}]
    server.shutdown()


def test_the_role_installs_the_module_utils_file_the_module_imports():
    tasks = (ROLES / "sglang_exporter" / "tasks" / "main.yml").read_text()
    assert 'src: "{{ role_path }}/../../plugins/module_utils/sglang_exporter.py"' in tasks
    source = (ROLES.parent / "plugins" / "module_utils" / "sglang_exporter.py").read_text()
    # Standalone on the host: nothing of Ansible or the collection is imported.
    assert not re.search(r"^\s*(from|import) ansible", source, re.M)


def test_the_dashboard_uses_the_datasource_variable_and_the_one_accept_length_definition():
    dash = json.loads((ROLES / "sglang_monitoring" / "files" / "grafana" / "sglang.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dash["panels"])
    verify = "/ sum by (host, config) (rate(sglang:spec_verify_calls_total"
    assert any("rate(sglang:generation_tokens_total" in e and verify in e for e in exprs)
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    assert dash["annotations"]["list"][0]["expr"].startswith("sgdeploy_deploy_timestamp_seconds")
