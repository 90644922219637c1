"""What sgdeploy runs on a host, read from its deploy state (`python3 -m sgdeploy.hoststate deployed`).

Runs ON the host with the system python3 (standard library only), from the copy of the package the
deploy role still installs for the gate step; `sgdeploy.sweep` calls it over SSH. Everything else
the deploy does on a host (lock, plan, the switch journal, waits, records) is a module of the
`sgdeploy.host` collection (collections/ansible_collections/sgdeploy/host/, docs/crash-safety.md).

Prints `{"deployed": [current.json + "active" + "enabled", ...]}`; exit 0.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

STATE_ROOT = Path("/var/lib/sglang-deploy")


def _systemctl_ok(*args: str) -> bool:
    return subprocess.run(["systemctl", *args], capture_output=True, check=False).returncode == 0


def deployed_configs(state_root: Path = STATE_ROOT) -> list[dict]:
    """current.json of every config on the host, with whether its unit is active and enabled."""
    out = []
    for current in sorted(state_root.glob("*/current.json")) if state_root.is_dir() else []:
        try:
            data = json.loads(current.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "unit_name" in data:
            data["active"] = _systemctl_ok("is-active", "--quiet", data["unit_name"])
            data["enabled"] = _systemctl_ok("is-enabled", "--quiet", data["unit_name"])
            out.append(data)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m sgdeploy.hoststate")
    parser.add_argument("command", choices=["deployed"])
    parser.add_argument("--state-dir", type=Path, default=STATE_ROOT)
    args = parser.parse_args(argv)
    print(json.dumps({"deployed": deployed_configs(args.state_dir)}, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
