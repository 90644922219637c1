"""testinfra: every sglang-router unit on the host (role sglang_router, docs/router.md) runs the pinned
wheel as its own user, listens only where its unit says, answers /health and lists its engines healthy.

    pytest tests/infra/test_router.py --hosts=ansible://gpu_hosts --ansible-inventory=INVENTORY

Hosts without a router skip. Every check reports every problem it finds, one line each.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
from pathlib import Path

import pytest
import yaml
from conftest import read_json
from test_service import listeners, main_pid, process_tree, report

# The same parser of a router unit as the status module (collection sgdeploy.host).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "collections"))
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_router_api import parse_router_unit  # noqa: E402

DEFAULTS = yaml.safe_load((Path(__file__).resolve().parents[2] / "roles" / "sglang_router" / "defaults" /
                           "main.yml").read_text())


@pytest.fixture
def routers(host) -> list[dict]:
    names = host.run("ls -1 /etc/systemd/system/ 2>/dev/null | grep '^sglang-router-.*\\.service$'").stdout.split()
    if not names:
        pytest.skip("no sglang-router unit on this host")
    return [{"unit": unit, **parse_router_unit(host.file(f"/etc/systemd/system/{unit}").content_string)}
            for unit in names]


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


def test_router_listens_only_at_its_address_and_lists_its_engines_healthy(host, routers):
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
        listed = host.run(f"curl -sf {base}/workers").stdout
        try:
            got = {w["url"]: w["is_healthy"] for w in json.loads(listed)["workers"]}
        except (ValueError, KeyError, TypeError):
            problems.append(f"{r['unit']}: {base}/workers did not answer a worker list")
            continue
        for url in r["workers"]:
            if not got.get(url):
                problems.append(f"{r['unit']}: engine {url} is {'unhealthy' if url in got else 'not listed'} "
                                "in the router")
    report(problems)
