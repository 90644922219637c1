# Copyright: sgdeploy contributors. Apache-2.0
"""What a switch to a deploy means on this host, decided before anything changes (read-only)."""

from __future__ import annotations

import glob
import hashlib
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


def _digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            h.update(chunk)
    return h.hexdigest()


def env_same(env_src, env_dir, config):
    """Whether the env file rendered on the host for this run (`env_src`, with its secrets) has the
    digest of the installed one. Only the verdict leaves this function, never a digest or a value.
    None when nothing was rendered (check mode renders nothing on the host)."""
    if not env_src or not os.path.exists(env_src):
        return None
    installed = units.env_file(env_dir, config)
    return os.path.exists(installed) and _digest(env_src) == _digest(installed)


def plan(deploy, gpu_count, state_dir, sockets=None, env_src=None, env_dir="/etc/sglang"):
    """Predecessors (active configs sharing the config name, a GPU or a port: replaced), units to
    disable (enabled but inactive configs on the same port or GPUs: they would win the port at the
    next boot), ports to wait for, and whether nothing changes (same unit, release and env file:
    a changed secret is a change)."""
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
    same_env = env_same(env_src, env_dir, deploy["config"]) if current else None
    unchanged = bool(current and current.get("unit_digest") == deploy["digest"] and same_env is not False
                     and current.get("release") == deploy["release"] and len(predecessors) == 1 and not disable)
    wait_ports = sorted({(p["bind_address"], port) for p in predecessors for port in p["ports"]}
                        | {(bind, port) for port in ports})
    return {"predecessors": predecessors, "unchanged": unchanged, "env_changed": same_env is False,
            "stop_units": [p["unit_name"] for p in predecessors], "disable_units": disable,
            "wait_ports": [list(p) for p in wait_ports]}
