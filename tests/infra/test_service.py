"""testinfra: the SGLang service of every deployed config is what the deploy says it is.

    pytest tests/infra/test_service.py --hosts=ansible://gpu_hosts --ansible-inventory=INVENTORY [--config=NAME]

For each config whose `/var/lib/sglang-deploy/<config>/current.json` is on the host (or each --config):
the release it names is installed and patched for the config, the unit is enabled, active and runs as
the service user its current.json names (`sglang` by default) with `HF_HUB_OFFLINE=1`, the service port
is bound to the configured address only, the
environment file (secrets) is 0640 root:<service group>, the unit and env file are the ones the deploy
installed (no drift: the digests current.json recorded), the model weights match the checksums recorded when
they were fetched (every file is read), and the newest deploy record is green. Every check
looks at all the configs of the host and reports every problem it finds, one line each.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from conftest import read_json  # the helper the fixtures use too (tests/infra/conftest.py)

# The same parser of `ss -ltnpH` as the deploy's plan module (collection sgdeploy.host).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "collections"))
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_units import parse_ss  # noqa: E402

SGLANG_VERSION = "0.5.23"
WILDCARDS = ("0.0.0.0", "::", "*")


def main_pid(host, unit: str) -> int:
    out = host.run(f"systemctl show -p MainPID --value {shlex.quote(unit)}").stdout.strip()
    return int(out) if out.isdigit() else 0


def process_tree(host, pid: int) -> set[int]:
    """`pid` and every process below it."""
    children: dict[int, list[int]] = {}
    for line in host.run("ps -eo pid=,ppid=").stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            children.setdefault(int(parts[1]), []).append(int(parts[0]))
    tree, todo = set(), [pid]
    while todo:
        p = todo.pop()
        if p not in tree:
            tree.add(p)
            todo += children.get(p, [])
    return tree


def listeners(host) -> list[dict]:
    """Listening TCP sockets as `ss -ltnpH` sees them: address, port and owning pids (a set)."""
    return [dict(s, pids=set(s["pids"])) for s in parse_ss(host.run("ss -ltnpH").stdout)]


def record_sort_key(name: str) -> tuple[str, int]:
    """Record file names sort by finish time; `T.json` < `T-2.json` < `T-10.json` (same second)."""
    stem = name.removesuffix(".json")
    base, dash, n = stem.rpartition("-")
    if dash and n.isdigit():
        return base, int(n)
    return stem, 1


def report(problems: list[str]) -> None:
    assert not problems, "\n".join(problems)


def config_features(d, record: dict | None) -> tuple[tuple[str, ...], str]:
    """The patch features the config selects: from configs/<name>.yml here, else from its deploy record."""
    from sgdeploy import spec

    try:
        return spec.load(d.config).patch_features, f"configs/{d.config}.yml"
    except spec.ConfigError:
        if record is None:
            return (), ""
        return tuple(record.get("features") or ()), "its newest deploy record"


def newest_record(host, d) -> tuple[str, dict | None]:
    listing = host.run(f"ls -1 {shlex.quote(d.state_dir)}/records/ 2>/dev/null").stdout.split()
    names = sorted((n for n in listing if n.endswith(".json")), key=record_sort_key)
    if not names:
        return "", None
    path = f"{d.state_dir}/records/{names[-1]}"
    return path, read_json(host, path)


def test_release_installed_and_patched_for_the_config(host, deployments):
    problems = []
    for d in deployments:
        python = f"{d.release_dir}/venv/bin/python"
        if not host.file(python).exists:
            problems.append(f"{d}: release {d.release} is not installed: {python} is missing")
            continue
        meta = read_json(host, f"{d.release_dir}/release.json")
        if meta is None:
            problems.append(f"{d}: {d.release_dir}/release.json is missing or not JSON")
        elif meta.get("label") != d.release:
            problems.append(f"{d}: {d.release_dir}/release.json says label {meta.get('label')!r}, "
                            f"current.json says {d.release!r}")
        probe = host.run(f"{shlex.quote(python)} -c "
                         + shlex.quote("import importlib.metadata as m; print(m.version('sglang'))"))
        version = probe.stdout.strip()
        if probe.rc != 0:
            problems.append(f"{d}: {python} cannot read the sglang distribution's version: "
                            f"{(probe.stderr.strip().splitlines() or ['exit ' + str(probe.rc)])[-1]}")
        elif version != f"{SGLANG_VERSION}+{d.release}":
            problems.append(f"{d}: the release's sglang is {version}, expected {SGLANG_VERSION}+{d.release}")
        # One patched build serves every config that uses a patched feature (docs/build.md); the
        # pristine wheel (`stock`) serves the others.
        _path, record = newest_record(host, d)
        wanted, source = config_features(d, record)
        patched = d.release != "stock"
        if source and bool(wanted) != patched:
            what = "the patched build" if patched else "the pristine wheel (stock)"
            uses = f"uses the patched features {list(wanted)}" if wanted else "uses no patched feature"
            problems.append(f"{d}: release {d.release} is {what}, but {source} {uses}: redeploy the config")
        if patched and meta is not None and not meta.get("features"):
            problems.append(f"{d}: release.json of the patched build {d.release} lists no features")
        unit_exec = host.run(f"systemctl show -p ExecStart --value {shlex.quote(d.unit)}").stdout
        if f"path={python} " not in unit_exec and f"path={python};" not in unit_exec:
            problems.append(f"{d}: {d.unit} does not run the release's python {python}: ExecStart {unit_exec.strip()}")
    report(problems)


def test_unit_enabled_active_and_runs_as_sglang(host, deployments):
    problems = []
    for d in deployments:
        service = host.service(d.unit)
        if not service.is_enabled:
            problems.append(f"{d}: {d.unit} is not enabled (it would not start at boot)")
        state = host.run(f"systemctl is-active {shlex.quote(d.unit)}").stdout.strip()
        if state != "active":
            problems.append(f"{d}: {d.unit} is {state or 'unknown'}, not active")
            continue
        user = host.run(f"systemctl show -p User --value {shlex.quote(d.unit)}").stdout.strip()
        if user != d.service_user:
            problems.append(f"{d}: {d.unit} has User={user or '(root)'}, expected {d.service_user}")
        pid = main_pid(host, d.unit)
        owner = host.run(f"ps -o user= -p {pid}").stdout.strip() if pid else ""
        if owner != d.service_user:
            problems.append(f"{d}: {d.unit}'s main process (pid {pid}) runs as {owner or '?'}, not {d.service_user}")
    report(problems)


def test_port_bound_to_the_configured_address_only(host, hostvars, deployments):
    problems = []
    socks = listeners(host)
    for d in deployments:
        configured = hostvars.get("sglang_bind_address") or d.bind_address
        if d.bind_address != configured:
            problems.append(f"{d}: deployed to bind {d.bind_address}, the inventory's sglang_bind_address is "
                            f"{configured}: redeploy the config")
        if d.bind_address in WILDCARDS:
            problems.append(f"{d}: binds to every address ({d.bind_address}); set serving.host or "
                            "sglang_bind_address to one address")
        wild = [s for s in socks if s["port"] == d.port and s["address"] in WILDCARDS]
        for s in wild:
            problems.append(f"{d}: port {d.port} is open on every address: {s['line']}")
        pid = main_pid(host, d.unit)
        if not pid:
            problems.append(f"{d}: {d.unit} has no main process, so nothing of it listens on "
                            f"{d.bind_address}:{d.port}")
            continue
        tree = process_tree(host, pid)
        own = [s for s in socks if s["pids"] & tree]
        if not any(s["port"] == d.port and s["address"] == d.bind_address for s in own):
            where = sorted({f"{s['address']}:{s['port']}" for s in own})
            problems.append(f"{d}: {d.unit} (pid {pid}) does not listen on {d.bind_address}:{d.port}; "
                            f"it listens on {', '.join(where) or 'nothing'}")
        for s in own:
            if s["port"] in d.current["ports"] and s["address"] != d.bind_address:
                problems.append(f"{d}: {d.unit} listens on {s['address']}:{s['port']}, not only on {d.bind_address}")
    report(problems)


def test_env_file_is_0640_root_sglang(host, deployments):
    problems = []
    for d in deployments:
        f = host.file(d.env_file)
        if not f.exists:
            problems.append(f"{d}: {d.env_file} is missing")
            continue
        if (f.mode, f.user, f.group) != (0o640, "root", d.service_user):
            problems.append(f"{d}: {d.env_file} is {f.mode:04o} {f.user}:{f.group}, expected 0640 "
                            f"root:{d.service_user} (it may hold secrets)")
    report(problems)


def test_unit_and_env_file_are_what_the_deploy_installed(host, deployments):
    """Drift: a unit or env file edited by hand since the deploy (the digests its commit recorded in
    current.json), or a unit that is not 0644 root:root. The next deploy puts them right."""
    problems = []
    for d in deployments:
        unit = f"/etc/systemd/system/{d.unit}"
        for path, key in ((unit, "unit_sha256"), (d.env_file, "env_sha256")):
            f = host.file(path)
            if not f.exists:
                problems.append(f"{d}: {path} is missing")
                continue
            want = d.current.get(key)
            if want and f.sha256sum != want:
                problems.append(f"{d}: {path} was edited by hand since the deploy (its sha256 is not the one "
                                f"{d.state_dir}/current.json recorded); the next deploy puts it right")
        f = host.file(unit)
        if f.exists and (f.mode, f.user, f.group) != (0o644, "root", "root"):
            problems.append(f"{d}: {unit} is {f.mode:04o} {f.user}:{f.group}, expected 0644 root:root")
    report(problems)


# Run on the host with python3: every file of a model folder's marker (written when it was first fetched
# or copied) against its sha256 (or, for small hf files, its git blob id). Prints one line per problem.
CHECK_MANIFEST = r"""
import hashlib, json, os, sys
folder = sys.argv[1]
try:
    marker = json.load(open(os.path.join(folder, ".sgdeploy-complete.json")))
except (OSError, ValueError):
    print(f"{folder}: no readable .sgdeploy-complete.json (its manifest)"); sys.exit(0)
for f in marker.get("files", []):
    path = os.path.join(folder, f["name"])
    if not os.path.isfile(path):
        print(f"{path}: missing"); continue
    if "sha256" in f:
        h, want = hashlib.sha256(), f["sha256"]
    elif "blob_id" in f:
        h, want = hashlib.sha1(b"blob %d\0" % os.path.getsize(path)), f["blob_id"]
    else:
        continue
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    if h.hexdigest() != want:
        print(f"{path}: checksum {h.hexdigest()} is not {want}, the one recorded when it was fetched")
"""


def model_folders(host, unit: str) -> list[str]:
    """The unit's --model-path and --speculative-draft-model-path."""
    argv = host.run(f"systemctl show -p ExecStart --value {shlex.quote(unit)}").stdout
    words = argv.replace(";", " ").split()
    return [words[i + 1] for i, w in enumerate(words[:-1])
            if w in ("--model-path", "--speculative-draft-model-path")]


def test_model_weights_match_the_checksums_recorded_at_their_fetch(host, deployments):
    """A weight file corrupted in place (same size) is named: every file of the folder's marker is hashed."""
    problems = []
    for d in deployments:
        for folder in model_folders(host, d.unit):
            if not host.file(f"{folder}/.sgdeploy-complete.json").exists:
                continue  # source: path (the operator's own folder; docs/models.md)
            out = host.run(f"python3 -c {shlex.quote(CHECK_MANIFEST)} {shlex.quote(folder)}")
            problems += [f"{d}: {line}" for line in out.stdout.splitlines() if line.strip()]
            if out.rc != 0:
                problems.append(f"{d}: {folder}: the checksum check failed: {out.stderr.strip()[-300:]}")
    report(problems)


def test_newest_deploy_record_is_green(host, deployments):
    problems = []
    for d in deployments:
        path, record = newest_record(host, d)
        if not path:
            problems.append(f"{d}: no deploy record in {d.state_dir}/records/")
            continue
        if record is None:
            problems.append(f"{d}: {path} is not readable JSON")
            continue
        outcome, gates = record.get("outcome"), record.get("gates") or []
        if outcome not in ("deployed", "unchanged"):
            problems.append(f"{d}: newest record {path} has outcome {outcome!r}: {record.get('message', '')}")
        if not gates:
            problems.append(f"{d}: newest record {path} has no gate results")
        for g in gates:
            if g.get("verdict") != "pass":
                problems.append(f"{d}: newest record {path}: gate {g.get('gate')} {g.get('verdict')}: "
                                f"{g.get('reason')}")
        if record.get("release") != d.release:
            problems.append(f"{d}: newest record {path} is of release {record.get('release')}, "
                            f"current.json says {d.release}")
    report(problems)


def test_hf_hub_offline(host, deployments):
    problems = []
    for d in deployments:
        env = host.run(f"systemctl show -p Environment --value {shlex.quote(d.unit)}").stdout.split()
        if "HF_HUB_OFFLINE=1" not in env:
            problems.append(f"{d}: {d.unit} does not set HF_HUB_OFFLINE=1 (Environment: {' '.join(env) or 'none'})")
        pid = main_pid(host, d.unit)
        if pid:
            # The environment file is applied after Environment= and could override it: ask the process.
            running = host.run(f"tr '\\0' '\\n' < /proc/{pid}/environ")
            values = [v for v in running.stdout.splitlines() if v.startswith("HF_HUB_OFFLINE=")]
            if running.rc == 0 and values != ["HF_HUB_OFFLINE=1"]:
                problems.append(f"{d}: {d.unit}'s process (pid {pid}) runs with {values or 'no HF_HUB_OFFLINE'}")
    report(problems)


MODEL_FLAGS = ("--model-path", "--speculative-draft-model-path")


def test_model_folders_of_the_unit_are_on_the_host(host, hostvars, deployments):
    """The folders the unit loads exist; those under the models root (inventory sglang_deploy_models_root,
    else sglang_models_root, else /var/lib/sglang/models) belong to the service user."""
    root = str(hostvars.get("sglang_deploy_models_root") or hostvars.get("sglang_models_root")
               or "/var/lib/sglang/models").rstrip("/")
    problems = []
    for d in deployments:
        exec_start = host.run(f"systemctl show -p ExecStart --value {shlex.quote(d.unit)}").stdout
        argv = exec_start.partition("argv[]=")[2].partition(" ;")[0].split()
        folders = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in MODEL_FLAGS]
        if not folders:
            problems.append(f"{d}: {d.unit} names no --model-path (ExecStart {exec_start.strip()[:200]})")
        for folder in folders:
            f = host.file(folder)
            if not f.is_directory:
                problems.append(f"{d}: {d.unit} loads {folder}, which is not a folder on the host")
            elif folder.startswith(root + "/") and f.user != d.service_user:
                problems.append(f"{d}: {folder} (under the models root {root}) belongs to {f.user}, "
                                f"not the service user {d.service_user}")
    report(problems)


@pytest.fixture(autouse=True)
def _name_the_configs(request, deployments):
    """Show which configs a check covered (pytest -rA / -v prints them with the result)."""
    request.node.user_properties.append(("configs", json.dumps([d.config for d in deployments])))
