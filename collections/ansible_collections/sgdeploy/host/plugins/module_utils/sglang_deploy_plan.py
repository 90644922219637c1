# Copyright: sgdeploy contributors. Apache-2.0
"""What a switch to a deploy means on this host, decided before anything changes (read-only)."""

from __future__ import annotations

import glob
import grp
import os
import pwd
import re

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_units as units
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_files import read_json, sha256_file


class PlanError(Exception):
    """The deploy does not fit this host: one line per problem, nothing was changed."""


def deployed(state_dir):
    """current.json of every config on the host, with whether its unit runs (``active``: in any running
    state, its restart delay included), its exact ``state`` and whether it is enabled."""
    out = []
    for path in sorted(glob.glob(os.path.join(state_dir, "*", "current.json"))):
        data = read_json(path)
        if data and "unit_name" in data:
            # `active` means running in any way: a unit in its restart delay comes back on its port by
            # itself, so a deploy must stop it like a serving one (state: what systemd says exactly).
            data["state"] = units.active_state(data["unit_name"])
            data["active"] = data["state"] in units.RUNNING_STATES
            data["enabled"] = units.is_enabled(data["unit_name"])
            out.append(data)
    return out


def digest(path):
    return sha256_file(path)


def env_same(env_src, env_dir, config):
    """Whether the env file rendered on the host for this run (`env_src`, with its secrets) has the
    digest of the installed one. Only the verdict leaves this function, never a digest or a value.
    None when nothing was rendered (check mode renders nothing on the host)."""
    if not env_src or not os.path.exists(env_src):
        return None
    installed = units.env_file(env_dir, config)
    return os.path.exists(installed) and digest(env_src) == digest(installed)


def env_vars(text):
    """NAME -> raw value of an env file's assignments (comments and blank lines ignored)."""
    out = {}
    for line in (text or "").splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            name, value = line.split("=", 1)
            out[name.strip()] = value
    return out


def _read_text(path):
    if not path or not os.path.exists(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def env_same_text(env_text, env_dir, config):
    """Check mode: whether the env text rendered in memory for this run (secrets included) assigns
    the same variables as the installed file. Only the verdict leaves this function."""
    installed = _read_text(units.env_file(env_dir, config))
    return installed is not None and env_vars(installed) == env_vars(env_text)


def redacted_env(text, secret_keys, shown_keys, changed_keys=()):
    """The env file's assignments with every value not in ``shown_keys`` (the non-secret names of the
    new file) replaced: ``NAME=<secret>`` or ``NAME=<secret, changed>``. Comments are kept."""
    lines = []
    for line in (text or "").splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and "=" in stripped:
            name = stripped.split("=", 1)[0].strip()
            if name in secret_keys or name not in shown_keys:
                line = "{}=<secret{}>".format(name, ", changed" if name in changed_keys else "")
        lines.append(line)
    return "\n".join(lines) + ("\n" if lines else "")


UNIT_MODE, ENV_MODE = 0o644, 0o640


def _name(getter, ident):
    try:
        return getter(ident)[0]
    except KeyError:
        return str(ident)


def _mode_owner(path, mode, uid, gid):
    """What differs in the mode and owner of ``path`` from ``mode`` and ``uid``:``gid`` (empty when nothing)."""
    st = os.stat(path)
    out = []
    if st.st_mode & 0o7777 != mode:
        out.append(f"mode {st.st_mode & 0o7777:04o}, expected {mode:04o}")
    if (st.st_uid, st.st_gid) != (uid, gid):
        have = f"{_name(pwd.getpwuid, st.st_uid)}:{_name(grp.getgrgid, st.st_gid)}"
        out.append(f"owner {have}, expected {_name(pwd.getpwuid, uid)}:{_name(grp.getgrgid, gid)}")
    return out


def _settings(text):
    """The unit's lines as (section, line) pairs, blank lines and comments left out."""
    section, out = "", set()
    for line in (text or "").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
        out.add((section, line))
    return out


def unit_edits(installed, rendered):
    """The settings a hand edit changed, by name only (a hand-added value may be a secret):
    ``NoNewPrivileges, ProtectSystem, ExecStart``."""
    a, b = _settings(installed), _settings(rendered)
    names = []
    for _section, line in sorted((a - b) | (b - a)):
        name = re.split(r"\s*=", line, maxsplit=1)[0]
        if name not in names:
            names.append(name)
    return names


def drift(deploy, current, unit_dir, env_dir, unit_text=None, env_src=None, env_text=None, env_gid=0,
          root=(0, 0)):
    """Hand edits of the installed unit and env file of the config that runs now (``current``, its
    current.json), each as ``<file>: <what>``; empty when the files are what the deploy installed.

    The unit is compared with what this deploy renders (``unit_text``) when the deploy's unit is the
    one that runs (same digest), else with the digest the commit recorded (``unit_sha256``). The env
    file (secrets included) is compared by digest with the commit's (``env_sha256``): a file that
    still has it but differs from ``env_src`` is a change in the inventory (a rotated secret), not
    drift. Only variable and setting names are named, never a value. Modes and owners: the unit
    0644 root:root, the env file 0640 root:<service group>."""
    out = []
    unit = os.path.join(unit_dir, deploy["unit_name"])
    if not os.path.exists(unit):
        out.append(f"{unit}: missing")
    else:
        what = []
        installed = _read_text(unit)
        if unit_text is not None and current.get("unit_digest") == deploy.get("digest"):
            if installed.rstrip("\n") != unit_text.rstrip("\n"):
                names = unit_edits(installed, unit_text)
                what.append("hand-edited ({} differ from the rendered unit)".format(", ".join(names[:6])
                                                                                  or "whitespace"))
        elif current.get("unit_sha256") and digest(unit) != current["unit_sha256"]:
            what.append("hand-edited (its digest differs from the deployed unit's)")
        what += _mode_owner(unit, UNIT_MODE, *root)
        if what:
            out.append("{}: {}".format(unit, "; ".join(what)))
    env = units.env_file(env_dir, deploy["config"])
    if not os.path.exists(env):
        out.append(f"{env}: missing")
    else:
        what = []
        deployed_sha = current.get("env_sha256")
        if deployed_sha and digest(env) != deployed_sha:
            rendered = _read_text(env_src) if env_src and os.path.exists(env_src) else env_text
            if rendered is None:
                what.append("hand-edited (its digest differs from the deployed file's)")
            else:
                names = sorted(k for k in set(env_vars(_read_text(env))) | set(env_vars(rendered))
                               if env_vars(_read_text(env)).get(k) != env_vars(rendered).get(k))
                what.append("hand-edited ({})".format("variables " + ", ".join(names) + " differ from the rendered file"
                                                      if names else "not the deployed file"))
        what += _mode_owner(env, ENV_MODE, root[0], env_gid)
        if what:
            out.append("{}: {}".format(env, "; ".join(what)))
    return out


def installed_drift(current, unit_dir="/etc/systemd/system"):
    """Hand edits of a deployed config's unit and env file since its deploy, by the digests, modes and owners
    its commit recorded in ``current`` (its current.json), as ``drift`` words them (``make status``). The env
    file's group is the service user's (``service_user``); unknown, the group is not judged."""
    env_file = current.get("env_file")
    env_dir = os.path.dirname(env_file) if env_file else "/etc/sglang"
    gid = None
    try:
        gid = pwd.getpwnam(current["service_user"]).pw_gid if current.get("service_user") else None
    except KeyError:
        gid = None
    if gid is None:
        env = units.env_file(env_dir, current["config"])
        gid = os.stat(env).st_gid if os.path.exists(env) else 0
    try:
        return drift(current, current, unit_dir, env_dir, env_gid=gid)
    except OSError as err:
        return [f"{err.filename or current['unit_name']}: cannot be read ({err.strerror or err})"]


def plan_diff(deploy, result, unit_dir, env_dir, unit_text, env_text, secret_keys):
    """What the switch would change on this host, as Ansible diffs (check mode): the new unit against
    the installed one it replaces (its own name's file, else the first replaced config's), and the env
    file the same way with every secret value redacted (names only; a changed value says so)."""
    config = deploy["config"]
    own = os.path.join(unit_dir, deploy["unit_name"])
    replaced = [p for p in result["predecessors"] if p["config"] != config]
    old_config = config if os.path.exists(own) or not replaced else replaced[0]["config"]
    old_unit = own if old_config == config else os.path.join(unit_dir, replaced[0]["unit_name"])
    diffs = []
    before = _read_text(old_unit) or ""
    if unit_text is not None and before != unit_text:
        diffs.append({"before": before, "after": unit_text, "before_header": old_unit if before else "(none)",
                      "after_header": own})
    if env_text is not None:
        old_env = units.env_file(env_dir, old_config)
        old_text = _read_text(old_env)
        old_vars, new_vars = env_vars(old_text), env_vars(env_text)
        secret = set(secret_keys or [])
        shown = {k for k in new_vars if k not in secret}
        changed = {k for k in set(old_vars) | set(new_vars) if old_vars.get(k) != new_vars.get(k)}
        if old_vars != new_vars or old_env != units.env_file(env_dir, config):
            diffs.append({"before": redacted_env(old_text, secret, shown),
                          "after": redacted_env(env_text, secret, shown, changed),
                          "before_header": old_env if old_text is not None else "(none)",
                          "after_header": units.env_file(env_dir, config) + " (secret values redacted)"})
    return diffs


def plan(deploy, gpu_count, state_dir, sockets=None, env_src=None, env_dir="/etc/sglang", env_text=None,
         unit_dir="/etc/systemd/system", unit_text=None, env_gid=None, root=(0, 0)):
    """Predecessors (active configs sharing the config name, a GPU or a port: replaced), units to
    disable (enabled but inactive configs on the same port or GPUs: they would win the port at the
    next boot), ports to wait for, and whether nothing changes (same unit, release and env file:
    a changed secret is a change: judged by digest against ``env_src``, or in check mode, where
    nothing is written on the host, against ``env_text`` rendered in memory), and the hand edits of the
    installed files of the config that runs (``drift``: a drifted file is a change, the switch puts
    the rendered files back). ``env_gid``: the service group (None: the drift check is skipped)."""
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
    same_env = None
    if current:
        same_env = env_same(env_src, env_dir, deploy["config"])
        if same_env is None and env_text is not None:
            same_env = env_same_text(env_text, env_dir, deploy["config"])
    drifted = []
    if current and env_gid is not None:
        drifted = drift(deploy, current, unit_dir, env_dir, unit_text=unit_text, env_src=env_src, env_text=env_text,
                        env_gid=env_gid, root=root)
    # Unchanged only while the unit really serves: one crash-looping (activating) is switched again.
    unchanged = bool(current and current.get("state", "active") == "active"
                     and current.get("unit_digest") == deploy["digest"] and same_env is not False
                     and current.get("release") == deploy["release"] and len(predecessors) == 1 and not disable
                     and not drifted)
    wait_ports = sorted({(p["bind_address"], port) for p in predecessors for port in p["ports"]}
                        | {(bind, port) for port in ports})
    return {"predecessors": predecessors, "unchanged": unchanged, "env_changed": same_env is False, "drift": drifted,
            "replaces": [p["config"] for p in predecessors],
            "stop_units": [p["unit_name"] for p in predecessors], "disable_units": disable,
            "wait_ports": [list(p) for p in wait_ports]}
