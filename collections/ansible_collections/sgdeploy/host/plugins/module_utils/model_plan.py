"""The read-only check of a deploy's models before anything changes on the host.

For each model of the deploy description (`render --json` `models`): what it needs (`fetch`, `copy`
or `none`), its bytes and the bytes still to transfer; fails, naming every model and reason, on a
missing host path, an unreachable or refusing hub, a controller version with other content, a
folder outside the models root, or too little disk for all transfers together.
"""

from __future__ import annotations

from pathlib import Path

from ansible_collections.sgdeploy.host.plugins.module_utils.hf_fetch import Hub, remote_files
from ansible_collections.sgdeploy.host.plugins.module_utils.model_folders import (
    SOURCES,
    ModelError,
    UsageError,
    check_space,
    human,
    marker_matches_controller,
    marker_matches_hf,
    pinned_and_complete,
    read_marker,
    stage_bytes,
    stage_of,
)


def under(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return path != root


def plan(models: list[dict], hub: Hub | None, min_free_bytes: int = 0, root: str | None = None) -> list[dict]:
    """What each model needs; raises ModelError naming every problem. Changes nothing."""
    problems: list[str] = []
    out: list[dict] = []
    for m in models:
        if not isinstance(m, dict):
            problems.append(f"models: {m!r}: each entry must be a mapping (the deploy description's models)")
            continue
        role, source, dest = m.get("role", "model"), m.get("source"), Path(str(m.get("local_dir")))
        item = {"role": role, "source": source, "local_dir": str(dest), "bytes": 0, "missing_bytes": 0,
                "action": "none", "label": str(dest)}
        try:
            if source in ("hf", "controller") and root and not under(dest, Path(root)):
                raise ModelError(f"{role} folder {dest}: not under the models root {root} "
                                 "(sglang_models_root): the unit and the models role must name the same root")
            if source == "hf":
                item["label"] = f"{m['repo']}@{m['revision']}"
                if pinned_and_complete(dest, m["repo"], m["revision"]) and not m.get("allow_patterns"):
                    item["bytes"] = int((read_marker(dest) or {}).get("total_bytes", 0))
                    out.append(item)
                    continue
                if hub is None:
                    raise UsageError("an endpoint is required for source hf")
                commit, files = remote_files(hub, m["repo"], m["revision"], m.get("allow_patterns") or None)
                item["commit"] = commit
                item["bytes"] = sum(f["size"] for f in files)
                if not marker_matches_hf(dest, m["repo"], m["revision"], files):
                    item["missing_bytes"] = item["bytes"] - stage_bytes(stage_of(dest), files)
                    item["action"] = "fetch"
            elif source == "path":
                if not dest.is_dir():
                    raise ModelError(f"{role} path {dest}: no such folder on this host (source: path expects the "
                                     "weights there already, e.g. on shared storage)")
                if not (dest / "config.json").is_file():
                    raise ModelError(f"{role} path {dest}: the folder has no config.json: not a model folder")
            elif source == "controller":
                item["label"] = f"{m['name']} (controller {m.get('controller_path')})"
                item["bytes"] = int(m.get("bytes") or 0)
                marker = read_marker(dest)
                if marker and marker.get("sha") != m["sha"] and m.get("version_given"):
                    raise ModelError(f"{role} {m['name']} version {m['version']} on this host has other content "
                                     f"(sha {str(marker.get('sha'))[:16]}) than the controller folder "
                                     f"(sha {m['sha'][:16]}): give the changed folder a new version")
                if not marker_matches_controller(dest, m["sha"]):
                    item["missing_bytes"] = item["bytes"]
                    item["action"] = "copy"
            else:
                raise UsageError(f"{role} source: {source!r}: must be one of {', '.join(SOURCES)}")
        except KeyError as exc:
            problems.append(f"{role}: the deploy description lacks {exc.args[0]!r}")
            continue
        except ModelError as exc:
            problems.append(str(exc))
            continue
        out.append(item)
    if problems:
        raise ModelError("; ".join(problems))
    check_space(out, min_free_bytes)
    return out


def describe(item: dict, check_mode: bool = False) -> str:
    """One line for people: what the deploy does with a model."""
    where = f"{item['role']} {item['label']} -> {item['local_dir']}"
    if item["action"] == "none":
        return f"{where}: in place"
    verb = ("would " if check_mode else "") + item["action"]
    return f"{where}: {verb} {human(item['missing_bytes'])} (of {human(item['bytes'])})"
