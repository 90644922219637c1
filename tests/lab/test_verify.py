"""`make verify` in the lab: the testinfra service checks pass on a deployed host and fail, naming the
problem, when something a verify must catch is broken (issue 3.4).

The suite runs as an operator runs it: a pytest subprocess with testinfra's ansible backend over the
lab inventory. Leaves ddtree-b15 running on lab1 as it found it (or as a deploy makes it).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
CONFIG = "ddtree-b15"
UNIT = f"sglang-{CONFIG}.service"
ENV_FILE = f"/etc/sglang/{CONFIG}.env"


def run_verify(lab, host: str, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "tests/infra/test_service.py",
           f"--hosts=ansible://{host}", f"--ansible-inventory={lab.inventory}", *extra]
    return subprocess.run(cmd, cwd=REPO, env=lab.ansible_env(), text=True, capture_output=True, timeout=600,
                          stdin=subprocess.DEVNULL)


def output(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def deployed(lab):
    start = time.monotonic()
    proc = lab.ansible_playbook("playbooks/deploy.yml", "-e", f"config={CONFIG}", "--limit", "lab1", check=False)
    assert proc.returncode == 0, output(proc)[-4000:]
    print(f"deploy {CONFIG} on lab1: {time.monotonic() - start:.1f} s")
    return "lab1"


def test_verify_passes_on_a_deployed_host(lab, deployed):
    start = time.monotonic()
    proc = run_verify(lab, deployed)
    print(f"verify: {time.monotonic() - start:.1f} s")
    out = output(proc)
    assert proc.returncode == 0, out[-5000:]
    assert "9 passed" in out and "skipped" not in out, out[-3000:]


def test_verify_fails_on_a_stopped_unit_and_an_open_env_file(lab, deployed):
    try:
        lab.ssh(deployed, f"systemctl stop {UNIT} && chmod 0644 {ENV_FILE}")
        proc = run_verify(lab, deployed, f"--config={CONFIG}")
        out = output(proc)
        assert proc.returncode == 1, out[-5000:]
        # Each problem is named, with the host and the config.
        assert f"lab1: {CONFIG}: {UNIT} is inactive, not active" in out, out[-5000:]
        assert f"lab1: {CONFIG}: {ENV_FILE} is 0644 root:sglang, expected 0640 root:sglang" in out, out[-5000:]
        assert f"{UNIT} has no main process, so nothing of it listens on" in out, out[-5000:]
        failed = {line.split("::")[1].split("[")[0] for line in out.splitlines() if line.startswith("FAILED ")}
        assert failed == {"test_unit_enabled_active_and_runs_as_sglang", "test_env_file_is_0640_root_sglang",
                          "test_port_bound_to_the_configured_address_only"}, out[-5000:]
    finally:
        lab.ssh(deployed, f"chmod 0640 {ENV_FILE}; systemctl start {UNIT}", check=False)
    lab.ssh(deployed, f"curl -sf --retry 60 --retry-delay 1 --retry-all-errors -o /dev/null "
                      f"http://{lab.address(deployed)}:30000/health", timeout=180)
    assert run_verify(lab, deployed).returncode == 0


def test_verify_fails_when_the_newest_record_is_not_green(lab, deployed):
    """A deploy that rolled back leaves the old release running, but the verify must not call it green."""
    records = f"/var/lib/sglang-deploy/{CONFIG}/records"
    newest = lab.ssh(deployed, f"ls -1 {records} | sort | tail -1").stdout.strip()
    fake = f"{records}/99991231T235959Z.json"
    try:
        lab.ssh(deployed, f"python3 -c \"import json,sys; r=json.load(open('{records}/{newest}')); "
                          "r['outcome']='rolled_back'; r['message']='acceptance gate failed'; "
                          f"json.dump(r, open('{fake}', 'w'))\"")
        proc = run_verify(lab, deployed, f"--config={CONFIG}")
        out = output(proc)
        assert proc.returncode == 1, out[-5000:]
        assert f"lab1: {CONFIG}: newest record {fake} has outcome 'rolled_back': acceptance gate failed" in out
    finally:
        lab.ssh(deployed, f"rm -f {fake}", check=False)


def test_host_with_nothing_deployed_is_skipped_with_the_reason(lab):
    if len(lab.hosts) < 2:
        pytest.skip("needs a second lab host")
    host = lab.hosts[-1]
    # Hide the host's deploy state for the duration of this test (no deploy runs meanwhile).
    lab.ssh(host, "mkdir -p /var/lib/sglang-deploy && mv /var/lib/sglang-deploy /var/lib/sglang-deploy.verify-hidden")
    try:
        proc = run_verify(lab, host)
        out = output(proc)
        assert proc.returncode == 0, out[-3000:]
        assert "9 skipped" in out and f"{host}: nothing deployed (no /var/lib/sglang-deploy/*/current.json)" in out
        named = run_verify(lab, host, f"--config={CONFIG}")
        assert named.returncode == 1
        assert f"{host}: {CONFIG} not deployed" in output(named), output(named)[-3000:]
    finally:
        lab.ssh(host, "rm -rf /var/lib/sglang-deploy && mv /var/lib/sglang-deploy.verify-hidden /var/lib/sglang-deploy",
                check=False)
