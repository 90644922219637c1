# Copyright: sgdeploy contributors. Apache-2.0
"""The sglang-router's worker API, as the pinned version (0.3.2) has it (docs/router.md):

- ``GET /workers`` -> ``{"workers": [{"id", "url", "is_healthy", "load", ...}], "total", ...}``
- ``POST /workers`` with ``{"url": URL}`` -> 202, the worker is added in the background (the router
  probes its connection mode, ``/server_info`` and ``/model_info`` first)
- ``DELETE /workers/<id>`` -> 202, removed in the background; requests it already forwarded finish
- ``GET /health`` (the router itself), ``GET /readiness`` (200 once a healthy worker is registered)

The 0.2-era ``/add_worker``, ``/remove_worker`` and ``/list_workers`` answer 404 in this version.
"""

from __future__ import annotations

import json
import time

from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_health import http


class RouterError(Exception):
    """The router did not answer as its API says; the message is one line."""


def _norm(url):
    return url.rstrip("/")


def workers(router_url, timeout=5.0):
    """{worker url: {"id", "healthy", "load"}} as the router lists them."""
    try:
        status, body = http("GET", _norm(router_url) + "/workers", timeout=timeout)
    except OSError as exc:
        raise RouterError(f"router {router_url} does not answer: {exc}") from None
    if status != 200:
        raise RouterError(f"router {router_url}: GET /workers answered {status}")
    try:
        listed = json.loads(body)["workers"]
    except (ValueError, KeyError, TypeError):
        raise RouterError(f"router {router_url}: GET /workers did not answer a worker list") from None
    return {_norm(w["url"]): {"id": w["id"], "healthy": bool(w.get("is_healthy")), "load": w.get("load")}
            for w in listed}


def add(router_url, worker_url, timeout=5.0):
    try:
        status, body = http("POST", _norm(router_url) + "/workers", {"url": _norm(worker_url)}, timeout=timeout)
    except OSError as exc:
        raise RouterError(f"router {router_url} does not answer: {exc}") from None
    if status not in (200, 201, 202):
        raise RouterError(f"router {router_url}: adding {worker_url} answered {status}: "
                          f"{body[:200].decode(errors='replace')}")


def remove(router_url, worker_id, timeout=5.0):
    try:
        status, _ = http("DELETE", _norm(router_url) + "/workers/" + worker_id, timeout=timeout)
    except OSError as exc:
        raise RouterError(f"router {router_url} does not answer: {exc}") from None
    if status not in (200, 202, 204, 404):
        raise RouterError(f"router {router_url}: removing worker {worker_id} answered {status}")


def settle(router_url, present, absent, timeout_s, poll_s=0.5):
    """Wait until every URL of ``present`` is listed and healthy and none of ``absent`` is listed.
    Returns (ok, listing, detail)."""
    deadline = time.monotonic() + timeout_s
    present = [_norm(u) for u in present]
    absent = [_norm(u) for u in absent]
    while True:
        listing = workers(router_url)
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
