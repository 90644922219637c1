# Copyright: sgdeploy contributors. Apache-2.0
"""Which other configs on this host a deploy or a rollback would stop or displace, and whether the
operator named them (``replaces``): nothing is replaced silently (read-only, decided before any change).

A deploy (or a rollback, which brings back a config's previous unit) collides with another config
of the host that is active or enabled when they share the unit name, a port (the serving port or
the NCCL port, either way round, on the same bind address) or a GPU. A deploy that takes the other
over whole - every GPU of it, and a shared port only in the same role (port for port, NCCL port for
NCCL port) - is a switch between configs (``PLAN: would replace ddtree-b15 with ddtree-b32``, the
summary's ``before -> after``) and needs no name; every other collision (its port on the other's
NCCL port or the other way round, a port of a config on other GPUs, part of its GPUs, the same unit
name) is refused unless ``replaces`` names the other config. A rollback stops only the config it
rolls back, so any collision refuses it.

A rank of an engine over several hosts (its current.json's ``nnodes`` above 1; docs/multinode.md) stops only with
every other rank of that engine, rank 0 first, in the same batch: a rank above 0 stopped alone breaks the process
group of the rank 0 that serves (SGLang's rank ignores SIGTERM until its stop timeout kills it), a rank 0 stopped
alone ends the engine and leaves the other ranks' units behind. So a deploy (given ``batch``, the hosts of this
batch, and ``run``, the run's) that would stop such a rank - a displaced config, named or taken over, or its own
config running over several hosts - is refused when another host of that engine is not in the batch; ``engines``
says which engines it stops, for the check across hosts (every other host stops its rank too: the role's
tasks/lock.yml)."""

from __future__ import annotations

import re

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


class ConflictError(Exception):
    """One line: the other config(s), what collides, and how to name them."""


def parse_replaces(value):
    """``replaces`` as given (a comma-separated string or a list) -> list of config names; a name that
    is not a config name raises ConflictError naming it."""
    if value is None:
        return []
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    names = [str(i).strip() for i in items if str(i).strip()]
    bad = [n for n in names if not NAME_RE.match(n)]
    if bad:
        raise ConflictError(f"replaces {bad[0]!r} is not allowed: use config names (lower-case letters, digits, '.', "
                            f"'_', '-'), comma-separated, e.g. REPLACES=ddtree-b15")
    return names


def _port_words(mine, theirs, other):
    """What the shared ports are, in words (ports[0] serves, ports[1] is the NCCL port)."""
    words = []
    for i, port in enumerate(mine):
        for j, their in enumerate(theirs):
            if port != their:
                continue
            if i == 0 and j == 0:
                words.append(f"both serve on port {port}")
            elif i == 0:
                words.append(f"its port {port} is {other}'s NCCL port")
            elif j == 0:
                words.append(f"its NCCL port {port} is {other}'s port")
            else:
                words.append(f"both use NCCL port {port}")
    return words


def collisions(deploy, other):
    """What ``deploy`` and ``other`` (a current.json of the host) share, in words; [] when nothing."""
    name = other["config"]
    words = []
    if other.get("unit_name") == deploy.get("unit_name"):
        words.append(f"same unit {other['unit_name']}")
    if other.get("bind_address") == deploy.get("bind_address"):
        words += _port_words(list(deploy.get("ports", [])), list(other.get("ports", [])), name)
    shared = sorted(set(deploy.get("gpus", [])) & set(other.get("gpus", [])))
    if shared:
        words.append("GPU{} {} {} (it uses GPUs {}, {} uses {})".format(
            "s" if len(shared) > 1 else "", ", ".join(map(str, shared)), "overlap" if len(shared) > 1 else "overlaps",
            list(deploy.get("gpus", [])), name, list(other.get("gpus", []))))
    return words


def takeover(deploy, other):
    """The deploy takes the other over whole (a switch between configs): every GPU of the other is one of
    its own, and a port they share (same address) has the same role in both (port for port, NCCL for NCCL)."""
    if other.get("unit_name") == deploy.get("unit_name"):
        return False
    if not set(other.get("gpus", [])) <= set(deploy.get("gpus", [])):
        return False
    if other.get("bind_address") != deploy.get("bind_address"):
        return True
    mine, theirs = list(deploy.get("ports", [])), list(other.get("ports", []))
    return all(i == j for i, port in enumerate(mine) for j, their in enumerate(theirs) if port == their)


def _engine(other):
    """(node_rank, engine_hosts) of a current.json that spans several hosts, else None."""
    if int(other.get("nnodes") or 1) <= 1:
        return None
    return int(other.get("node_rank") or 0), [str(h) for h in other.get("engine_hosts") or []]


def _hosts_words(hosts, verb_one, verb_many):
    return f"{','.join(hosts)} {verb_one if len(hosts) == 1 else verb_many}"


def engines(deploy, others, displaced, host, batch, run=None):
    """The engines over several hosts whose rank on ``host`` the deploy would stop: the ``displaced`` configs that span
    several hosts, and the deploy's own config when it runs over several hosts. Returns [{config, node_rank,
    engine_hosts}]; raises ConflictError in one line when another host of such an engine is not in ``batch`` (the
    hosts deploying with this one): not in the ``run`` at all, or in another batch (or failed before)."""
    mine = deploy["config"]
    items = []
    for other in others:
        if other.get("config") == mine and (other.get("active") or other.get("enabled")):
            state = "active" if other.get("active") else "enabled, not running"
            items.append((other, f"{mine} ({state}, {other.get('unit_name')}: its own deploy there)"))
    by_name = {o.get("config"): o for o in others}
    items += [(by_name[d["config"]], d["what"]) for d in displaced if d["config"] in by_name]
    batch = [str(h) for h in batch]
    run = [str(h) for h in run] if run is not None else batch
    out = []
    for other, what in items:
        engine = _engine(other)
        if engine is None:
            continue
        rank, hosts = engine
        rest = [h for h in hosts if h != host]
        not_run = [h for h in rest if h not in run]
        not_batch = [h for h in rest if h in run and h not in batch]
        if not hosts or not_run or not_batch:
            where = []
            if not_run:
                where.append(_hosts_words(not_run, "is", "are") + " not in the run")
            if not_batch:
                where.append(_hosts_words(not_batch, "does", "do") + " not deploy in this batch (SERIAL splits the "
                             "engine's hosts, or it failed before this check)")
            name, unit = other["config"], other.get("unit_name")
            why = ("a rank above 0 stopped alone breaks the process group of its rank 0, which serves" if rank > 0
                   else "rank 0 stopped alone ends the engine and leaves its other ranks' units behind")
            others_first = [h for h in hosts if h != hosts[0]] if hosts else []
            raise ConflictError(
                f"deploying {mine} would stop {what} here, rank {rank} of an engine over hosts "
                + (f"{','.join(hosts)} whose other host{'s' if len(rest) > 1 else ''} " + "; ".join(where)
                   if hosts else "that current.json does not name (engine_hosts)")
                + f"; its ranks stop only together, rank 0 first ({why}): include every host of the engine in the "
                f"run, in one batch (e.g. LIMIT={','.join(hosts) or '...'} SERIAL={len(hosts) or 2}"
                + (f" REPLACES={name}" if name != mine else "") + "), or roll the engine off first (systemctl disable "
                f"--now {unit} on {hosts[0] if hosts else 'rank 0'}"
                + (f", then on {','.join(others_first)}" if others_first else ", then on the other ranks") + ")")
        out.append({"config": other["config"], "unit_name": other.get("unit_name"), "node_rank": rank,
                    "engine_hosts": hosts})
    return out


def conflicts(deploy, others, replaces=(), rollback=None, host=None, batch=None, run=None):
    """The configs of ``others`` (current.json of every config, with ``active``/``enabled``) that the
    deploy would stop or displace. Returns {"displaced": [...], "named": [...], "line": str}; raises
    ConflictError when one is neither named in ``replaces`` nor (a deploy only) taken over whole. With ``batch`` (a
    deploy: the hosts of this batch; ``host`` this one, ``run`` the run's), also ``engines`` (see engines()).
    ``rollback``: the config name a rollback is given; ``deploy`` is then its previous.json (which may be
    another config's, the one it replaced), and the rolled-back config itself is what it stops."""
    mine = deploy["config"]
    own = {mine, rollback} if rollback else {mine}
    displaced, unnamed = [], []
    for other in others:
        if other.get("config") in own or not (other.get("active") or other.get("enabled")):
            continue
        words = collisions(deploy, other)
        if not words:
            continue
        state = "active" if other.get("active") else "enabled, not running"
        item = {"config": other["config"], "unit_name": other.get("unit_name"), "active": bool(other.get("active")),
                "collides": "; ".join(words), "takeover": takeover(deploy, other)}
        item["what"] = f"{other['config']} ({state}, {other.get('unit_name')}: {item['collides']})"
        displaced.append(item)
        if other["config"] not in replaces and (rollback or not item["takeover"]):
            unnamed.append(item)
    verb = "rolling back" if rollback else "deploying"
    named = [i for i in displaced if i["config"] in replaces]
    if rollback and named and not unnamed:
        # A rollback stops only the config it rolls back (playbooks/tasks/rollback_one.yml): a named one
        # would still run on the same GPUs or ports.
        raise ConflictError(
            f"{verb} {rollback} to its previous deploy ({mine}) would collide with "
            + "; ".join(i["what"] for i in named)
            + f"; REPLACES names it, but a rollback stops only {rollback}: stop it first (systemctl disable --now "
            + " ".join(i["unit_name"] for i in named) + "), then roll back")
    if unnamed:
        names = ",".join(i["config"] for i in unnamed)
        raise ConflictError(
            (f"{verb} {rollback} to its previous deploy ({mine}) would collide with " if rollback
             else f"{verb} {mine} would stop or displace ")
            + "; ".join(i["what"] for i in unnamed)
            + f"; name {'it' if len(unnamed) == 1 else 'them'} to replace {'it' if len(unnamed) == 1 else 'them'}: "
            f"REPLACES={names} (-e replaces={names}), or change serving.port/serving.gpus")
    line = ("replaces " + "; ".join(i["what"] for i in named) + " (named by REPLACES)") if named else ""
    found = engines(deploy, others, displaced, host, batch, run) if batch is not None and not rollback else []
    return {"displaced": displaced, "named": [i["config"] for i in named], "line": line, "engines": found}
