# Copyright: sgdeploy contributors. Apache-2.0
"""The per-host metrics exporter and the one definition of a host's scrape targets (docs/monitoring.md).

Standard library only and no import of the collection: the role sglang_exporter installs this very file as
the program of ``sglang-exporter.service``, and the module ``sgdeploy.host.sglang_exporter_targets`` (with which
the monitoring role checks that Prometheus scrapes every target, up and labelled) imports it.

What a host serves (read fresh from the host at every request; nothing cached):

- engines: every ``<state dir>/<name>/current.json`` (a deploy, or replica ``i`` of a config as ``<config>-r<i>``),
  relayed from ``http://<bind address>:<first port>/metrics`` at ``GET /metrics/engine/<name>``;
- routers: every ``sglang-router-<port>.service`` (role sglang_router), relayed from its metrics port at
  ``GET /metrics/router/<port>``;
- the exporter's own series at ``GET /metrics``: ``sgdeploy_unit_active``, ``sgdeploy_unit_restarts_total``
  (systemd's NRestarts), ``sgdeploy_deploy_timestamp_seconds`` (the host's latest record per config);
- the targets themselves, for Prometheus' HTTP service discovery, at ``GET /metrics/targets/<job>`` (one target
  group per target: this exporter's address, ``__metrics_path__`` and the labels): a deploy, a rollback or a
  change of replicas changes what Prometheus scrapes and its labels (release!) within a refresh, without a run
  of the monitoring role.

Anything else (another path, another method, a name that is not deployed) is refused: the listener gives read
access to metrics only, never to an engine's API.

    python3 sglang_exporter.py --bind ADDRESS --port PORT --host NAME --advertise ADDRESS:PORT
                               [--state-dir DIR] [--unit-dir DIR]
"""

from __future__ import annotations

import argparse
import calendar
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request

STATE_DIR = "/var/lib/sglang-deploy"
UNIT_DIR = "/etc/systemd/system"
ROUTER_UNIT_GLOB = "sglang-router-*.service"
JOBS = ("sglang-engine", "sglang-router", "sgdeploy-host")
# The outcomes a deploy timestamp is exported for (an "unchanged" run changed nothing).
OUTCOMES = ("deployed", "rolled_back", "failed")
REPLICA_RE = re.compile(r"^(?P<config>.+)-r(?P<replica>0|[1-9][0-9]*)$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
RELAY_TIMEOUT_S = 10.0
MAX_BODY = 32 * 1024 * 1024
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _host_of(address):
    """Where this host reaches a service bound to ``address`` (0.0.0.0 on loopback; IPv6 in brackets)."""
    address = address or "127.0.0.1"
    if address in ("0.0.0.0", "::"):
        return "127.0.0.1" if address == "0.0.0.0" else "[::1]"
    return f"[{address}]" if ":" in address else address


def parse_router_unit(text):
    """{address, port, metrics_port, workers} of a router unit (its ExecStart line, as role sglang_router writes it)."""
    argv = []
    for line in text.splitlines():
        if line.startswith("ExecStart="):
            argv = shlex.split(line[len("ExecStart="):])

    def flag(name):
        return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else None

    workers = argv[argv.index("--worker-urls") + 1:] if "--worker-urls" in argv else []
    return {"address": flag("--prometheus-host") or flag("--host"), "port": flag("--port"),
            "metrics_port": flag("--prometheus-port"), "workers": [w for w in workers if not w.startswith("--")]}


def engines(state_dir=STATE_DIR):
    """Every deploy of the host: {name, config, replica, release, unit, url} (url: its /metrics), by name.

    ``replica`` is "" for a config's single engine; for ``<config>-r<i>`` that a router of the host fronts
    (routers() names the replicas), routers() sets it to ``i`` and ``config`` to ``<config>``."""
    out = []
    for path in sorted(glob.glob(os.path.join(state_dir, "*", "current.json"))):
        data = _read_json(path)
        name = os.path.basename(os.path.dirname(path))
        if not isinstance(data, dict) or not data.get("unit_name") or not data.get("ports") or not NAME_RE.match(name):
            continue
        try:
            port = int(data["ports"][0])
        except (TypeError, ValueError, IndexError):
            continue
        out.append({"name": name, "config": data.get("config") or name, "replica": "",
                    "release": str(data.get("release") or ""), "unit": data["unit_name"],
                    "url": f"http://{_host_of(data.get('bind_address'))}:{port}/metrics", "port": port})
    return out


def routers(unit_dir=UNIT_DIR, engine_list=None):
    """Every router unit of the host: {port, unit, config, release, url}; marks the engines it fronts as replicas.

    A router on port P fronts replica i of its config on port P + 1 + 2i (docs/router.md, the port rule): the
    engine named ``<config>-r<i>`` on that port is replica i; the router takes that config and replica 0's
    release (a rollout in progress changes it replica by replica)."""
    engine_list = engines() if engine_list is None else engine_list
    out = []
    for path in sorted(glob.glob(os.path.join(unit_dir, ROUTER_UNIT_GLOB))):
        try:
            with open(path, encoding="utf-8") as fh:
                parsed = parse_router_unit(fh.read())
            port, metrics_port = int(parsed["port"]), int(parsed["metrics_port"])
        except (OSError, TypeError, ValueError):
            continue
        config, release = "", ""
        for e in engine_list:
            m = REPLICA_RE.match(e["name"])
            if m and e["port"] == port + 1 + 2 * int(m.group("replica")):
                e["config"], e["replica"] = m.group("config"), m.group("replica")
                if not config or m.group("replica") == "0":
                    config, release = m.group("config"), e["release"]
        out.append({"port": port, "unit": os.path.basename(path), "config": config, "release": release,
                    "url": f"http://{_host_of(parsed['address'])}:{metrics_port}/metrics"})
    return out


def scrape_targets(host, state_dir=STATE_DIR, unit_dir=UNIT_DIR):
    """The host's scrape targets, each {job, path, labels}: the exporter itself (job sgdeploy-host), each engine
    (sglang-engine) and each router (sglang-router), labelled host, config, release and replica."""
    engine_list = engines(state_dir)
    router_list = routers(unit_dir, engine_list)
    out = [{"job": "sgdeploy-host", "path": "/metrics", "labels": {"host": host}}]
    for e in engine_list:
        out.append({"job": "sglang-engine", "path": f"/metrics/engine/{e['name']}",
                    "labels": {"host": host, "config": e["config"], "release": e["release"], "replica": e["replica"]}})
    for r in router_list:
        out.append({"job": "sglang-router", "path": f"/metrics/router/{r['port']}",
                    "labels": {"host": host, "config": r["config"], "release": r["release"], "replica": ""}})
    return out


def _epoch(stamp):
    try:
        return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")))
    except (TypeError, ValueError):
        return None


def latest_records(state_dir=STATE_DIR):
    """The latest record of each deploy of the host whose outcome is one of OUTCOMES: {name: record}."""
    out = {}
    for folder in sorted(glob.glob(os.path.join(state_dir, "*", "records"))):
        name = os.path.basename(os.path.dirname(folder))
        for path in sorted(glob.glob(os.path.join(folder, "*.json")), reverse=True):
            record = _read_json(path)
            if isinstance(record, dict) and record.get("outcome") in OUTCOMES and _epoch(record.get("finished")):
                out[name] = record
                break
    return out


def unit_states(units, systemctl="systemctl"):
    """{unit: (active, restarts)} from one ``systemctl show`` (active: 1 when ActiveState is active)."""
    if not units:
        return {}
    try:
        proc = subprocess.run([systemctl, "show", "--property=Id,ActiveState,NRestarts", "--", *units],
                              capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out = {}
    for block, unit in zip(proc.stdout.strip().split("\n\n"), units, strict=False):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        restarts = props.get("NRestarts", "")
        out[unit] = (1 if props.get("ActiveState") == "active" else 0, int(restarts) if restarts.isdigit() else 0)
    return out


def _labels(**labels):
    def esc(value):
        return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}"


def own_metrics(state_dir=STATE_DIR, unit_dir=UNIT_DIR, states=None):
    """The exporter's own series in Prometheus' text format (``states``: unit_states' result, for tests)."""
    engine_list = engines(state_dir)
    router_list = routers(unit_dir, engine_list)
    units = [(e["unit"], e["config"], e["replica"]) for e in engine_list]
    zero = (0, 0)
    units += [(r["unit"], r["config"], "") for r in router_list]
    states = unit_states([u for u, _, _ in units]) if states is None else states
    lines = ["# HELP sgdeploy_unit_active 1 when the unit of an engine or router is active, else 0.",
             "# TYPE sgdeploy_unit_active gauge"]
    lines += [f"sgdeploy_unit_active{_labels(unit=u, config=c, replica=r)} {states.get(u, zero)[0]}"
              for u, c, r in units]
    lines += ["# HELP sgdeploy_unit_restarts_total Restarts of the unit by systemd (NRestarts, since it was last "
              "started by hand or by a deploy).", "# TYPE sgdeploy_unit_restarts_total counter"]
    lines += [f"sgdeploy_unit_restarts_total{_labels(unit=u, config=c, replica=r)} {states.get(u, zero)[1]}"
              for u, c, r in units]
    lines += ["# HELP sgdeploy_deploy_timestamp_seconds When the host's latest deploy of the config finished "
              "(its record), by outcome.", "# TYPE sgdeploy_deploy_timestamp_seconds gauge"]
    by_name = {e["name"]: e for e in engine_list}
    for name, record in sorted(latest_records(state_dir).items()):
        e = by_name.get(name)
        m = REPLICA_RE.match(name)
        config, replica = (e["config"], e["replica"]) if e else (m.group("config"), m.group("replica")) if m else (
            name, "")
        labels = _labels(config=config, replica=replica, release=record.get("release") or "", outcome=record["outcome"])
        lines.append(f"sgdeploy_deploy_timestamp_seconds{labels} {_epoch(record['finished']):.0f}")
    return "\n".join(lines) + "\n"


def discovery(job, host, advertise, state_dir=STATE_DIR, unit_dir=UNIT_DIR):
    """Prometheus' HTTP service discovery document of one job: a target group per target of the host."""
    return [{"targets": [advertise], "labels": {"__metrics_path__": t["path"], **t["labels"]}}
            for t in scrape_targets(host, state_dir, unit_dir) if t["job"] == job]


def route(path, state_dir=STATE_DIR, unit_dir=UNIT_DIR):
    """What a GET of ``path`` serves: ("own", None), ("targets", job), ("relay", url) or (None, reason): a 404."""
    path = path.split("?", 1)[0]
    if path == "/metrics":
        return "own", None
    m = re.fullmatch(r"/metrics/(engine|router|targets)/([A-Za-z0-9._-]+)", path)
    if not m:
        return None, "only /metrics, /metrics/engine/NAME, /metrics/router/PORT and /metrics/targets/JOB are served"
    kind, name = m.groups()
    if kind == "targets":
        return ("targets", name) if name in JOBS else (None, f"no job {name}; jobs: {', '.join(JOBS)}")
    engine_list = engines(state_dir)
    if kind == "engine":
        for e in engine_list:
            if e["name"] == name:
                return "relay", e["url"]
        return None, f"no engine {name} is deployed on this host"
    for r in routers(unit_dir, engine_list):
        if str(r["port"]) == name:
            return "relay", r["url"]
    return None, f"no router on port {name} on this host"


def relay(url, timeout=RELAY_TIMEOUT_S):
    """(status, content type, body) of the target's /metrics; 502 when it does not answer 200."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=timeout) as resp:  # noqa: S310
            body = resp.read(MAX_BODY + 1)
            if len(body) > MAX_BODY:
                return 502, "text/plain", b"the target's metrics are larger than the exporter relays\n"
            return 200, resp.headers.get("Content-Type") or CONTENT_TYPE, body
    except urllib.error.HTTPError as err:
        return 502, "text/plain", f"the target answered {err.code}\n".encode()
    except (OSError, ValueError) as err:
        return 502, "text/plain", f"the target does not answer: {err}\n".encode()


def make_server(bind, port, host, advertise, state_dir=STATE_DIR, unit_dir=UNIT_DIR):
    """The exporter's HTTP server (not started)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        server_version = "sglang-exporter"
        sys_version = ""

        def _send(self, status, ctype, body, head=False):
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def do_GET(self):  # noqa: N802 - http.server's name
            kind, arg = route(self.path, state_dir, unit_dir)
            if kind == "own":
                self._send(200, CONTENT_TYPE, own_metrics(state_dir, unit_dir).encode())
            elif kind == "targets":
                body = json.dumps(discovery(arg, host, advertise, state_dir, unit_dir)).encode()
                self._send(200, "application/json", body)
            elif kind == "relay":
                self._send(*relay(arg))
            else:
                self._send(404, "text/plain", (arg + "\n").encode())

        def _refuse(self):
            self._send(405, "text/plain", b"read-only: only GET is served\n")

        do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _refuse  # noqa: N815

        def log_message(self, format, *args):  # noqa: A002 - http.server's signature
            pass  # one line per scrape would fill the journal

    server = ThreadingHTTPServer((bind, port), Handler)
    server.daemon_threads = True
    return server


def main(argv=None):
    parser = argparse.ArgumentParser(prog="sglang-exporter", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bind", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", required=True, help="the host label (its inventory hostname)")
    parser.add_argument("--advertise", required=True, help="ADDRESS:PORT where Prometheus reaches this exporter")
    parser.add_argument("--state-dir", default=STATE_DIR)
    parser.add_argument("--unit-dir", default=UNIT_DIR)
    args = parser.parse_args(argv)
    try:
        server = make_server(args.bind, args.port, args.host, args.advertise, args.state_dir, args.unit_dir)
    except OSError as err:
        print(f"sglang-exporter: cannot listen on {args.bind}:{args.port}: {err.strerror or err}", file=sys.stderr)
        return 1
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
