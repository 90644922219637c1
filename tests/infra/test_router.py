"""testinfra: every sglang-router unit on the host (role sglang_router, docs/router.md) runs the pinned
wheel as its own user, listens only where its unit says, answers /health, lists exactly its engines (each
healthy, no stranger) and keeps its worker API closed to anyone without its admin key.

    pytest tests/infra/test_router.py --hosts=ansible://gpu_hosts --ansible-inventory=INVENTORY

Hosts without a router skip. Every check reports every problem it finds, one line each.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml
from conftest import read_json
from test_service import listeners, main_pid, process_tree, report

# The same parser of a router unit as the status module (collection sgdeploy.host).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "collections"))
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_router_api as api  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_router_api import parse_router_unit  # noqa: E402

ROLE = Path(__file__).resolve().parents[2] / "collections/ansible_collections/sgdeploy/host/roles/sglang_router"
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())


@pytest.fixture
def routers(host) -> list[dict]:
    names = host.run("ls -1 /etc/systemd/system/ 2>/dev/null | grep '^sglang-router-.*\\.service$'").stdout.split()
    if not names:
        pytest.skip("no sglang-router unit on this host")
    return [{"unit": unit, **parse_router_unit(host.file(f"/etc/systemd/system/{unit}").content_string)}
            for unit in names]


# One request from the host, as root or another user: python3 reads the key from the router's environment
# file itself (``-`` for none), so the key is never on a command line. Prints the status, then the body.
CALL = r"""
import re, sys, urllib.error, urllib.request
method, url, env = sys.argv[1:4]
key = None
if env != "-":
    for line in open(env, encoding="utf-8"):
        if line.startswith("SGLANG_ROUTER_CONTROL_KEY="):
            key = re.sub(r"\\(.)", r"\1", line.split("=", 1)[1].strip()[1:-1])
headers = {"Content-Type": "application/json", **({"Authorization": "Bearer " + key} if key else {})}
body = b'{"url": "http://127.0.0.1:9"}' if method == "POST" else None
try:
    with urllib.request.urlopen(urllib.request.Request(url, body, headers, method=method), timeout=10) as r:
        print(r.status), print(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code), print(e.read().decode())
"""


def env_path(r: dict) -> str:
    return api.env_file(r["port"], DEFAULTS["sglang_router_env_dir"])


def call(host, method: str, url: str, env: str = "-", user: str | None = None) -> tuple[str, str]:
    """(HTTP status, body) of one request from the host; with ``env`` the router's key from that file."""
    cmd = f"python3 -c {shlex.quote(CALL)} {method} {shlex.quote(url)} {shlex.quote(env)}"
    if user:
        cmd = f"runuser -u {user} -- {cmd}"
    out = host.run(cmd).stdout
    status, _, body = out.partition("\n")
    return status.strip(), body


def test_router_enabled_active_as_its_own_user(host, routers):
    problems = []
    for r in routers:
        if not host.service(r["unit"]).is_enabled:
            problems.append(f"{r['unit']}: not enabled (it would not start at boot)")
        pid = main_pid(host, r["unit"])
        owner = host.run(f"ps -o user= -p {pid}").stdout.strip() if pid else ""
        if owner != DEFAULTS["sglang_router_user"]:
            problems.append(f"{r['unit']}: main process (pid {pid}) runs as {owner or '?'}, "
                            f"not {DEFAULTS['sglang_router_user']}")
        props = host.run(f"systemctl show -p NoNewPrivileges -p ProtectSystem -p CapabilityBoundingSet "
                         f"{shlex.quote(r['unit'])}").stdout
        for want in ("NoNewPrivileges=yes", "ProtectSystem=strict", "CapabilityBoundingSet=\n"):
            if want not in props + "\n":
                problems.append(f"{r['unit']}: not hardened: {want.strip()} missing")
    report(problems)


def test_router_runs_the_pinned_wheel(host, routers):
    problems = []
    version, sha = DEFAULTS["sglang_router_version"], DEFAULTS["sglang_router_wheel_sha256"]
    record = read_json(host, f"{DEFAULTS['sglang_router_root']}/{version}/router.json")
    if not record or record.get("wheel_sha256") != sha or record.get("version") != version:
        problems.append(f"router.json {record} does not name sglang-router {version} with sha256 {sha}")
    wheel = host.file(f"{DEFAULTS['sglang_router_root']}/wheels/{DEFAULTS['sglang_router_wheel']}")
    if not wheel.exists or hashlib.sha256(wheel.content).hexdigest() != sha:
        problems.append(f"{wheel.path}: missing or not the pinned wheel (sha256 {sha})")
    for r in routers:
        if not r["argv"] or not r["argv"][0].startswith(f"{DEFAULTS['sglang_router_root']}/{version}/venv/"):
            problems.append(f"{r['unit']}: runs {r['argv'][:1]}, not the venv of the pinned version {version}")
    report(problems)


def test_router_listens_only_at_its_address_and_lists_exactly_its_engines_healthy(host, routers):
    problems = []
    socks = listeners(host)
    for r in routers:
        tree = process_tree(host, main_pid(host, r["unit"]))
        own = sorted({(s["address"], str(s["port"])) for s in socks if s["pids"] & tree})
        wanted = sorted({(r["address"], r["port"]), (r["address"], r["metrics_port"])})
        if own != wanted:
            problems.append(f"{r['unit']}: listens on {own}, expected only {wanted}")
        base = f"http://{r['address']}:{r['port']}"
        health = host.run(f"curl -s -o /dev/null -w '%{{http_code}}' {base}/health").stdout.strip()
        if health != "200":
            problems.append(f"{r['unit']}: {base}/health answered {health or 'nothing'}")
            continue
        status, listed = call(host, "GET", f"{base}/workers", env_path(r))
        if status != "200":
            problems.append(f"{r['unit']}: GET /workers with the router's admin key answered {status or 'nothing'}")
            continue
        try:
            got = {w["url"].rstrip("/"): {"healthy": bool(w["is_healthy"])} for w in json.loads(listed)["workers"]}
        except (ValueError, KeyError, TypeError):
            problems.append(f"{r['unit']}: {base}/workers did not answer a worker list")
            continue
        strangers, missing, unhealthy = api.compare(got, r["workers"])
        problems += [f"{r['unit']}: engine {u} is not listed in the router" for u in missing]
        problems += [f"{r['unit']}: engine {u} is unhealthy in the router" for u in unhealthy]
        problems += [f"{r['unit']}: the router lists {u}, which its unit does not (a stranger added through the "
                     "worker API)" for u in strangers]
    report(problems)


def test_router_worker_api_needs_its_admin_key(host, routers):
    """Another user of the host (nobody) can neither list, add nor remove the router's workers; the key
    is in a file only root and the router's group read, not in the unit file or the router's argv."""
    problems = []
    for r in routers:
        base = f"http://{r['address']}:{r['port']}"
        for method, path in (("GET", "/workers"), ("POST", "/workers"), ("DELETE", "/workers/x")):
            code = call(host, method, base + path, user="nobody")[0]
            if code not in ("401", "403"):
                problems.append(f"{r['unit']}: {method} {path} as nobody without a key answered {code or 'nothing'}, "
                                "not 401/403")
        f = host.file(env_path(r))
        if not f.exists or (f.mode, f.user, f.group) != (0o640, "root", DEFAULTS["sglang_router_user"]):
            problems.append(f"{r['unit']}: {f.path} is not 0640 root:{DEFAULTS['sglang_router_user']}")
            continue
        key = api.read_env_text(f.content_string).get(api.CONTROL_KEY_VAR, "")
        if not key:
            problems.append(f"{r['unit']}: no {api.CONTROL_KEY_VAR} in {f.path}: its worker API answers anyone")
        unit_text = host.file(f"/etc/systemd/system/{r['unit']}").content_string
        argv = host.run(f"cat /proc/{main_pid(host, r['unit'])}/cmdline | tr '\\0' ' '").stdout
        if key and (key in unit_text or key in argv):
            problems.append(f"{r['unit']}: its admin key is in the unit file or the process's argv")
    report(problems)


# On a GPU host: every deploy of its deploy state (``<state_dir>/*/current.json``) whose unit is enabled (a replaced
# config or a retired replica has no current.json or no enabled unit), as JSON lines: its name, unit and engine port.
# What the fleet router must front is what runs there.
ENGINES = r"""
import glob, json, os, subprocess, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*", "current.json"))):
    try:
        cur = json.load(open(path, encoding="utf-8"))
        port = int(cur["ports"][0])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        continue
    unit = cur.get("unit_name") or "sglang-%s.service" % path.split("/")[-2]
    state = subprocess.run(["systemctl", "is-enabled", unit], capture_output=True, text=True).stdout.strip()
    print(json.dumps({"name": path.split("/")[-2], "unit": unit, "port": port, "enabled": state == "enabled"}))
"""


def gpu_host_engines(host, name: str) -> tuple[list[dict], str]:
    """The enabled deploys of GPU host ``name`` (ENGINES), asked on that host; ([], why) when it cannot be asked."""
    backend = host.backend
    other = host.get_host(f"ansible://{name}", ansible_inventory=backend.ansible_inventory,
                          ssh_config=backend.ssh_config, ssh_identity_file=backend.ssh_identity_file)
    state_dir = str(backend.ansible_runner.get_variables(name).get("sglang_deploy_state_dir") or
                    "/var/lib/sglang-deploy")
    try:
        out = other.run(f"python3 -c {shlex.quote(ENGINES)} {shlex.quote(state_dir)}")
    except RuntimeError as exc:   # testinfra raises when ssh itself fails
        return [], f"cannot run a command there ({exc})"
    if out.rc != 0:
        return [], f"cannot read its deploy state ({(out.stderr.strip().splitlines() or [out.rc])[-1]})"
    return [d for d in (json.loads(line) for line in out.stdout.splitlines() if line.strip()) if d["enabled"]], ""


REPLICA = re.compile(r"^(?P<config>.+)-r(?P<replica>[0-9]+)$")


def fleet_ports(engines: list[dict], port: int) -> list[int]:
    """The engine ports of a GPU host that the fleet router on ``port`` fronts, from the host's deploys: the engine
    on ``port`` (a config with one engine), and every replica behind ``port`` by the port rule (docs/router.md:
    replica i of a config with serving.replicas N, deployed as ``<config>-r<i>``, serves on ``port + 1 + 2i``; the
    same rule as the exporter's, module_utils/sglang_exporter.py)."""
    out = set()
    for d in engines:
        m = REPLICA.match(d["name"])
        if d["port"] == port or (m and d["port"] == port + 1 + 2 * int(m.group("replica"))):
            out.add(d["port"])
    return sorted(out)


def test_a_fleet_router_lists_the_engine_of_every_gpu_host(host, routers):
    """On a host of the inventory group routers (docs/router.md, "The fleet router"), each router's unit names every
    engine of every host of gpu_hosts that belongs to it (at the host's sglang_bind_address, else where Ansible reaches
    it) and nothing else; the check above then holds the router's live list to its unit's. Which engines belong to the
    router on port P is what each GPU host's deploy state says runs there (its enabled deploys, the same source as the
    engine checks): the engine on P of a config with one engine, or each replica (``P + 1 + 2i``) of a config with
    serving.replicas N, so that N is what was deployed, not what the controller's config says now. A GPU host with no
    such deploy is expected on P (one engine), and named. A GPU host's own router (replicas behind it) is not a fleet
    router: skipped."""
    hostvars = host.ansible.get_variables()
    if "routers" not in hostvars.get("group_names", []):
        pytest.skip("not a fleet router host (inventory group routers)")
    runner = host.backend.ansible_runner
    gpu_hosts = hostvars.get("groups", {}).get("gpu_hosts", [])
    problems = []
    if not gpu_hosts:
        problems.append("inventory group gpu_hosts has no host: the fleet router has no engine to list")
    deployed = {name: gpu_host_engines(host, name) for name in gpu_hosts}
    for r in routers:
        listed = {u.rstrip("/") for u in r["workers"]}
        claimed: set[str] = set()
        port = int(r["port"])
        for name in gpu_hosts:
            hv = runner.get_variables(name)
            addresses = [a for a in (hv.get("sglang_bind_address"), hv.get("ansible_host"), name) if a]
            engines, why = deployed[name]
            ports = fleet_ports(engines, port)
            if why:
                problems.append(f"{r['unit']}: GPU host {name}: {why}: its engines behind this router are not known")
            for p in ports or [port]:
                want = [f"http://{a}:{p}" for a in dict.fromkeys(addresses)]
                found = [u for u in want if u in listed]
                if not found:
                    what = "engine" if p == port else f"replica on port {p}"
                    problems.append(f"{r['unit']}: lists no {what} of {name} (expected {want[0]}): that engine gets "
                                    "no traffic through this fleet router"
                                    + ("" if ports or why else f" (and {name} has no deploy of port {port})"))
                claimed.update(found)
        problems += [f"{r['unit']}: lists {u}, which is no engine deployed on a host of gpu_hosts for port {port}"
                     for u in sorted(listed - claimed)]
    report(problems)
