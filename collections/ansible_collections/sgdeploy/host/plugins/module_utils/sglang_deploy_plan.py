# Copyright: sgdeploy contributors. Apache-2.0
"""What a switch to a deploy means on this host, decided before anything changes (read-only)."""

from __future__ import annotations

import glob
import os

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_units as units
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_files import read_json


class PlanError(Exception):
    """The deploy does not fit this host: one line per problem, nothing was changed."""


def deployed(state_dir):
    """current.json of every config on the host, with whether its unit is active and enabled."""
    out = []
    for path in sorted(glob.glob(os.path.join(state_dir, "*", "current.json"))):
        data = read_json(path)
        if data and "unit_name" in data:
            data["active"] = units.is_active(data["unit_name"])
            data["enabled"] = units.is_enabled(data["unit_name"])
            out.append(data)
    return out


def plan(deploy, gpu_count, state_dir, sockets=None):
    """Predecessors (active configs sharing the config name, a GPU or a port: replaced), units to
    disable (enabled but inactive configs on the same port or GPUs: they would win the port at the
    next boot), ports to wait for, and whether nothing changes."""
    problems = []
    gpus, bind, ports = deploy["gpus"], deploy["bind_address"], deploy["ports"]
    bad = [g for g in gpus if g >= gpu_count]
    if bad:
        problems.append(f"config {deploy['config']}: serving.gpus {gpus}: GPU index {bad[0]} does not exist on this "
                        f"host (gpu_count {gpu_count}: indices 0-{gpu_count - 1})")
    predecessors, disable = [], []
    for other in deployed(state_dir):
        same = other["config"] == deploy["config"]
        clash = (other["bind_address"] == bind and set(other["ports"]) & set(ports)) or set(other["gpus"]) & set(gpus)
        if not (same or clash):
            continue
        if other["active"]:
            predecessors.append(other)
        elif other["enabled"] and not same:
            disable.append(other["unit_name"])
    replaced = {p["unit_name"] for p in predecessors}
    for sock in units.listeners() if sockets is None else sockets:
        if sock["port"] in ports and units.overlaps(sock["address"], bind) and sock["unit"] not in replaced:
            who = "{} (pid {}".format(sock["process"], ", ".join(map(str, sock["pids"])) or "?")
            who += ", unit {})".format(sock["unit"]) if sock["unit"] else ")"
            problems.append(f"config {deploy['config']}: port {sock['address']}:{sock['port']} is already in use by "
                            f"{who}, which this deploy would not stop; free the port or change serving.port")
    if problems:
        raise PlanError("; ".join(problems))
    current = next((p for p in predecessors if p["config"] == deploy["config"]), None)
    unchanged = bool(current and current.get("unit_digest") == deploy["digest"]
                     and current.get("release") == deploy["release"] and len(predecessors) == 1 and not disable)
    wait_ports = sorted({(p["bind_address"], port) for p in predecessors for port in p["ports"]}
                        | {(bind, port) for port in ports})
    return {"predecessors": predecessors, "unchanged": unchanged,
            "stop_units": [p["unit_name"] for p in predecessors], "disable_units": disable,
            "wait_ports": [list(p) for p in wait_ports]}
