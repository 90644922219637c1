"""Deploy state on a host: the plan of a switch, the deploy lock, backups for rollback.

Runs ON the host with the system python3 (standard library only); the deploy role copies the
package there and calls `python3 -m sgdeploy.hoststate <command>`. Every command prints JSON on
stdout; problems go to stderr as one line naming the thing and the value, with exit code 1.

State lives under STATE_ROOT (/var/lib/sglang-deploy):
  <config>/current.json    what runs now for that config (written after a green deploy)
  <config>/previous.json   what ran before it (the target of `make rollback`)
  <config>/records/*.json  one record per attempt
  txn/                     the switch in progress: backups of the units it replaces
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

STATE_ROOT = Path("/var/lib/sglang-deploy")
UNIT_DIR = Path("/etc/systemd/system")
ENV_DIR = Path("/etc/sglang")
LOCK = Path("/run/sglang-deploy.lock")


class HostStateError(Exception):
    pass


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _systemctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, check=False)


def unit_active(unit: str) -> bool:
    return _systemctl("is-active", "--quiet", unit).returncode == 0


# ---------------------------------------------------------------------------------------------
# Ports


def listeners() -> list[dict]:
    """Listening TCP sockets with their owning process and systemd unit (from `ss -ltnpH`)."""
    proc = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=False)
    out = []
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        local = parts[3]
        addr, _, port = local.rpartition(":")
        pids = [int(p) for p in re.findall(r"pid=(\d+)", line)]
        names = re.findall(r'\("([^"]+)"', line)
        out.append({"address": addr.strip("[]"), "port": int(port), "pids": pids,
                    "process": names[0] if names else "?", "unit": _unit_of(pids[0]) if pids else None})
    return out


def _unit_of(pid: int) -> str | None:
    try:
        cgroup = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    m = re.search(r"/([^/]+\.service)", cgroup)
    return m.group(1) if m else None


def _overlaps(address: str, bind: str) -> bool:
    return address in (bind, "0.0.0.0", "*", "::") or bind in ("0.0.0.0", "::")


def port_free(bind: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((bind, port))
        except OSError:
            return False
    return True


# ---------------------------------------------------------------------------------------------
# Plan


def deployed_configs(state_root: Path = STATE_ROOT) -> list[dict]:
    out = []
    if state_root.is_dir():
        for current in sorted(state_root.glob("*/current.json")):
            data = _read_json(current)
            if data:
                data["active"] = unit_active(data["unit_name"])
                out.append(data)
    return out


def plan(deploy: dict, gpu_count: int, state_root: Path = STATE_ROOT) -> dict:
    """What switching to `deploy` (the render JSON plus the release) means on this host.

    Raises HostStateError, before anything is changed, when the config does not fit the host or a
    port is held by something that this deploy would not stop.
    """
    problems = []
    gpus = deploy["gpus"]
    bad = [g for g in gpus if g >= gpu_count]
    if bad:
        problems.append(f"config {deploy['config']}: serving.gpus {gpus}: GPU index {bad[0]} does not exist on "
                        f"this host (gpu_count {gpu_count}: indices 0-{gpu_count - 1})")
    bind, ports = deploy["bind_address"], deploy["ports"]
    predecessors = []
    for other in deployed_configs(state_root):
        if not other["active"]:
            continue
        same = other["config"] == deploy["config"]
        port_clash = other["bind_address"] == bind and set(other["ports"]) & set(ports)
        gpu_clash = set(other["gpus"]) & set(gpus)
        if same or port_clash or gpu_clash:
            predecessors.append(other)
    replaced_units = {p["unit_name"] for p in predecessors}
    for sock in listeners():
        if sock["port"] in ports and _overlaps(sock["address"], bind) and sock["unit"] not in replaced_units:
            who = f"{sock['process']} (pid {', '.join(map(str, sock['pids'])) or '?'}"
            who += f", unit {sock['unit']})" if sock["unit"] else ")"
            problems.append(f"config {deploy['config']}: port {sock['address']}:{sock['port']} is already in use "
                            f"by {who}, which this deploy would not stop; free the port or change serving.port")
    if problems:
        raise HostStateError("\n".join(problems))
    current = next((p for p in predecessors if p["config"] == deploy["config"]), None)
    unchanged = bool(current and current["unit_digest"] == deploy["digest"]
                     and current["release"] == deploy["release"] and len(predecessors) == 1)
    return {"predecessors": predecessors, "unchanged": unchanged,
            "stop_units": [p["unit_name"] for p in predecessors],
            "wait_ports": sorted({(p["bind_address"], port) for p in predecessors for port in p["ports"]}
                                 | {(bind, port) for port in ports})}


# ---------------------------------------------------------------------------------------------
# Lock


def lock_acquire(run_id: str, stale_s: int, lock: Path = LOCK) -> dict:
    lock.parent.mkdir(parents=True, exist_ok=True)
    payload = {"run_id": run_id, "pid": os.getpid(), "since": time.time(), "host": socket.gethostname()}
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            held = _read_json(lock) or {}
            if held.get("run_id") == run_id:
                return held
            age = time.time() - float(held.get("since", 0))
            if age < stale_s:
                raise HostStateError(
                    f"another deploy holds the lock {lock} on this host (run {held.get('run_id', '?')}, "
                    f"started {int(age)} s ago); wait for it to finish, or remove the lock if that run died"
                ) from None
            lock.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f)
        return payload
    raise HostStateError(f"could not take the lock {lock}")


def lock_release(run_id: str, lock: Path = LOCK) -> dict:
    held = _read_json(lock)
    if held and held.get("run_id") == run_id:
        lock.unlink(missing_ok=True)
        return {"released": True}
    return {"released": False}


# ---------------------------------------------------------------------------------------------
# Backups for rollback


def backup(units: list[str], new_unit: str, txn: Path) -> dict:
    """Save the units (and env files) a switch will replace, and whether the new unit existed."""
    if txn.exists():
        shutil.rmtree(txn)
    (txn / "units").mkdir(parents=True)
    saved = []
    for unit in sorted(set(units) | {new_unit}):
        unit_file = UNIT_DIR / unit
        config = unit.removeprefix("sglang-").removesuffix(".service")
        env_file = ENV_DIR / f"{config}.env"
        entry = {"unit": unit, "existed": unit_file.exists(), "env_existed": env_file.exists(),
                 "active": unit_active(unit), "enabled": _systemctl("is-enabled", "--quiet", unit).returncode == 0,
                 "replaced": unit in units, "current": _read_json(STATE_ROOT / config / "current.json")}
        if entry["existed"]:
            shutil.copy2(unit_file, txn / "units" / unit)
        if entry["env_existed"]:
            shutil.copy2(env_file, txn / "units" / f"{config}.env")
        saved.append(entry)
    manifest = {"new_unit": new_unit, "units": saved, "created": time.time()}
    _write_json(txn / "manifest.json", manifest)
    return manifest


def restore(txn: Path) -> dict:
    """Put back the files of every unit the switch touched; say which units to start again."""
    manifest = _read_json(txn / "manifest.json")
    if manifest is None:
        raise HostStateError(f"no switch in progress to roll back ({txn}/manifest.json missing)")
    restart = []
    for entry in manifest["units"]:
        unit = entry["unit"]
        config = unit.removeprefix("sglang-").removesuffix(".service")
        unit_file, env_file = UNIT_DIR / unit, ENV_DIR / f"{config}.env"
        if entry["existed"]:
            shutil.copy2(txn / "units" / unit, unit_file)
        else:
            unit_file.unlink(missing_ok=True)
        if entry["env_existed"]:
            shutil.copy2(txn / "units" / f"{config}.env", env_file)
        elif unit == manifest["new_unit"]:
            env_file.unlink(missing_ok=True)
        current_path = STATE_ROOT / config / "current.json"
        if entry["current"] is not None:
            _write_json(current_path, entry["current"])
        elif unit == manifest["new_unit"]:
            current_path.unlink(missing_ok=True)
        if entry["active"]:
            restart.append(entry)
    return {"restart": restart, "new_unit": manifest["new_unit"]}


def commit(deploy: dict, txn: Path, state_root: Path = STATE_ROOT) -> dict:
    """After green gates: record what runs now and what ran before it; drop the backups."""
    manifest = _read_json(txn / "manifest.json") or {"units": []}
    cfg_dir = state_root / deploy["config"]
    before = [e for e in manifest["units"] if e["replaced"] and e["current"]]
    same = next((e for e in before if e["unit"] == deploy["unit_name"]), None)
    previous = (same or (before[0] if before else None) or {}).get("current")
    current = {k: deploy[k] for k in ("config", "unit_name", "release", "bind_address", "ports", "gpus",
                                      "speculative")}
    current["unit_digest"] = deploy["digest"]
    current["deployed"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if previous and previous.get("unit_digest") == current["unit_digest"] and previous["config"] == current["config"]:
        previous = _read_json(cfg_dir / "previous.json")
    _write_json(cfg_dir / "current.json", current)
    if previous:
        prev_copy = dict(previous)
        # Keep the previous unit text so `make rollback` can restore it even after other deploys.
        src = txn / "units" / previous["unit_name"]
        if src.exists():
            prev_copy["unit_text"] = src.read_text()
            env_src = txn / "units" / f"{previous['config']}.env"
            prev_copy["env_text"] = env_src.read_text() if env_src.exists() else ""
        _write_json(cfg_dir / "previous.json", prev_copy)
    # Configs replaced by this one no longer run: drop their current.json so status is truthful.
    for e in before:
        if e["unit"] != deploy["unit_name"] and e["current"]:
            (state_root / e["current"]["config"] / "current.json").unlink(missing_ok=True)
    shutil.rmtree(txn, ignore_errors=True)
    return {"current": current, "previous": previous}


def rollback_prepare(config: str, state_root: Path = STATE_ROOT) -> dict:
    """`make rollback`: what runs now for `config` and the deploy before it."""
    cfg_dir = state_root / config
    current, previous = _read_json(cfg_dir / "current.json"), _read_json(cfg_dir / "previous.json")
    if previous is None or "unit_text" not in previous:
        raise HostStateError(f"config {config}: no previous deploy recorded on this host "
                             f"({cfg_dir}/previous.json); nothing to roll back to")
    release_python = Path(f"/opt/sglang/releases/{previous['release']}/venv/bin/python")
    if not release_python.exists():
        raise HostStateError(f"config {config}: the previous release {previous['release']} is no longer installed "
                             f"({release_python} missing); redeploy that config instead")
    return {"current": current, "previous": {k: v for k, v in previous.items() if not k.endswith("_text")}}


def rollback_install(config: str, txn: Path, state_root: Path = STATE_ROOT) -> dict:
    """Save the running unit of `config`, then put the previous deploy's unit and env files back."""
    cfg_dir = state_root / config
    previous = _read_json(cfg_dir / "previous.json") or {}
    current = _read_json(cfg_dir / "current.json")
    if txn.exists():
        shutil.rmtree(txn)
    txn.mkdir(parents=True)
    if current:
        saved = dict(current)
        unit_file = UNIT_DIR / current["unit_name"]
        env_file = ENV_DIR / f"{current['config']}.env"
        saved["unit_text"] = unit_file.read_text() if unit_file.exists() else ""
        saved["env_text"] = env_file.read_text() if env_file.exists() else ""
        _write_json(txn / "was_current.json", saved)
    (UNIT_DIR / previous["unit_name"]).write_text(previous["unit_text"])
    env_path = ENV_DIR / f"{previous['config']}.env"
    env_path.write_text(previous.get("env_text", ""))
    env_path.chmod(0o640)
    shutil.chown(env_path, "root", "sglang")
    return {"unit": previous["unit_name"], "config": previous["config"]}


def rollback_commit(config: str, txn: Path, state_root: Path = STATE_ROOT) -> dict:
    """After the previous deploy is healthy again: it is current, and what ran is now previous."""
    cfg_dir = state_root / config
    previous = _read_json(cfg_dir / "previous.json") or {}
    was_current = _read_json(txn / "was_current.json")
    restored = {k: v for k, v in previous.items() if not k.endswith("_text")}
    restored["deployed"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if was_current and was_current["config"] != restored["config"]:
        (state_root / was_current["config"] / "current.json").unlink(missing_ok=True)
    _write_json(state_root / restored["config"] / "current.json", restored)
    if was_current:
        _write_json(cfg_dir / "previous.json", was_current)
    shutil.rmtree(txn, ignore_errors=True)
    return {"current": restored}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m sgdeploy.hoststate")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--deploy", required=True, type=Path, help="the deploy JSON (render output + release)")
    p.add_argument("--gpu-count", required=True, type=int)
    p = sub.add_parser("lock")
    p.add_argument("action", choices=["acquire", "release"])
    p.add_argument("--run-id", required=True)
    p.add_argument("--stale-s", type=int, default=6 * 3600)
    p = sub.add_parser("backup")
    p.add_argument("--units", default="", help="comma-separated units the switch replaces")
    p.add_argument("--new-unit", required=True)
    p.add_argument("--txn", type=Path, default=STATE_ROOT / "txn")
    p = sub.add_parser("restore")
    p.add_argument("--txn", type=Path, default=STATE_ROOT / "txn")
    p = sub.add_parser("commit")
    p.add_argument("--deploy", required=True, type=Path)
    p.add_argument("--txn", type=Path, default=STATE_ROOT / "txn")
    p = sub.add_parser("deployed")
    for name in ("rollback-prepare", "rollback-install", "rollback-commit"):
        p = sub.add_parser(name)
        p.add_argument("--config", required=True)
        p.add_argument("--txn", type=Path, default=STATE_ROOT / "txn-rollback")
    args = parser.parse_args(argv)
    try:
        if args.command == "plan":
            result = plan(json.loads(args.deploy.read_text()), args.gpu_count)
        elif args.command == "lock":
            result = (lock_acquire(args.run_id, args.stale_s) if args.action == "acquire"
                      else lock_release(args.run_id))
        elif args.command == "backup":
            result = backup([u for u in args.units.split(",") if u], args.new_unit, args.txn)
        elif args.command == "restore":
            result = restore(args.txn)
        elif args.command == "commit":
            result = commit(json.loads(args.deploy.read_text()), args.txn)
        elif args.command == "rollback-prepare":
            result = rollback_prepare(args.config)
        elif args.command == "rollback-install":
            result = rollback_install(args.config, args.txn)
        elif args.command == "rollback-commit":
            result = rollback_commit(args.config, args.txn)
        else:
            result = {"deployed": deployed_configs()}
    except HostStateError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
