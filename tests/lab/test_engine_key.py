"""An engine API key per config (issue 34 item 2), end to end in the lab.

A config that names ``serving.api_key_secret`` is deployed with the key in the inventory's
``sglang_secret_env`` (Vault in production). The deploy's own callers on the host (warm-up, the four
gates with the exactness self-check, make status) read the key there and send it, so the deploy passes;
the engine answers 401 without the key; the key is in no argv, unit file, journal, controller folder
(build/, reports/) or deploy record/state.

Checked on the code before this change: the deploy failed at its warm-up ("healthy, but /generate answered
HTTP 401") and was rolled back; with the warm-up's change alone it failed at the smoke gate (401); without
the smoke gate's `unit` in rollback_one.yml the rollback failed at its smoke gate. The 401/200, no-leak and
status checks come after the deploy, so they need it to pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from test_cli import make, status_lines
from test_deploy import LAB_CONFIGS, RESET, newest_record, output_of

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
CONFIG = "lab-engine-key"
UNIT = f"sglang-{CONFIG}.service"


@pytest.fixture(scope="module", autouse=True)
def fresh_hosts(lab):
    """Start and end with hosts that serve nothing (the key must not outlive this file)."""
    lab.ssh("lab1", RESET)
    yield
    lab.ssh("lab1", RESET)


def keyed_inventory(lab, tmp_path: Path, key: str) -> Path:
    """The lab's inventory with the engine key in lab1's sglang_secret_env (the operator's file, not build/)."""
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["all"]["children"]["gpu_hosts"]["hosts"]["lab1"]["sglang_secret_env"] = {"SGLANG_LAB_ENGINE_KEY": key}
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    return path


def post_generate(url: str, key: str | None) -> int:
    """The HTTP status of one /generate from the controller (the lab hosts share its network)."""
    body = json.dumps({"text": "Hello", "sampling_params": {"temperature": 0, "max_new_tokens": 4}}).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url + "/generate", body, headers), timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


def files_holding(root: Path, needle: bytes, skip: Path) -> list[str]:
    """Files under ``root`` (not under ``skip``) that hold ``needle``."""
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and skip not in path.parents:
            try:
                if needle in path.read_bytes():
                    found.append(str(path))
            except OSError:
                continue
    return found


def test_a_keyed_config_deploys_through_its_gates_and_the_key_stays_on_the_host(lab, tmp_path):
    key = f"lab-engine-key-{os.urandom(12).hex()}"
    inventory = keyed_inventory(lab, tmp_path, key)
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), "playbooks/deploy.yml",
           "-e", f"config={LAB_CONFIGS / (CONFIG + '.yml')}", "--limit", "lab1"]
    proc = subprocess.run(cmd, cwd=REPO, env=lab.ansible_env(), text=True, capture_output=True, timeout=900,
                          check=False)
    out = output_of(proc)
    # New: the warm-up, the gates (exactness self-check included) and the bench send the key.
    assert proc.returncode == 0, out[-4000:]
    assert key not in out
    record = newest_record(lab, "lab1", CONFIG)
    assert record["outcome"] == "deployed", record.get("message")
    assert {g["gate"]: g["verdict"] for g in record["gates"]} == {
        "smoke": "pass", "throughput": "pass", "acceptance": "pass"}, record["gates"]
    assert record["exactness"]["verdict"] == "pass", record["exactness"]

    # A rollback to it (rollback_one.yml: its warm-up and smoke gate) also sends the key: replace it by
    # ddtree-b32 (same GPU and port), then roll that back by hand.
    b32 = make(lab, "deploy", "CONFIG=ddtree-b32", f"INVENTORY={inventory}", "LIMIT=lab1")
    assert b32.returncode == 0, (b32.stdout + b32.stderr)[-3000:]
    back = make(lab, "rollback", "CONFIG=ddtree-b32", f"INVENTORY={inventory}", "LIMIT=lab1")
    assert back.returncode == 0, (back.stdout + back.stderr)[-3000:]
    assert key not in b32.stdout + b32.stderr + back.stdout + back.stderr
    assert newest_record(lab, "lab1", "ddtree-b32")["outcome"] == "rolled_back"

    # The engine asks for the key; the deploy's key opens it.
    url = f"http://{lab.address('lab1')}:30000"
    assert post_generate(url, None) == 401
    assert post_generate(url, "not-" + key) == 401
    assert post_generate(url, key) == 200

    # The key is in no argv, unit file, journal, controller folder or deploy record/state. Searched with the
    # key on stdin (grep -f -), so that no search puts it in an argv itself.
    assert lab.ssh("lab1", f"systemctl is-active {UNIT}").stdout.strip() == "active"
    assert key not in lab.ssh("lab1", "ps -eo args").stdout
    assert key not in lab.ssh("lab1", f"systemctl cat {UNIT}").stdout
    assert key not in lab.ssh("lab1", "journalctl --no-pager -o cat", timeout=300).stdout
    held = lab.ssh("lab1", "grep -rlF -f - /var/lib/sglang-deploy /etc/systemd/system "
                           "2>/dev/null; true", input=key + "\n").stdout.split()
    assert held == [], held
    # It is where it belongs: the config's env file, root-readable only.
    env = lab.ssh("lab1", f"stat -c '%a %U:%G' /etc/sglang/{CONFIG}.env; grep -cF -f - /etc/sglang/{CONFIG}.env",
                  input=key + "\n").stdout.split("\n")
    assert env[:2] == ["640 root:sglang", "1"], env
    # The controller's folders; the lab hosts' own disks (build/lab/hosts/*/rootfs) are the hosts', not its.
    hosts = lab.config.dir.resolve() / "hosts"
    for folder in ("build", "reports"):
        assert files_holding(REPO / folder, key.encode(), hosts) == [], folder

    # make status: the keyed engine serves (its /health needs no key).
    status = make(lab, "status", f"INVENTORY={inventory}", "LIMIT=lab1")
    assert status.returncode == 0, (status.stdout + status.stderr)[-3000:]
    assert key not in status.stdout + status.stderr
    lines = status_lines(status)
    now = lines[2:lines.index("")]
    assert [line.split()[:3] for line in now] == [["lab1", CONFIG, "serving"]], lines


def test_keyed_replicas_roll_behind_the_router_with_the_key(lab, tmp_path):
    """Two keyed replicas behind the router: the router is given the key (it sends it to its engines and
    asks its clients for it); a second rollout's canary is benched beside the old replica with the key."""
    lab.ssh("lab1", RESET)
    key = f"lab-engine-key-{os.urandom(12).hex()}"
    inventory = keyed_inventory(lab, tmp_path, key)
    for budget in (15, 32):
        proc = make(lab, "deploy", f"CONFIG={LAB_CONFIGS / f'lab-replicas-key-b{budget}.yml'}",
                    f"INVENTORY={inventory}", "LIMIT=lab1")
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
        assert f"ROLLED OUT on lab1: lab-replicas-key-b{budget}, 2 replica(s)" in out, out[-3000:]
        assert key not in out
    canary = newest_record(lab, "lab1", "lab-replicas-key-b32-r0")
    assert canary["outcome"] == "deployed" and canary["same_window"]["bench"]["completed"] > 0, canary

    address = lab.address("lab1")
    for port in (31200, 31201, 31203):  # the router, then each replica
        url = f"http://{address}:{port}"
        assert (post_generate(url, None), post_generate(url, key)) == (401, 200), url
    router_unit = "sglang-router-31200.service"
    assert key not in lab.ssh("lab1", "ps -eo args").stdout
    assert key not in lab.ssh("lab1", f"systemctl cat {router_unit} sglang-lab-replicas-key-b32-r0.service").stdout
    assert key not in lab.ssh("lab1", "journalctl --no-pager -o cat", timeout=300).stdout
    held = lab.ssh("lab1", "grep -rlF -f - /var/lib/sglang-deploy /etc/systemd/system 2>/dev/null; true",
                   input=key + "\n").stdout.split()
    assert held == [], held
