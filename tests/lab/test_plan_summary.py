"""Issue 33 items 4, 5 and 7 in the lab: a plan is a plan (PLAN on HOST, diffs against what is installed,
nothing changes), one closing summary after the last host, waits as progress (never FAILED - RETRYING),
`make verify` on hosts never provisioned says so in one line, and provisioning refuses to reboot a host
that serves.

Order matters: ddtree-b15 serves on lab1 first (the baseline), the plan and the deploy of ddtree-b32
build on it, and the provisioning check runs last, on the host that serves ddtree-b32.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_output import task_statuses
from test_deploy import HOST_FILES, RESET, active_unit, deploy, output_of, recap

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
SECRET = "hf_plan_secret_value_8c1f"


def main_pid(lab, unit: str) -> str:
    return lab.ssh("lab1", f"systemctl show -p MainPID --value {unit}").stdout.strip()


@pytest.fixture(scope="module", autouse=True)
def b15_serves(lab):
    lab.ssh("lab1", RESET)
    proc = deploy(lab, "ddtree-b15")
    assert proc.returncode == 0, output_of(proc)[-4000:]
    yield


def test_plan_prints_plan_diffs_against_the_installed_files_and_changes_nothing(lab):
    before = lab.ssh("lab1", HOST_FILES).stdout
    pid = main_pid(lab, "sglang-ddtree-b15.service")
    proc = deploy(lab, "ddtree-b32", "--check", "--diff", "-e", json.dumps({"sglang_secret_env": {"HF_TOKEN": SECRET}}))
    out = output_of(proc)
    assert proc.returncode == 0, out[-4000:]
    assert "PLAN on lab1: would replace ddtree-b15 with ddtree-b32" in out, out[-3000:]
    assert "DEPLOYED on" not in out and "was down for" not in out, out[-3000:]
    # The unit and the env file are diffed against the ones installed for ddtree-b15, not an empty file.
    assert "--- before: /etc/systemd/system/sglang-ddtree-b15.service" in out, out[-5000:]
    assert "+++ after: /etc/systemd/system/sglang-ddtree-b32.service" in out
    assert "-ExecStart=" in out and "--speculative-ddtree-budget 32" in out
    assert "--- before: /etc/sglang/ddtree-b15.env" in out and "HF_TOKEN=<secret, changed>" in out, out[-5000:]
    assert SECRET not in out
    # `changed` only where a real run would change something: never on the stop or start of the switch.
    statuses = task_statuses(out)
    steps = (r"Stop \(drain\)|Start the new service|Install the unit|Back up every unit|Journal the gates"
             r"|Record what runs now")
    switch_steps = [t for t in statuses if re.search(steps, t)]
    assert not [t for t in switch_steps if "changed" in statuses[t]], {t: statuses[t] for t in switch_steps}
    plan = [t for t in statuses if t.startswith("sgdeploy.host.sglang_deploy : Plan the switch (")]
    assert len(plan) == 1 and "changed" in statuses[plan[0]], (plan, out[-3000:])
    # Nothing changed: the same files, the same process, no lock left.
    assert lab.ssh("lab1", HOST_FILES).stdout == before
    assert main_pid(lab, "sglang-ddtree-b15.service") == pid
    assert active_unit(lab, "lab1", "sglang-ddtree-b15.service") == "active"
    assert lab.ssh("lab1", "test -e /run/sglang-deploy.lock", check=False).returncode != 0
    # The last lines: the summary says it was a plan.
    tail = out[out.index("PLAY RECAP"):]
    assert re.search(r"^  lab1 +ddtree-b15 -> ddtree-b32 +plan: would change ", tail, re.M), tail


def test_plan_of_what_runs_says_no_change_and_changes_nothing(lab):
    proc = deploy(lab, "ddtree-b15", "--check", "--diff")
    out = output_of(proc)
    assert proc.returncode == 0, out[-4000:]
    assert "PLAN on lab1: no change" in out, out[-3000:]
    assert recap(proc.stdout, "lab1")["changed"] == 0, out[-3000:]


def test_a_deploy_ends_with_one_summary_and_waits_as_progress(lab):
    proc = deploy(lab, "ddtree-b32")
    out = output_of(proc)
    assert proc.returncode == 0, out[-4000:]
    assert "FAILED - RETRYING" not in out, out[-4000:]
    # Skipped tasks are hidden by default (ANSIBLE_DISPLAY_SKIPPED_HOSTS=true shows them).
    assert "skipping: [" not in out and "skipping: no hosts" not in out
    assert '"msg": "DEPLOYED on lab1: ddtree-b32' in out
    tail = out[out.index("PLAY RECAP"):]
    lines = tail[tail.index("SUMMARY"):].splitlines()
    assert lines[1].split()[:6] == ["host", "config", "before", "->", "after", "outcome"], tail
    row = next((line for line in lines if line.startswith("  lab1 ")), "")
    m = re.fullmatch(r"  lab1 +ddtree-b15 -> ddtree-b32 +deployed +smoke PASS; throughput PASS [0-9.]+ tok/s; "
                     r"acceptance PASS [0-9.]+; watch off +[0-9.]+ s +(reports/deploys/lab1/\S+\.json)", row)
    assert m, tail
    assert (REPO / m.group(1)).is_file()
    assert row == out.rstrip().splitlines()[-1]  # the last line of the output


def test_verify_on_hosts_never_provisioned_says_so_in_one_line(lab):
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests/infra", "--hosts=ansible://lab1",
           f"--ansible-inventory={lab.inventory}"]
    proc = subprocess.run(cmd, cwd=REPO, env=lab.ansible_env(), text=True, capture_output=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    out = output_of(proc)
    assert proc.returncode == 1, out[-4000:]
    assert " failed" not in out, out[-4000:]
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("NOT PROVISIONED: lab1 (nvidia-open-580 is not installed)"), last
    assert "`make provision`" in last, last


def test_provision_refuses_to_reboot_a_host_that_serves(lab):
    pid = main_pid(lab, "sglang-ddtree-b32.service")
    proc = lab.ansible_playbook("playbooks/provision.yml", "--limit", "lab1", check=False, timeout=900)
    out = output_of(proc)
    assert proc.returncode != 0, out[-4000:]
    assert "PROVISION REFUSED on lab1 before any change: sglang-ddtree-b32.service serves here" in out, out[-4000:]
    assert "provision_allow_drain=true" in out and "Traceback" not in out
    assert main_pid(lab, "sglang-ddtree-b32.service") == pid  # neither stopped nor rebooted
    assert lab.ssh("lab1", "dpkg-query -W nvidia-open-580", check=False).returncode != 0  # nothing installed
