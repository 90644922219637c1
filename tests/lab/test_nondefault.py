"""A non-default models root through a full deploy (issue 19: every argument_specs variable works end to end).

Real ansible-playbook over SSH against a lab host: the inventory sets ``sglang_deploy_models_root``; the
weights land there, the unit loads them from there, nothing goes to the default root, and testinfra
(tests/infra/test_service.py) finds the host as the deploy says it is.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_deploy import output_of

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
ROOT = "/srv/sgd-models"
DEFAULT_ROOT = "/var/lib/sglang/models"
UNIT = "sglang-ddtree-b15.service"


def test_a_non_default_models_root_works_end_to_end(lab, tmp_path):
    if len(lab.hosts) < 2:
        pytest.skip("needs a second lab host")
    host = "lab2"
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["all"]["children"]["gpu_hosts"]["hosts"][host]["sglang_deploy_models_root"] = ROOT
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(inv))
    before = lab.ssh(host, f"find {DEFAULT_ROOT} -mindepth 2 -maxdepth 2 2>/dev/null | sort").stdout
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), "playbooks/deploy.yml",
           "-e", "config=ddtree-b15", "--limit", host]
    proc = subprocess.run(cmd, cwd=REPO, env=lab.ansible_env(), text=True, capture_output=True, timeout=900,
                          check=False)
    try:
        assert proc.returncode == 0, output_of(proc)[-4000:]
        exec_start = lab.ssh(host, f"systemctl show -p ExecStart --value {UNIT}").stdout
        assert f"--model-path {ROOT}/" in exec_start, exec_start
        assert f"--speculative-draft-model-path {ROOT}/" in exec_start, exec_start
        assert DEFAULT_ROOT not in exec_start, exec_start
        # The weights are under the new root, owned by the service user; the default root got nothing new.
        owners = lab.ssh(host, f"find {ROOT} -mindepth 2 -maxdepth 2 -type d -printf '%u %p\\n'").stdout.split("\n")
        assert [o for o in owners if o] and all(o.startswith("sglang ") for o in owners if o), owners
        assert lab.ssh(host, f"find {DEFAULT_ROOT} -mindepth 2 -maxdepth 2 2>/dev/null | sort").stdout == before
        infra = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA",
                                "tests/infra/test_service.py", f"--hosts=ansible://{host}",
                                f"--ansible-inventory={inventory}"], cwd=REPO,
                               env=lab.ansible_env(), text=True, capture_output=True, timeout=300, check=False)
        assert infra.returncode == 0, infra.stdout[-3000:] + infra.stderr[-2000:]
        assert "test_model_folders_of_the_unit_are_on_the_host" in infra.stdout, infra.stdout[-2000:]
        assert " skipped" not in infra.stdout, infra.stdout[-2000:]
    finally:
        lab.ssh(host, f"systemctl disable --now {UNIT}; rm -f /etc/systemd/system/{UNIT} /etc/sglang/ddtree-b15.env; "
                      f"rm -rf /var/lib/sglang-deploy/ddtree-b15 {ROOT}; systemctl daemon-reload", check=False)
