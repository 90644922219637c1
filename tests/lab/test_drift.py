"""Issue 34 item 5: drift is found and undone; no secret outlives its rotation in the deploy state.

Real ansible-playbook over SSH against the lab: a unit edited by hand (NoNewPrivileges=no,
ProtectSystem=no, --trust-remote-code) and an env file made 0644 are put right by the next deploy,
which says `drift corrected`; `make plan` names them first. previous.json keeps no secret text; a
rollback after a token rotation runs with the current token; an interrupted run's staging folder is
removed by the next run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_deploy import deploy, output_of, server_info
from test_faults import baseline  # noqa: F401 (the module's baseline: ddtree-b15 on lab1, autouse)

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
STATE = "/var/lib/sglang-deploy"
B15 = "sglang-ddtree-b15.service"
UNIT = f"/etc/systemd/system/{B15}"
ENV = "/etc/sglang/ddtree-b15.env"


def main_pid(lab, unit: str) -> str:
    return lab.ssh("lab1", f"systemctl show -p MainPID --value {unit}").stdout.strip()


def playbook(lab, inventory: Path, playbook_name: str, config: str, *extra: str) -> subprocess.CompletedProcess:
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), playbook_name,
           "-e", f"config={config}", "--limit", "lab1", *extra]
    return subprocess.run(cmd, cwd=REPO, env=lab.ansible_env(), text=True, capture_output=True, timeout=900,
                          check=False)


def with_token(lab, tmp_path, value: str) -> Path:
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["all"]["children"]["gpu_hosts"]["hosts"]["lab1"]["sglang_secret_env"] = {"HF_TOKEN": value}
    inventory = tmp_path / f"inventory-{value}.yml"  # the operator's (Vault in production)
    inventory.write_text(yaml.safe_dump(inv))
    return inventory


def test_a_hand_edited_unit_and_a_0644_env_file_are_put_right_by_the_next_deploy(lab):
    edits = ("-e 's/^NoNewPrivileges=yes/NoNewPrivileges=no/' -e 's/^ProtectSystem=.*/ProtectSystem=no/' "
             "-e '/^ExecStart=/ s/$/ --trust-remote-code/'")
    lab.ssh("lab1", f"sed -i {edits} {UNIT} && chmod 0644 {ENV} && systemctl daemon-reload")
    # An interrupted run's staging folder (its env file with the secrets).
    lab.ssh("lab1", f"mkdir -p {STATE}/runs/20261203T000000Z-gone1234 && echo 'HF_TOKEN=\"x\"' > "
                    f"{STATE}/runs/20261203T000000Z-gone1234/ddtree-b15.env")
    plan = deploy(lab, "ddtree-b15", "--check", "--diff")
    out = output_of(plan)
    assert plan.returncode == 0, out[-3000:]
    assert (f"drift: {UNIT}: hand-edited (ExecStart, NoNewPrivileges, ProtectSystem differ from the rendered unit)"
            in out), out[-3000:]
    assert f"drift: {ENV}: mode 0644, expected 0640" in out
    assert lab.ssh("lab1", f"stat -c %a {ENV}").stdout.strip() == "644"  # the plan changed nothing

    proc = deploy(lab, "ddtree-b15")
    out = output_of(proc)
    assert proc.returncode == 0, out[-3000:]
    line = next(ln for ln in out.splitlines() if "DEPLOYED on lab1" in ln)
    assert f"drift corrected: {UNIT}: hand-edited (ExecStart, NoNewPrivileges, ProtectSystem" in line, line
    assert f"drift corrected: {ENV}: mode 0644, expected 0640" in line, line
    assert "unchanged" not in line
    assert "removed the staging folder of interrupted run 20261203T000000Z-gone1234" in out
    assert lab.ssh("lab1", f"ls {STATE}/runs/ 2>/dev/null; true").stdout.strip() == ""
    unit = lab.ssh("lab1", f"cat {UNIT}").stdout
    assert "NoNewPrivileges=yes" in unit and "ProtectSystem=strict" in unit and "--trust-remote-code" not in unit
    assert lab.ssh("lab1", f"stat -c '%a %U %G' {ENV}").stdout.split() == ["640", "root", "sglang"]
    args = lab.ssh("lab1", f"tr '\\0' ' ' < /proc/{main_pid(lab, B15)}/cmdline").stdout
    assert "--trust-remote-code" not in args
    assert server_info(lab, "lab1")["speculative_ddtree_budget"] == 15

    again = deploy(lab, "ddtree-b15")
    assert again.returncode == 0, output_of(again)[-3000:]
    line = next(ln for ln in output_of(again).splitlines() if "DEPLOYED on lab1" in ln)
    assert ", unchanged." in line and "drift" not in line


def test_no_secret_in_the_state_and_a_rollback_after_a_rotation_uses_the_current_token(lab, tmp_path):
    old, new = f"tok-old-{os.urandom(8).hex()}", f"tok-new-{os.urandom(8).hex()}"
    for config in ("ddtree-b15", "ddtree-b32"):  # b32 replaces b15: its previous.json is b15's
        proc = playbook(lab, with_token(lab, tmp_path, old), "playbooks/deploy.yml", config)
        assert proc.returncode == 0, output_of(proc)[-3000:]
    # The env files (b15's stays with its disabled unit), and no state file.
    assert lab.ssh("lab1", f"grep -rl {old} {STATE}; true").stdout.strip() == ""
    assert "env_public" in lab.ssh("lab1", f"cat {STATE}/ddtree-b32/previous.json").stdout

    proc = playbook(lab, with_token(lab, tmp_path, new), "playbooks/rollback.yml", "ddtree-b32")
    out = output_of(proc)
    assert proc.returncode == 0, out[-3000:]
    assert old not in out and new not in out
    assert server_info(lab, "lab1")["speculative_ddtree_budget"] == 15
    environ = lab.ssh("lab1", f"tr '\\0' '\\n' < /proc/{main_pid(lab, B15)}/environ").stdout
    assert f"HF_TOKEN={new}" in environ and old not in environ
    assert lab.ssh("lab1", f"grep -c {old} {ENV}; true").stdout.strip() == "0"
    assert lab.ssh("lab1", f"grep -rl {old} {STATE}; true").stdout.strip() == ""
    assert lab.ssh("lab1", f"grep -rl {new} {STATE}; true").stdout.strip() == ""
    assert lab.ssh("lab1", f"stat -c '%a %U %G' {ENV}").stdout.split() == ["640", "root", "sglang"]
    assert lab.ssh("lab1", f"ls {STATE}/runs/ 2>/dev/null; true").stdout.strip() == ""
    proc = deploy(lab, "ddtree-b15")  # back to the module's baseline (no secret)
    assert proc.returncode == 0, output_of(proc)[-3000:]


def test_make_verify_names_a_hand_edited_unit_and_a_weight_corrupted_at_the_same_size(lab):
    weights = "/var/lib/sglang/models/Qwen--Qwen3.6-27B/main/model.safetensors"
    lab.ssh("lab1", f"cp -a {weights} /root/weights.bak && cp -a {UNIT} /root/unit.bak && "
                    f"printf X | dd of={weights} bs=1 seek=100 conv=notrunc status=none && "
                    f"sed -i 's/^NoNewPrivileges=yes/NoNewPrivileges=no/' {UNIT}")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests/infra/test_service.py",
           "--hosts=ansible://lab1", f"--ansible-inventory={lab.inventory}"]
    try:
        proc = subprocess.run(cmd, cwd=REPO, env=lab.ansible_env(), text=True, capture_output=True, timeout=600,
                              stdin=subprocess.DEVNULL, check=False)
    finally:
        lab.ssh("lab1", f"cp -a /root/weights.bak {weights} && cp -a /root/unit.bak {UNIT} && "
                        "rm /root/weights.bak /root/unit.bak")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert f"{UNIT} was edited by hand since the deploy" in out, out[-3000:]
    assert f"{weights}: checksum " in out and "the one recorded when it was fetched" in out, out[-3000:]
