# Copyright: sgdeploy contributors. Apache-2.0
"""systemd units and TCP ports on the host, as the deploy sees them (standard library only)."""

from __future__ import annotations

import os
import re
import socket
import subprocess

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_router_api as router_api


def systemctl(*args):
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, check=False)


def show(unit, *props):
    """systemd properties of ``unit`` as a dict of strings."""
    args = ["show", unit]
    for p in props:
        args += ["-p", p]
    proc = systemctl(*args)
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


def is_active(unit):
    return systemctl("is-active", "--quiet", unit).returncode == 0


# A unit in any of these states holds (or is about to hold again) what it binds: `activating` is also
# systemd's restart delay (Restart=on-failure), after which the unit takes its port back by itself.
RUNNING_STATES = ("active", "activating", "reloading", "refreshing", "deactivating")


def active_state(unit):
    """The unit's ActiveState as `systemctl is-active` prints it (active, activating, deactivating,
    inactive, failed, ...); `unknown` when systemctl prints nothing."""
    return (systemctl("is-active", unit).stdout or "").strip() or "unknown"


def is_enabled(unit):
    return systemctl("is-enabled", "--quiet", unit).returncode == 0


def n_restarts(unit):
    value = show(unit, "NRestarts").get("NRestarts", "")
    return int(value) if value.isdigit() else 0


API_KEY_ENV_VAR = "SGDEPLOY_API_KEY_ENV"


class EngineKeyError(Exception):
    """The unit names an API key that cannot be read; one line, never the key."""


def engine_key(unit, show_unit=None, read_env=None):
    """The engine API key ``unit`` runs with (serving.api_key_secret), or None when its config names none.

    Read on the host, as root, the way systemd gives it to the launcher: the unit's
    ``Environment=SGDEPLOY_API_KEY_ENV=<name>`` names the variable of its ``EnvironmentFile=``
    (/etc/sglang/<config>.env, 0640 root:sglang). Raises EngineKeyError (one line naming the unit, the
    variable and the file, never the value) when the unit names a key its files do not hold.
    """
    props = (show_unit or show)(unit, "Environment", "EnvironmentFiles")
    m = re.search(r"(?:^|\s)" + API_KEY_ENV_VAR + r"=([A-Za-z_][A-Za-z0-9_]*)(?:\s|$)", props.get("Environment", ""))
    if not m:
        return None
    name = m.group(1)
    files = re.findall(r"(\S+) \(ignore_errors=(?:yes|no)\)", props.get("EnvironmentFiles", ""))
    for path in files:
        try:
            value = (read_env or router_api.read_env)(path).get(name)
        except OSError as err:
            raise EngineKeyError(f"{unit}: cannot read its environment file {path}: {err.strerror or err}") from None
        if value:
            return value
    raise EngineKeyError(f"{unit}: {API_KEY_ENV_VAR}={name}, but no environment file of the unit "
                         f"({', '.join(files) or 'none'}) sets {name} (serving.api_key_secret)")


def config_of(unit):
    """The config name of an sgdeploy unit (sglang-<config>.service)."""
    return unit[len("sglang-"):-len(".service")] if unit.startswith("sglang-") and unit.endswith(".service") else unit


def parse_ss(text):
    """Listening TCP sockets in the output of `ss -ltnpH`: address, port, pids, process, line."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        addr, _, port = parts[3].rpartition(":")
        if not port.isdigit():
            continue
        names = re.findall(r'\("([^"]+)"', line)
        out.append({"address": addr.strip("[]"), "port": int(port),
                    "pids": [int(p) for p in re.findall(r"pid=(\d+)", line)],
                    "process": names[0] if names else "?", "line": line.strip()})
    return out


def listeners():
    """Listening TCP sockets with their owning pids and systemd unit."""
    proc = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=False)
    return [dict(s, unit=unit_of(s["pids"][0]) if s["pids"] else None) for s in parse_ss(proc.stdout)]


def unit_of(pid):
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            cgroup = f.read()
    except OSError:
        return None
    m = re.search(r"/([^/]+\.service)", cgroup)
    return m.group(1) if m else None


def overlaps(address, bind):
    return address in (bind, "0.0.0.0", "*", "::") or bind in ("0.0.0.0", "::")


def port_free(bind, port):
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind, port))
        except OSError:
            return False
    return True


def env_file(env_dir, config):
    return os.path.join(env_dir, config + ".env")
