"""The fleet router (issue 37 deliver 1): an sglang-router on each host of the inventory group ``routers`` (one, or
more for HA), each in front of the engine of a config on every GPU host (docs/router.md, "The fleet router").

``plan`` is what the deploy and the rollback ask of the controller before they touch any host: each GPU host's
engine URL (the config's layout at that host's bind address; with ``serving.replicas`` N > 1, each of the host's N
replicas, every one a worker of every fleet router, no per-host router), each fleet router's address and ports, how
many engines (replicas) a batch takes out at once (``max_unavailable``) and the rollout's batches: the canary (the
first GPU host's first replica) alone, then the others, round-robin over the hosts, ``max_unavailable`` at a time.
It refuses, in one line naming the thing, the value and what is allowed, a fleet the router could not reach or that
would not fit: an engine bound to loopback while the router runs on another host, two engines (or two routers) with
one URL, a bad ``max_unavailable``. The action plugin ``sgdeploy.host.controller_fleet`` calls it in-process.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from sgdeploy import controller, render, spec

DEFAULT_MAX_UNAVAILABLE = "1"


class FleetError(ValueError):
    """A fleet the deploy refuses before any change: one line."""


@dataclass(frozen=True)
class Host:
    """An inventory host: its name, where Ansible reaches it (ansible_host) and its sglang_bind_address."""

    name: str
    ansible_host: str
    bind_address: str = ""


def _is_loopback(address: str) -> bool:
    """spec.is_loopback, also for the inventory's host names of loopback and a bracketed IPv6 address."""
    return address in ("localhost", "localhost.localdomain") or spec.is_loopback(address.strip("[]"))


def batch_size(text: str, engines: int) -> int:
    """``max_unavailable`` (N engines, or N% of them, at least 1) as a number of engines; FleetError if not allowed."""
    raw = str(text).strip() or DEFAULT_MAX_UNAVAILABLE
    allowed = (f"a whole number from 1 to {max(1, engines - 1)}, or a percentage such as 25% "
               f"(of the {engines} engine(s); the canary goes alone first, and a batch may not take every engine out)")
    m = re.fullmatch(r"(\d+)(%?)", raw)
    if not m:
        raise FleetError(f"max_unavailable {raw!r} is not allowed: use {allowed}")
    value = int(m.group(1))
    if m.group(2):
        if not 1 <= value <= 100:
            raise FleetError(f"max_unavailable {raw!r} is not allowed: use {allowed}")
        return max(1, min(max(1, engines - 1), math.floor(engines * value / 100)))
    if not 1 <= value <= max(1, engines - 1):
        raise FleetError(f"max_unavailable {raw!r} is not allowed: use {allowed}")
    return value


def rollout_batches(engines: list[dict], batch: int, canary: bool = True) -> list[list[dict]]:
    """The rollout's batches: the canary (the first engine: the first GPU host's first replica) alone, then the
    others ``batch`` at a time, round-robin over the hosts (every host's replica 0, then every host's replica 1, ...),
    so that a batch takes engines of different hosts where it can. ``canary`` False (a rollback): every engine
    ``batch`` at a time in that order, the first with the others."""
    if not engines:
        return []
    hosts = list(dict.fromkeys(e["host"] for e in engines))
    first = [[engines[0]]] if canary else []
    rest = sorted(engines[len(first):], key=lambda e: (e["replica"] or 0, hosts.index(e["host"])))
    return first + [rest[i:i + batch] for i in range(0, len(rest), batch)]


def rollout_steps(batches: list[list[dict]]) -> list[dict]:
    """The batches as the GPU hosts' play runs them: each step at most one engine of each host (the hosts of a step
    roll theirs at the same time; a host with two engines in one batch rolls them in two steps, one after the other,
    so never more than the batch is out at once). Each step: its batch's number (0: the canary) and host -> engine."""
    steps = []
    for number, members in enumerate(batches):
        depth: dict[str, int] = {}
        rows: list[dict] = []
        for engine in members:
            k = depth.get(engine["host"], 0)
            depth[engine["host"]] = k + 1
            if k == len(rows):
                rows.append({"batch": number, "engines": {}})
            rows[k]["engines"][engine["host"]] = engine
        steps.extend(rows)
    return steps


def _router(config: spec.Config, host: Host, release: str) -> dict:
    """One fleet router: its host, address, ports, unit and URL (the config's serving.port at its bind address)."""
    settings = render.HostSettings(release_label=release, bind_address=host.bind_address or None)
    return {"host": host.name, "bind_address": render.bind_address(config, settings), "port": config.serving.port,
            "metrics_port": config.serving.port - 1, "unit_name": f"sglang-router-{config.serving.port}.service",
            "url": controller.service_url(config, settings)}


def plan(config: spec.Config, engines: list[Host], routers: list[Host], max_unavailable: str = "",
         release: str = "stock") -> dict:
    """The fleet of ``config``: engines (one per GPU host), its routers (each in front of every engine) and the batch
    size; FleetError if refused."""
    if not routers:
        raise FleetError("inventory group routers has no host: name the fleet router's host(s) there, or leave the "
                         "group out for a router per GPU host")
    if not engines:
        raise FleetError("inventory group gpu_hosts has no host: the fleet router needs at least one engine")
    router_names = {r.name for r in routers}
    out_routers = []
    seen_router: dict[str, str] = {}
    for r in routers:
        entry = _router(config, r, release)
        if entry["url"] in seen_router:
            raise FleetError(f"hosts {seen_router[entry['url']]} and {r.name}: both fleet routers of {config.name} "
                             f"would be {entry['url']}: each router host needs its own bind address "
                             "(sglang_bind_address)")
        seen_router[entry["url"]] = r.name
        out_routers.append(entry)
    out_engines = []
    seen: dict[str, str] = {}
    for host in engines:
        if host.name in router_names:
            raise FleetError(f"host {host.name} is in both gpu_hosts and routers: the fleet router runs on a host of "
                             "its own (leave the routers group out to run a router on each GPU host)")
        settings = render.HostSettings(release_label=release, bind_address=host.bind_address or None)
        address = render.bind_address(config, settings)
        if address in ("0.0.0.0", "::"):
            # Every address of the host: the router reaches it at the one Ansible uses.
            base = f"http://{host.ansible_host}"
        else:
            base = controller.service_url(config, settings).rsplit(":", 1)[0]
        far = [r for r in routers if not (_is_loopback(host.ansible_host) and _is_loopback(r.ansible_host))]
        if _is_loopback(address) and far:
            raise FleetError(
                f"host {host.name}: the engine of {config.name} binds {address} (loopback), which the fleet router "
                f"on {far[0].name} ({far[0].ansible_host}) cannot reach: set serving.host or the host's "
                "sglang_bind_address to an address the router host reaches (with serving.api_key_secret), "
                "or leave the routers group out")
        for replica in config.replicas:
            # Without serving.replicas > 1 (no per-host router) the one engine is the config's own unit on
            # serving.port; with it, replica i on serving.port + 1 + 2i, deployed as <config>-r<i>.
            url = f"{base}:{replica.port}"
            if url in seen:
                raise FleetError(f"hosts {seen[url]} and {host.name}: both engines of {config.name} would be {url}: "
                                 "each GPU host needs its own bind address (sglang_bind_address) behind the fleet "
                                 "router")
            seen[url] = host.name
            out_engines.append({"host": host.name, "url": url, "name": config.name, "deploy": replica.name,
                                "replica": replica.index if config.serving.router else None})
    batch = batch_size(max_unavailable, len(out_engines))
    batches = rollout_batches(out_engines, batch)
    where = (f"the fleet router on {out_routers[0]['host']} ({out_routers[0]['url']})" if len(out_routers) == 1 else
             f"{len(out_routers)} fleet routers, on "
             + ", ".join(f"{r['host']} ({r['url']})" for r in out_routers[:-1])
             + f" and {out_routers[-1]['host']} ({out_routers[-1]['url']})")
    per_host = len(config.replicas)
    what = (f"{len(out_engines)} engine(s)" if not config.serving.router else
            f"{len(out_engines)} engine(s) ({per_host} replica(s) on each of {len(engines)} GPU host(s))")
    canary = out_engines[0]
    canary_name = canary["host"] if canary["replica"] is None else f"{canary['host']} {canary['deploy']}"
    return {
        "config": config.name,
        "engines": out_engines,
        "replicas_per_host": per_host,
        "batches": batches,
        "steps": rollout_steps(batches),
        # make rollback: no canary, max_unavailable at a time from the first.
        "rollback_steps": rollout_steps(rollout_batches(out_engines, batch, canary=False)),
        "workers": [e["url"] for e in out_engines],
        # The first router (the canary's same-window gate reads the old engines through it); each router host's own
        # entry is in routers.
        "router": out_routers[0],
        "routers": out_routers,
        "max_unavailable": batch,
        "api_key_secret": config.serving.api_key_secret or "",
        "line": (f"{what} of {config.name} behind {where}: the canary ({canary_name}) first, then {batch} at a "
                 "time"),
    }


def replica_count_change(fleet: dict, installed: dict[str, list[str]]) -> str:
    """The one line that refuses a change of the replica count behind the fleet router, or "" (docs/router.md, "The
    fleet router"). ``installed`` maps a router host to the workers of its installed fleet router unit on the plan's
    port (hosts without one are left out): a GPU host with K of them (its engines now) where the plan wants N != K
    replicas would keep its surplus engines running (the fleet role does not retire them) or mix an engine on
    ``serving.port`` with replicas; so the rollout is refused before any change. A first deploy (no unit) passes."""
    want = fleet["replicas_per_host"]
    bases: dict[str, str] = {}
    for e in fleet["engines"]:
        bases.setdefault(e["host"], e["url"].rsplit(":", 1)[0])
    for router in fleet["routers"]:
        if router["host"] not in installed:
            continue
        workers = [w.rstrip("/") for w in installed[router["host"]]]
        now = {host: sum(1 for w in workers if w.rsplit(":", 1)[0] == base) for host, base in bases.items()}
        changed = {host: n for host, n in now.items() if n and n != want}
        if not changed:
            continue
        counts = sorted(set(changed.values()))
        old = (f"{counts[0]} engine(s) on each GPU host" if len(counts) == 1 and len(changed) == len(bases) else
               ", ".join(f"{n} engine(s) on {host}" for host, n in changed.items()))
        return (f"config {fleet['config']}: serving.replicas {want} behind the fleet router {router['url']} (on "
                f"{router['host']}), which fronts {old} now: a change of the replica count behind the fleet router "
                f"is not supported (the surplus engines would not be retired): keep serving.replicas at "
                f"{' or '.join(map(str, counts))} for port {router['port']} (sgdeploy does not change the "
                "replica count of a running fleet yet)")
    return ""
