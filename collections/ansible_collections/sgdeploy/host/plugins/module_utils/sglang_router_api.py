# Copyright: sgdeploy contributors. Apache-2.0
"""The sglang-router's worker API, as the pinned version (0.3.2) has it (docs/router.md):

- ``GET /workers`` -> ``{"workers": [{"id", "url", "is_healthy", "load", ...}], "total", ...}``
- ``POST /workers`` with ``{"url": URL}`` -> 202, the worker is added in the background (the router
  probes its connection mode, ``/server_info`` and ``/model_info`` first)
- ``DELETE /workers/<id>`` -> 202, removed in the background; requests it already forwarded finish
- ``GET /health`` (the router itself), ``GET /readiness`` (200 once a healthy worker is registered)

The 0.2-era ``/add_worker``, ``/remove_worker`` and ``/list_workers`` answer 404 in this version.

The worker API is the router's control plane: it answers 401 without the admin key the role made on
the host (``SGLANG_ROUTER_CONTROL_KEY`` in ``/etc/sglang/router-<port>.env``, 0640
root:sglang-router; 0.3.2's ``--control-plane-api-keys``). Every call here sends it as
``Authorization: Bearer``, read from that file by port (these run on the host as root); it is never
returned, logged or put in an error message.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request

ENV_DIR = "/etc/sglang"
CONTROL_KEY_VAR = "SGLANG_ROUTER_CONTROL_KEY"
API_KEY_VAR = "SGLANG_ROUTER_API_KEY"


def env_file(port, env_dir=ENV_DIR):
    """The router's environment file (its keys), by its port."""
    return os.path.join(env_dir, f"router-{int(port)}.env")


def read_env(path):
    """{NAME: value} of an environment file the role wrote (NAME="value" lines); {} when missing."""
    try:
        with open(path, encoding="utf-8") as fh:
            return read_env_text(fh.read())
    except FileNotFoundError:
        return {}


def read_env_text(text):
    """{NAME: value} of an environment file's text (NAME="value" lines, as the role writes them)."""
    out = {}
    for line in text.splitlines():
        if "=" not in line or line.lstrip().startswith("#"):
            continue
        name, value = line.split("=", 1)
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        out[name.strip()] = value
    return out


def control_key(router_url, env_dir=ENV_DIR):
    """The admin key of the router at ``router_url`` (by its port), or None when its file has none."""
    port = urllib.parse.urlsplit(router_url).port
    if port is None:
        return None
    return read_env(env_file(port, env_dir)).get(CONTROL_KEY_VAR) or None


def http(method, url, body=None, timeout=5.0, key=None):
    """(status, body bytes); raises OSError when nothing answers. ``key``: sent as a bearer token."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read() or b""


def _key(router_url, key):
    return control_key(router_url) if key is None else key


class RouterError(Exception):
    """The router did not answer as its API says; the message is one line."""


def _norm(url):
    return url.rstrip("/")


def workers(router_url, timeout=5.0, key=None):
    """{worker url: {"id", "healthy", "load"}} as the router lists them (``key``: the router's admin key;
    None reads it from the router's environment file)."""
    try:
        status, body = http("GET", _norm(router_url) + "/workers", timeout=timeout, key=_key(router_url, key))
    except OSError as exc:
        raise RouterError(f"router {router_url} does not answer: {exc}") from None
    if status in (401, 403):
        raise RouterError(f"router {router_url}: GET /workers answered {status}: the router's admin key "
                          f"({CONTROL_KEY_VAR} in its environment file) is missing or not the one it runs with")
    if status != 200:
        raise RouterError(f"router {router_url}: GET /workers answered {status}")
    try:
        listed = json.loads(body)["workers"]
    except (ValueError, KeyError, TypeError):
        raise RouterError(f"router {router_url}: GET /workers did not answer a worker list") from None
    return {_norm(w["url"]): {"id": w["id"], "healthy": bool(w.get("is_healthy")), "load": w.get("load")}
            for w in listed}


def workers_wait(router_url, timeout_s, poll_s=1.0, key=None):
    """workers(), retried while the router does not answer (e.g. during systemd's restart delay), up to
    ``timeout_s``; then the last RouterError is raised."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return workers(router_url, key=key)
        except RouterError:
            if time.monotonic() >= deadline:
                raise
        time.sleep(poll_s)


def add(router_url, worker_url, timeout=5.0, key=None):
    try:
        status, body = http("POST", _norm(router_url) + "/workers", {"url": _norm(worker_url)}, timeout=timeout,
                            key=_key(router_url, key))
    except OSError as exc:
        raise RouterError(f"router {router_url} does not answer: {exc}") from None
    if status not in (200, 201, 202):
        raise RouterError(f"router {router_url}: adding {worker_url} answered {status}: "
                          f"{body[:200].decode(errors='replace')}")


def remove(router_url, worker_id, timeout=5.0, key=None):
    try:
        status, _ = http("DELETE", _norm(router_url) + "/workers/" + worker_id, timeout=timeout,
                         key=_key(router_url, key))
    except OSError as exc:
        raise RouterError(f"router {router_url} does not answer: {exc}") from None
    if status not in (200, 202, 204, 404):
        raise RouterError(f"router {router_url}: removing worker {worker_id} answered {status}")


def settle(router_url, present, absent, timeout_s, poll_s=0.5, key=None):
    """Wait until every URL of ``present`` is listed and healthy and none of ``absent`` is listed.
    Returns (ok, listing, detail)."""
    deadline = time.monotonic() + timeout_s
    present = [_norm(u) for u in present]
    absent = [_norm(u) for u in absent]
    while True:
        listing = workers(router_url, key=key)
        missing = [u for u in present if not listing.get(u, {}).get("healthy")]
        left = [u for u in absent if u in listing]
        if not missing and not left:
            return True, listing, "router lists the wanted workers"
        if time.monotonic() >= deadline:
            detail = []
            if missing:
                detail.append("not listed healthy: " + ", ".join(missing))
            if left:
                detail.append("still listed: " + ", ".join(left))
            return False, listing, "; ".join(detail)
        time.sleep(poll_s)


UNIT_DIR = "/etc/systemd/system"
ROUTER_UNIT_GLOB = "sglang-router-*.service"


def parse_router_unit(text):
    """{address, port, metrics_port, workers, argv} from a router unit's ExecStart line (the unit file
    is the source of its replicas: the router keeps its list only in memory)."""
    import shlex

    argv = []
    for line in text.splitlines():
        if line.startswith("ExecStart="):
            argv = shlex.split(line[len("ExecStart="):])

    def flag(name):
        return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else None

    workers = argv[argv.index("--worker-urls") + 1:] if "--worker-urls" in argv else []
    return {"address": flag("--host"), "port": flag("--port"), "metrics_port": flag("--prometheus-port"),
            "workers": [w for w in workers if not w.startswith("--")], "argv": argv}


def router_units(unit_dir=UNIT_DIR):
    """Every router unit the role sglang_router installed, parsed (parse_router_unit) with its name."""
    import glob
    import os

    out = []
    for path in sorted(glob.glob(os.path.join(unit_dir, ROUTER_UNIT_GLOB))):
        with open(path, encoding="utf-8") as fh:
            out.append({"unit": os.path.basename(path), **parse_router_unit(fh.read())})
    return out


def compare(listing, expected):
    """What the router lists against what its unit says it fronts: (strangers, missing, unhealthy) URLs.
    A stranger is a worker nobody deployed (someone added it through the API): never expected."""
    expected = [_norm(u) for u in expected]
    strangers = sorted(u for u in listing if u not in expected)
    missing = [u for u in expected if u not in listing]
    unhealthy = [u for u in expected if u in listing and not listing[u]["healthy"]]
    return strangers, missing, unhealthy
