# Copyright: sgdeploy contributors. Apache-2.0
"""A rollout of a config's replicas behind the router, planned whole before anything changes (read-only;
issue 34 item 3, docs/router.md "Replica changes").

Given the layout the renderer gives (``sgdeploy render --json``: replicas with index, name, unit, ports,
GPUs and URL; the router's port and metrics port), the configs deployed on the host (their
``current.json``), the host's listening sockets and the router unit installed on that port, decide up
front, for every replica at once:

- each replica's GPUs exist on the host (``gpu_count``);
- no replica would stop or displace another config that the operator did not name (the same rule as one
  deploy, module_utils/sglang_deploy_conflicts.py);
- every port of the layout (each replica's port and NCCL port, the router's port and its metrics port)
  is free or held by what the rollout itself stops or moves: a replica's predecessor (the old config's
  replica it replaces), a surplus replica (retired before the router moves), or the router itself (its
  own port; its old metrics port, which it leaves when it is restarted on the new one);
- the surplus: deployed replicas that the router fronts (its unit lists their URL) or that carry the
  config's replica names (``<config>-r<i>``), which no replica of the new layout replaces: after a scale
  down they are drained out of the router, stopped, disabled and their unit and env files removed.

Anything else is refused with one line naming the thing, the value and what is allowed.
"""

from __future__ import annotations

import re

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_conflicts as conflicts_mod
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_router_api as router_api


class ReplicaPlanError(Exception):
    """The rollout does not fit this host: one line, nothing was changed."""


def url_of(deploy):
    """The HTTP URL a deployed config (its current.json) serves on, or None."""
    ports = deploy.get("ports") or []
    bind = deploy.get("bind_address")
    return f"http://{bind}:{ports[0]}" if ports and bind else None


def replica_deploys(layout):
    """Each replica of the layout as a deploy description the conflict rules take."""
    bind = layout["bind_address"]
    return [{"config": r["name"], "unit_name": r["unit_name"], "bind_address": bind,
             "ports": [r["port"], r["nccl_port"]], "gpus": list(r["gpus"]), "index": r["index"], "url": r["url"]}
            for r in layout["replicas"]]


def _collides(deploy, other):
    return other.get("config") == deploy["config"] or bool(conflicts_mod.collisions(deploy, other))


def plan(layout, gpu_count, deployed, sockets, router_unit=None, replaces=()):
    """The rollout's plan (see the module docstring). ``deployed``: current.json of every config of the host
    with ``active``/``enabled``; ``sockets``: listening sockets ({address, port, pids, process, unit});
    ``router_unit``: the installed router unit on the layout's port, parsed (sglang_router_api.parse_router_unit),
    or None. Raises ReplicaPlanError (one line) when the rollout would not fit."""
    config = layout["config"]
    bind = layout["bind_address"]
    router = layout.get("router") or {}
    reps = replica_deploys(layout)

    # GPUs: every replica's, before replica 0 changes.
    for r in reps:
        bad = [g for g in r["gpus"] if g >= gpu_count]
        if bad:
            raise ReplicaPlanError(
                f"config {config}: replica {r['index']} ({r['config']}) would run on GPUs {r['gpus']}: GPU index "
                f"{bad[0]} does not exist on this host (gpu_count {gpu_count}: indices 0-{gpu_count - 1}); "
                f"serving.replicas x serving.tp_size GPUs from serving.gpus must all exist")

    # Other configs a replica would stop or displace: named by REPLACES, or taken over whole.
    live = [d for d in deployed if d.get("active") or d.get("enabled")]
    for r in reps:
        try:
            conflicts_mod.conflicts(r, live, replaces)
        except conflicts_mod.ConflictError as exc:
            raise ReplicaPlanError(f"replica {r['index']}: {exc}") from None

    # What each replica's deploy stops (its predecessors), and the surplus.
    predecessors = {}
    for r in reps:
        predecessors[r["config"]] = [d for d in deployed if d.get("active") and _collides(r, d)]
    replaced = {d["config"] for ds in predecessors.values() for d in ds}
    names = {r["config"] for r in reps}
    fronted = {w.rstrip("/") for w in (router_unit or {}).get("workers", [])}
    own_name = re.compile(re.escape(config) + r"-r[0-9]+$")
    surplus = []
    for d in deployed:
        if d["config"] in names or d["config"] in replaced or any(_collides(r, d) for r in reps):
            continue
        if url_of(d) in fronted or own_name.match(d["config"]):
            surplus.append({"name": d["config"], "unit_name": d["unit_name"], "url": url_of(d),
                            "active": bool(d.get("active")), "enabled": bool(d.get("enabled"))})

    # Ports: free, or held by what the rollout stops or moves.
    router_unit_name = router.get("unit_name")
    old_metrics = (router_unit or {}).get("metrics_port")
    old_metrics = int(old_metrics) if old_metrics and str(old_metrics).isdigit() else None
    wanted = {}
    if router:
        wanted[int(router["port"])] = "the router's port"
        wanted[int(router["metrics_port"])] = "the router's metrics port"
    for r in reps:
        wanted[r["ports"][0]] = f"replica {r['index']}'s port"
        wanted[r["ports"][1]] = f"replica {r['index']}'s NCCL port"
    stopped_units = {d["unit_name"] for ds in predecessors.values() for d in ds} | {s["unit_name"] for s in surplus}
    for sock in sockets:
        port = sock["port"]
        if port not in wanted or not _overlaps(sock["address"], bind):
            continue
        unit = sock.get("unit")
        if unit and unit in stopped_units:
            continue
        if unit and unit == router_unit_name and (port == int(router["port"]) or port == old_metrics):
            continue
        who = "{} (pid {}".format(sock.get("process") or "?", ", ".join(map(str, sock.get("pids") or [])) or "?")
        who += f", unit {unit})" if unit else ")"
        raise ReplicaPlanError(
            f"config {config}: port {sock['address']}:{port} ({wanted[port]}) is already in use by {who}, which "
            f"this rollout would not stop; allowed: a free port, or one held by the config's own router or a "
            f"replica the rollout replaces or retires; free the port or change serving.port")

    router_moves = bool(router_unit and old_metrics is not None and router
                        and old_metrics != int(router["metrics_port"]))
    # Only a router of the layout before its metrics port was serving.port - 1 moves (P + 1 + 2N, which changed
    # with the replica count); when that old port is a new replica's, it moves first.
    router_first = router_moves and any(old_metrics in r["ports"] for r in reps)
    urls = [r["url"] for r in reps]
    stops = sorted({d["config"] for ds in predecessors.values() for d in ds if d["config"] not in names}
                   | {s["name"] for s in surplus})
    return {
        "config": config,
        "replicas": [{"index": r["index"], "name": r["config"], "url": r["url"], "gpus": r["gpus"],
                      "ports": r["ports"], "replaces": [d["config"] for d in predecessors[r["config"]]],
                      "serving": r["url"] in fronted or bool(predecessors[r["config"]])} for r in reps],
        "surplus": surplus,
        "router_moves": router_moves,
        "router_first": router_first,
        # A router that moves its metrics port first (its old metrics port is a new replica's)
        # restarts with the replicas that serve now; the new ones join through its API once deployed.
        "router_workers_first": [u for u in urls if u in fronted],
        "stops": stops,
        "line": _line(config, reps, surplus, router, router_moves, old_metrics),
    }


def strangers(layout, router_unit, listing):
    """Workers the running router lists (``listing``: its GET /workers) that neither its unit nor the layout
    names: added through its API by someone else. [(url, id)], sorted."""
    known = list((router_unit or {}).get("workers", [])) + [r["url"] for r in layout["replicas"]]
    return [(url, listing[url].get("id")) for url in router_api.compare(listing, known)[0]]


def refuse_strangers(layout, router_unit, listing, env_file):
    """Raise ReplicaPlanError naming every stranger worker and how to take it out (the rollout does not run
    beside a worker nobody deployed: it would keep routing clients to it)."""
    found = strangers(layout, router_unit, listing)
    if not found:
        return
    router = layout["router"]
    first = found[0][1] or "ID"
    raise ReplicaPlanError(
        f"config {layout['config']}: router {router['unit_name']} routes to {', '.join(u for u, _ in found)}, which "
        f"neither its unit nor this config names (a worker added through its API by someone else); a rollout does "
        f"not run beside a stranger worker, which would keep answering clients: look at it, take it out on the host "
        f"(curl -X DELETE -H \"Authorization: Bearer $(sed -n 's/^SGLANG_ROUTER_CONTROL_KEY=//p' {env_file})\" "
        f"{router['url']}/workers/{first}) and deploy again")


def with_live(result, listing):
    """The plan with what the running router lists (``listing``: {url: {"healthy", ...}}, its GET /workers):
    a replica serves when the router lists it healthy (a unit may still list an engine that was stopped), and
    a router that moves first restarts with only those."""
    healthy = {u for u, w in listing.items() if w.get("healthy")}
    for r in result["replicas"]:
        r["serving"] = r["url"] in healthy
    result["router_workers_first"] = [r["url"] for r in result["replicas"] if r["url"] in healthy]
    return result


def _overlaps(address, bind):
    return address in (bind, "0.0.0.0", "*", "::") or bind in ("0.0.0.0", "::")


def _line(config, reps, surplus, router, router_moves, old_metrics):
    parts = [f"{config}: {len(reps)} replica(s) "
             + ", ".join(f"{r['config']} (GPUs {r['gpus']}, ports {r['ports'][0]}/{r['ports'][1]})" for r in reps)]
    if router:
        parts.append(f"router on port {router['port']}, metrics {router['metrics_port']}"
                     + (f" (moves from {old_metrics}: the router restarts once)" if router_moves else ""))
    if surplus:
        parts.append("retires " + ", ".join(f"{s['name']} ({s['url']})" for s in surplus))
    return "; ".join(parts)
