"""Prometheus in the lab (issue 36): the monitoring role, the per-host exporters and the dashboard's queries.

The lab's opt-in monitoring inventory (``lab.add_monitoring``: the group ``monitoring`` = lab1, whose apt gets
Debian's real ``prometheus`` .deb from the lab's signed repository) runs ``playbooks/monitoring.yml`` after a
deploy of two replicas behind the router on lab1. Then: every engine, router and exporter is a target of the
lab's real Prometheus, up, with the labels host, config, release and replica; the exporter serves metrics only
(any other path or method is refused); after some traffic through the router, every panel's, variable's and
annotation's query of the Grafana dashboard parses and returns series from that Prometheus.
Simulated engines: proves the plumbing and the metric names (SGLang 0.5.23's, which the simulator emits).
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "tests" / "lab" / "configs" / "lab-replicas-b15.yml"
COLLAPSE = REPO / "tests" / "lab" / "configs" / "lab-alert-collapse.yml"
COLLAPSE_PORT = 31450
# The alert rules' windows divided by this (sgdeploy rules --time-scale): 5m -> 15s, for 10m -> 30s.
ALERT_TIME_SCALE = 20
DASHBOARD = (REPO / "collections" / "ansible_collections" / "sgdeploy" / "host" / "roles" / "sglang_monitoring"
             / "files" / "grafana" / "sglang.json")
ROUTER_PORT = 31200
EXPORTER_PORT = 9468
PROMETHEUS_PORT = 9090
SCRAPE_S = 5  # the lab's scrape interval (lab.add_monitoring)


def _get(url: str, timeout: float = 10) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - the lab's own addresses
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _post(url: str, body: dict, timeout: float = 60) -> int:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
            resp.read()
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.fixture(scope="module")
def monitored(lab):
    """lab-replicas-b15 on lab1, then the monitoring playbook on the monitoring inventory; Prometheus's URL.
    The exporters and Prometheus are stopped at the end (the other lab tests do not expect them)."""
    import lab as labmod

    inventory = labmod.add_monitoring(lab.config)
    for config in (CONFIG, COLLAPSE):
        lab.ansible_playbook("playbooks/deploy.yml", "--limit", "lab1", extra_vars={"config": str(config)})
    start = time.monotonic()
    proc = lab.ansible_playbook("playbooks/monitoring.yml", "-i", str(inventory), extra_vars={
        "sglang_monitoring_alert_configs": [str(CONFIG.relative_to(REPO)), str(COLLAPSE.relative_to(REPO))],
        "sglang_monitoring_alert_time_scale": ALERT_TIME_SCALE})
    print(f"monitoring playbook: {time.monotonic() - start:.0f}s")
    yield {"prometheus": f"http://{lab.address('lab1')}:{PROMETHEUS_PORT}", "play": proc.stdout}
    lab.ssh("lab1", "systemctl disable --now prometheus.service sglang-lab-alert-collapse.service", check=False)
    for host in lab.hosts:
        lab.ssh(host, "systemctl disable --now sglang-exporter.service", check=False)


def _query(prometheus: str, expr: str) -> dict:
    status, body = _get(f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    data = json.loads(body)
    assert status == 200 and data.get("status") == "success", f"{expr!r}: {status} {data}"
    return data["data"]


def _current(lab, host: str, name: str) -> dict:
    return json.loads(lab.ssh(host, f"cat /var/lib/sglang-deploy/{name}/current.json").stdout)


def test_every_engine_and_router_is_a_target_up_with_its_labels(lab, monitored):
    release = _current(lab, "lab1", "lab-replicas-b15-r0")["release"]
    assert release == _current(lab, "lab1", "lab-replicas-b15-r1")["release"]
    status, body = _get(f"{monitored['prometheus']}/api/v1/targets?state=active")
    assert status == 200
    targets = json.loads(body)["data"]["activeTargets"]
    seen = {(t["labels"]["job"], t["labels"].get("host"), t["labels"].get("config", ""),
             t["labels"].get("replica", "")): t for t in targets}
    want = [("sgdeploy-host", h, "", "") for h in lab.hosts]
    want += [("sglang-engine", "lab1", "lab-replicas-b15", "0"), ("sglang-engine", "lab1", "lab-replicas-b15", "1"),
             ("sglang-router", "lab1", "lab-replicas-b15", "")]
    for key in want:
        assert key in seen, f"no target {key}; targets: {sorted(seen)}"
        target = seen[key]
        assert target["health"] == "up", f"{key}: {target['health']} {target.get('lastError')}"
        if key[0] != "sgdeploy-host":
            assert target["labels"]["release"] == release, target["labels"]
            assert target["scrapeUrl"].startswith(f"http://{lab.address('lab1')}:{EXPORTER_PORT}/metrics/"), target
    # Every target up, whatever else the hosts run (earlier tests' configs on lab2).
    assert all(t["health"] == "up" for t in targets), [(t["scrapeUrl"], t.get("lastError")) for t in targets
                                                         if t["health"] != "up"]
    assert "targets, all up" in monitored["play"]


def test_the_exporter_serves_metrics_only(lab, monitored):
    base = f"http://{lab.address('lab1')}:{EXPORTER_PORT}"
    status, body = _get(f"{base}/metrics")
    assert status == 200 and b"sgdeploy_unit_active{" in body and b"sgdeploy_deploy_timestamp_seconds{" in body
    status, body = _get(f"{base}/metrics/engine/lab-replicas-b15-r0")
    assert status == 200 and b"sglang:spec_verify_calls_total" in body
    status, body = _get(f"{base}/metrics/router/{ROUTER_PORT}")
    assert status == 200 and b"smg_" in body
    for path in ("/generate", "/health", "/metrics/engine/nope", "/metrics/router/1", "/metrics/engine/../../generate",
                 "/workers", "/metrics/targets/nope"):
        assert _get(base + path)[0] == 404, path
    assert _post(f"{base}/metrics", {"text": "x"}) == 405
    assert _post(f"{base}/generate", {"text": "x", "sampling_params": {"max_new_tokens": 1}}) == 405


def _dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = [(f"panel {p['title']!r} {t['refId']}", t["expr"]) for p in dash["panels"] for t in p["targets"]]
    out += [(f"annotation {a['name']!r}", a["expr"]) for a in dash["annotations"]["list"] if a.get("expr")]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            m = re.fullmatch(r"label_values\((.*), *(\w+)\)", var["query"]["query"])
            assert m, var
            out.append((f"variable {var['name']!r}", f"group by ({m.group(2)}) ({m.group(1)})"))
    return out


def _grafana_to_promql(expr: str) -> str:
    """The dashboard's Grafana variables as Grafana would send them with every host and config selected."""
    return (expr.replace("$__rate_interval", f"{6 * SCRAPE_S}s").replace("$host", ".*").replace("$config", ".*"))


def test_every_dashboard_query_returns_series_after_traffic(lab, monitored):
    router = f"http://{lab.address('lab1')}:{ROUTER_PORT}/generate"
    body = {"text": "Write one sentence about the sea.", "sampling_params": {"temperature": 0, "max_new_tokens": 24}}
    with ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(lambda _: _post(router, body), range(16)))
    assert codes == [200] * 16, codes
    time.sleep(3 * SCRAPE_S)  # scrapes after the traffic, within the rate window
    queries = _dashboard_queries()
    assert len(queries) >= 15
    empty = []
    for what, expr in queries:
        data = _query(monitored["prometheus"], _grafana_to_promql(expr))
        if not data["result"]:
            empty.append(f"{what}: {expr}")
    assert not empty, "queries with no series:\n" + "\n".join(empty)
    # The accept length of the dashboard is a number in the simulator's range, per host and config.
    accept = _query(monitored["prometheus"], _grafana_to_promql(_dashboard_queries()[0][1]))["result"]
    values = {(r["metric"]["host"], r["metric"]["config"]): float(r["value"][1]) for r in accept}
    assert 1.0 < values[("lab1", "lab-replicas-b15")] < 17.0, values


def _alerts(prometheus: str, name: str) -> list[dict]:
    status, body = _get(f"{prometheus}/api/v1/alerts")
    assert status == 200, body
    return [a for a in json.loads(body)["data"]["alerts"] if a["labels"].get("alertname") == name]


def test_the_accept_length_alert_fires_on_a_collapse_and_not_on_a_healthy_engine(lab, monitored):
    """Issue 36 deliver 5: the rules made from the configs' own thresholds (gates.min_accept_length 8) fire in the
    lab's real Prometheus when an engine's acceptance collapses under live traffic, and stay quiet for the healthy
    replicas beside it under the same load. Windows divided by ALERT_TIME_SCALE (the same expressions)."""
    host = lab.address("lab1")
    urls = [f"http://{host}:{COLLAPSE_PORT}/generate", f"http://{host}:{ROUTER_PORT}/generate"]
    body = {"text": "Write one sentence about the sea.", "sampling_params": {"temperature": 0, "max_new_tokens": 48}}
    stop = threading.Event()
    codes: list[int] = []

    def client(url: str) -> None:
        while not stop.is_set():
            codes.append(_post(url, body))
            time.sleep(0.3)

    threads = [threading.Thread(target=client, args=(url,), daemon=True) for url in urls for _ in range(2)]
    for t in threads:
        t.start()
    firing: list[dict] = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not firing:
            time.sleep(SCRAPE_S)
            firing = [a for a in _alerts(monitored["prometheus"], "SGLangAcceptLengthLow") if a["state"] == "firing"]
    finally:
        stop.set()
        for t in threads:
            t.join(70)
    assert firing, "SGLangAcceptLengthLow never fired for the collapsed engine within 240 s"
    assert {a["labels"]["config"] for a in firing} == {"lab-alert-collapse"}, firing
    assert all(a["labels"]["host"] == "lab1" for a in firing), firing
    assert "below gates.min_accept_length 8 of config lab-alert-collapse" in firing[0]["annotations"]["description"], \
        firing[0]["annotations"]
    healthy = [a for a in _alerts(monitored["prometheus"], "SGLangAcceptLengthLow")
               if a["labels"].get("config") == "lab-replicas-b15"]
    assert healthy == [], healthy
    assert codes and set(codes) == {200}, sorted(set(codes))
