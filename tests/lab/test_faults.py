"""Fault matrix of a deploy (issue 20): interruptions, lost hosts, bad input, full disks, reboots.

Real ansible-playbook over SSH against the lab's systemd hosts. After each fault: the previous
config serves (or, on a first deploy, nothing half-installed remains), the next deploy succeeds
without manual steps, and the record says what happened. The tests build on a baseline
(ddtree-b15 on lab1) that each one leaves serving again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_deploy import LAB_CONFIGS, RESET, active_unit, deploy, generate, output_of, server_info

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
FAULTS = LAB_CONFIGS / "faults"
STATE = "/var/lib/sglang-deploy"
B15 = "sglang-ddtree-b15.service"
SLOW = "sglang-lab-slow-start.service"


def main_pid(lab, unit: str, host: str = "lab1") -> str:
    return lab.ssh(host, f"systemctl show -p MainPID --value {unit}").stdout.strip()


def wait_on_host(lab, condition: str, seconds: float = 180, host: str = "lab1") -> None:
    lab.ssh(host, f"for i in $(seq {int(seconds * 5)}); do {condition} && exit 0; sleep 0.2; done; exit 1",
            timeout=seconds + 30)


def start_deploy(lab, config: str, limit: str = "lab1") -> subprocess.Popen:
    """ansible-playbook in its own process group (so that a test can kill it and all its workers)."""
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(lab.inventory), "playbooks/deploy.yml",
           "-e", f"config={config}", "--limit", limit]
    return subprocess.Popen(cmd, cwd=REPO, env=lab.ansible_env(), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)


def interrupt(proc: subprocess.Popen, sig: int) -> str:
    """Send `sig` to ansible-playbook (SIGKILL: to its whole process group, as a killed controller)."""
    if sig == signal.SIGKILL:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    return out


def newest_record(lab, config: str, host: str = "lab1") -> dict:
    path = lab.ssh(host, f"ls -1t {STATE}/{config}/records/*.json | head -1").stdout.strip()
    return json.loads(lab.ssh(host, f"cat {path}").stdout)


def assert_baseline_serves(lab) -> None:
    assert active_unit(lab, "lab1", B15) == "active"
    assert server_info(lab, "lab1")["speculative_ddtree_budget"] == 15
    assert generate(lab, "lab1")["text"]


def assert_no_lock(lab) -> None:
    assert lab.ssh("lab1", "test -e /run/sglang-deploy.lock", check=False).returncode != 0


@pytest.fixture(scope="module", autouse=True)
def baseline(lab):
    for host in lab.hosts:
        lab.ssh(host, RESET)
    proc = deploy(lab, "ddtree-b15")
    assert proc.returncode == 0, output_of(proc)[-3000:]
    yield


def recovering_deploy(lab, config: str = "lab-slow-start") -> str:
    """The next deploy of the baseline: it must finish the interrupted switch to `config` by itself."""
    proc = deploy(lab, "ddtree-b15")
    out = output_of(proc)
    assert proc.returncode == 0, out[-4000:]
    assert f"RECOVERED on lab1: found an interrupted switch to {config}" in out, out[-4000:]
    assert_baseline_serves(lab)
    unit = f"sglang-{config}.service"
    assert active_unit(lab, "lab1", unit) != "active"
    assert lab.ssh("lab1", f"test -e /etc/systemd/system/{unit}", check=False).returncode != 0
    assert_no_lock(lab)
    return out


def unit_journals(lab, *units: str, host: str = "lab1") -> str:
    """The last lines of the units' journals on the host (for a failed assertion's message)."""
    names = " ".join(f"-u {u}" for u in units)
    cmd = f"journalctl {names} --since -15min --no-pager -o short-precise | tail -60"
    return lab.ssh(host, cmd, check=False).stdout


def journal_at(step: str) -> str:
    return f"grep -q '\"step\": \"{step}\"' {STATE}/txn/journal.json"


def a_signal_is_rolled_back_by_the_next_deploy(lab, sig: int, step: str, config: str = "lab-slow-start",
                                               during: str = "", meanwhile: str = "") -> None:
    """Send `sig` to ansible-playbook deploying `config` once the switch journal is at `step` (and the
    host condition `during` holds; `meanwhile` runs on the host as soon as the journal exists), then:
    status names the interrupted switch, the next deploy takes the lock over with a message, rolls
    the switch back and serves the baseline, no job of the interrupted run is left on the host, and the
    record says what happened."""
    lab_config = LAB_CONFIGS / f"{config}.yml"  # a lab config, or else one of configs/
    first = start_deploy(lab, str(lab_config) if lab_config.exists() else config)
    try:
        if meanwhile:
            wait_on_host(lab, f"test -e {STATE}/txn/journal.json && ( {meanwhile} )", seconds=240)
        wait_on_host(lab, journal_at(step) + (f" && {during}" if during else ""), seconds=240)
        time.sleep(2)
    finally:
        interrupt(first, sig)
    status = lab.ansible_playbook("playbooks/status.yml", "--limit", "lab1", check=False)
    assert f"INTERRUPTED: found an interrupted switch to {config} (run " in status.stdout, output_of(status)[-3000:]
    assert f"step {step} since" in status.stdout, output_of(status)[-3000:]
    run_id = re.search(rf"interrupted switch to {re.escape(config)} \(run ([^ ,;)]+)", status.stdout).group(1)
    out = recovering_deploy(lab, config)
    # Issue 34: the run that recovers removes what the interrupted run staged (runs/<id>/, its env file included).
    assert lab.ssh("lab1", f"test -e {STATE}/runs/{run_id}", check=False).returncode != 0, \
        lab.ssh("lab1", f"ls -la {STATE}/runs", check=False).stdout
    assert "took over the deploy lock" in out and "its controller process is gone" in out, out[-4000:]
    record = newest_record(lab, config)
    assert record["outcome"] == "rolled_back" and record["rollback"]["interrupted_step"] == step, (
        json.dumps(record, indent=1) + "\n" + out[-4000:] + "\n" + unit_journals(lab, B15, f"sglang-{config}.service"))
    assert "interrupted switch" in record["message"] and record["rollback"]["restored"] == [B15], record
    # How each restored service's health wait ended is in the record (the reason, when it is not healthy).
    healthy = f"http://{lab.address('lab1')}:30000/health answers 200"
    assert [h.split(" (")[0] for h in record["rollback"]["health"]] == [healthy], record
    # `make status LIMIT=lab1` lists the interrupted config as rolled back (its table runs on localhost, which
    # LIMIT= keeps in the play since session 8).
    table = subprocess.run(["make", "-s", "--no-print-directory", "status", f"INVENTORY={lab.inventory}", "LIMIT=lab1"],
                           cwd=REPO,
                           env=lab.ansible_env(), text=True, capture_output=True, timeout=300, check=False)
    assert table.returncode == 0, output_of(table)[-3000:]
    row = next((line for line in table.stdout.splitlines() if f'"{config} ' in line and " lab1 " in line), "")
    assert " rolled_back " in row, table.stdout[-3000:]
    # Nothing of the interrupted run goes on (its gate job ran detached on the host).
    assert lab.ssh("lab1", "pgrep -af '[A]nsiballZ_sglang_gate'", check=False).stdout == ""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_a_signal_during_the_health_wait_is_rolled_back_by_the_next_deploy(lab, sig):
    a_signal_is_rolled_back_by_the_next_deploy(lab, sig, "started")


def reboot_and_wait(lab, host: str = "lab1") -> None:
    boot = lab.ssh(host, "cat /proc/sys/kernel/random/boot_id").stdout
    lab.ssh(host, "systemctl reboot", check=False)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        p = lab.ssh(host, "cat /proc/sys/kernel/random/boot_id", check=False, timeout=20)
        if p.returncode == 0 and p.stdout != boot:
            return
        time.sleep(2)
    pytest.fail(f"{host} did not come back from the reboot")


def test_sigkill_of_the_controller_during_the_gates_then_a_reboot(lab):
    first = start_deploy(lab, str(LAB_CONFIGS / "lab-slow-start.yml"))
    try:
        wait_on_host(lab, journal_at("gating"), seconds=240)
    finally:
        interrupt(first, signal.SIGKILL)
    reboot_and_wait(lab)
    # The new unit was never enabled: after the reboot the old service serves, not the gated one.
    wait_on_host(lab, f"systemctl is-active --quiet {B15}")
    assert active_unit(lab, "lab1", SLOW) != "active"
    out = recovering_deploy(lab)
    assert "took over the deploy lock" not in out  # the reboot cleared /run: no lock to take over
    assert newest_record(lab, "lab-slow-start")["rollback"]["interrupted_step"] == "gating"


def test_a_reboot_of_the_host_during_the_gates_leaves_the_old_service_and_the_next_deploy_recovers(lab):
    first = start_deploy(lab, str(LAB_CONFIGS / "lab-slow-start.yml"))
    try:
        wait_on_host(lab, journal_at("gating"), seconds=240)
        reboot_and_wait(lab)  # the run goes on against a host that went away under it
        out, _ = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            interrupt(first, signal.SIGKILL)
    assert first.returncode != 0
    assert "[lab1]" in out and ("UNREACHABLE" in out or "DEPLOY FAILED on lab1" in out), out[-3000:]
    wait_on_host(lab, f"systemctl is-active --quiet {B15}")
    assert active_unit(lab, "lab1", SLOW) != "active"
    proc = deploy(lab, "ddtree-b15")
    out = output_of(proc)
    assert proc.returncode == 0, out[-4000:]
    assert_baseline_serves(lab)
    assert lab.ssh("lab1", f"test -e /etc/systemd/system/{SLOW}", check=False).returncode != 0
    assert_no_lock(lab)
    # Rolled back by the interrupted run's own rescue (when the host was back in time) or by this one.
    record = newest_record(lab, "lab-slow-start")
    assert record["outcome"] == "rolled_back", record
    if "RECOVERED on lab1" in out:
        assert record["rollback"]["interrupted_step"] == "gating"


def in_host(lab, command: str, host: str = "lab1") -> subprocess.CompletedProcess:
    """Run a command in a lab host without ssh (in its PID 1's namespaces): for when sshd is down."""
    nspawn = (lab.host(host).dir / "nspawn.pid").read_text().strip()
    pid1 = subprocess.run(["ps", "--ppid", nspawn, "-o", "pid="], capture_output=True, text=True,
                          check=True).stdout.split()[0]
    return subprocess.run(["nsenter", "-t", pid1, "-a", "sh", "-c", command], capture_output=True, text=True,
                          timeout=60, check=False)


def test_an_unreachable_host_mid_deploy_is_named_and_the_next_deploy_recovers(lab):
    first = start_deploy(lab, str(LAB_CONFIGS / "lab-slow-start.yml"))
    try:
        wait_on_host(lab, journal_at("started"))
        # sshd goes, and every ssh session with it (the controller's multiplexed connection too).
        # The sessions stay in ssh.service's cgroup after the stop (KillMode=process): end those.
        in_host(lab, "systemctl stop ssh.service; for p in $(cat /sys/fs/cgroup/systemd/system.slice/ssh.service/"
                     "cgroup.procs); do [ \"$p\" -gt 1 ] && kill -KILL \"$p\"; done; true")
        out, _ = first.communicate(timeout=400)
    finally:
        if first.poll() is None:
            interrupt(first, signal.SIGKILL)
    try:
        assert first.returncode != 0
        assert "fatal: [lab1]: UNREACHABLE!" in out, out[-3000:]
        down = lab.ansible_playbook("playbooks/status.yml", check=False)  # all hosts: the summary runs on localhost
        assert down.returncode != 0
        assert "lab1: UNREACHABLE: what runs there is unknown" in output_of(down), output_of(down)[-3000:]
    finally:
        in_host(lab, "systemctl start ssh.service")
        for _ in range(60):
            if lab.ssh("lab1", "true", check=False, timeout=20).returncode == 0:
                break
            time.sleep(1)
    # Back: status says what runs (the uncommitted new unit, the stopped old one), the journal and the lock.
    status = output_of(lab.ansible_playbook("playbooks/status.yml", "--limit", "lab1", check=False))
    assert "INTERRUPTED: found an interrupted switch to lab-slow-start" in status, status[-3000:]
    assert "not running: ddtree-b15" in status, status[-3000:]
    assert "uncommitted (an interrupted switch, not enabled): lab-slow-start running" in status, status[-3000:]
    assert "deploy lock held by run" in status, status[-3000:]
    out = recovering_deploy(lab)
    assert "took over the deploy lock" in out  # its run's ansible-playbook is gone: no waiting for the lease
    record = newest_record(lab, "lab-slow-start")
    assert record["outcome"] == "rolled_back" and record["rollback"]["interrupted_step"] == "started"


def test_an_inventory_host_without_gpu_count_is_refused_before_the_lock(lab, tmp_path):
    inv = yaml.safe_load(lab.inventory.read_text())
    del inv["all"]["children"]["gpu_hosts"]["hosts"]["lab1"]["gpu_count"]
    bad = tmp_path / "inventory.yml"
    bad.write_text(yaml.safe_dump(inv))
    pid = main_pid(lab, B15)
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(bad), "playbooks/deploy.yml",
           "-e", "config=ddtree-b32", "--limit", "lab1"]
    proc = subprocess.run(cmd, cwd=REPO, env=lab.ansible_env(), text=True, capture_output=True, timeout=300,
                          check=False)
    assert proc.returncode != 0
    assert "inventory host lab1: gpu_count (not set) is not allowed" in output_of(proc), output_of(proc)[-3000:]
    assert_no_lock(lab)
    assert main_pid(lab, B15) == pid
    assert deploy(lab, "ddtree-b15").returncode == 0  # nothing left behind that refuses the next one


def test_a_refused_second_deploy_and_a_rollback_during_a_deploy_write_nothing(lab):
    first = start_deploy(lab, str(LAB_CONFIGS / "lab-slow-start.yml"))
    try:
        wait_on_host(lab, "test -e /run/sglang-deploy.lock")
        second = deploy(lab, str(FAULTS / "lab-slow-start.yml"))
        assert second.returncode != 0
        assert "DEPLOY REFUSED" in output_of(second) and "another deploy holds the lock" in output_of(second)
        rollback = lab.ansible_playbook("playbooks/rollback.yml", "-e", "config=ddtree-b15", "--limit", "lab1",
                                        check=False, timeout=300)
        assert rollback.returncode != 0
        assert "ROLLBACK REFUSED" in output_of(rollback) and "another deploy holds the lock" in output_of(rollback)
    finally:
        try:
            out, _ = first.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            os.killpg(first.pid, signal.SIGKILL)
            raise
    assert first.returncode == 0, out[-3000:]
    current = json.loads(lab.ssh("lab1", f"cat {STATE}/lab-slow-start/current.json").stdout)
    assert current["ports"][0] == 30000
    # Nothing of the refused file (port 30007) reached the host.
    assert lab.ssh("lab1", f"grep -rl 30007 {STATE} /etc/sglang /etc/systemd/system", check=False).stdout == ""
    proc = deploy(lab, "ddtree-b15")
    assert proc.returncode == 0, output_of(proc)[-3000:]
    assert newest_record(lab, "ddtree-b15")["outcome"] == "deployed"
    assert_baseline_serves(lab)


def test_a_unit_that_auto_restarted_once_deploys_again(lab):
    proc = deploy(lab, str(LAB_CONFIGS / "lab-port-31000.yml"))
    assert proc.returncode == 0, output_of(proc)[-3000:]
    unit = "sglang-lab-port-31000.service"
    lab.ssh("lab1", f"kill -KILL {main_pid(lab, unit)}")
    restarted_once = f"test \"$(systemctl show -p NRestarts --value {unit})\" = 1"
    wait_on_host(lab, f"{restarted_once} && systemctl is-active --quiet {unit}", seconds=120)
    proc = deploy(lab, str(FAULTS / "lab-port-31000.yml"))
    assert proc.returncode == 0, output_of(proc)[-3000:]
    assert newest_record(lab, "lab-port-31000")["outcome"] == "deployed"
    assert server_info(lab, "lab1", port=31000)["speculative_ddtree_budget"] == 16
    proc = deploy(lab, "ddtree-b15")
    assert proc.returncode == 0, output_of(proc)[-3000:]
    assert_baseline_serves(lab)


def test_a_full_disk_under_the_state_folder_leaves_the_old_service_serving(lab):
    # The state folder moves onto a 4 MiB tmpfs (its files copied in), then fills up during the
    # health wait of a deploy that fails: the undo must restart the old service before it writes.
    lab.ssh("lab1", f"rm -rf /root/state-save && cp -a {STATE} /root/state-save && mount -t tmpfs -o size=4m,mode=0755 "
                    f"tmpfs {STATE} && cp -a /root/state-save/. {STATE}/")
    try:
        run = start_deploy(lab, str(LAB_CONFIGS / "lab-never-healthy.yml"))
        try:
            wait_on_host(lab, journal_at("started"))
            lab.ssh("lab1", f"dd if=/dev/zero of={STATE}/fill bs=64k 2>/dev/null; true")
        finally:
            out, _ = run.communicate(timeout=300)
        assert run.returncode != 0
        assert_baseline_serves(lab)
        assert active_unit(lab, "lab1", "sglang-lab-never-healthy.service") != "active"
        # What the user is told: the deploy failed and the old service is back (the undo restarts
        # before it writes, so a full disk cannot stop it; the record may be what cannot be written).
        assert "Rolled back to sglang-ddtree-b15.service, healthy and answering again" in out, out[-3000:]
        lab.ssh("lab1", f"rm -f {STATE}/fill")
        proc = deploy(lab, "ddtree-b15")
        assert proc.returncode == 0, output_of(proc)[-3000:]
    finally:
        lab.ssh("lab1", f"umount {STATE}", check=False)
    proc = deploy(lab, "ddtree-b15")
    assert proc.returncode == 0, output_of(proc)[-3000:]
    assert_baseline_serves(lab)


def test_a_canary_secret_lands_only_in_the_env_file_on_the_host(lab, tmp_path):
    canary = f"canary-{os.urandom(8).hex()}"
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["all"]["children"]["gpu_hosts"]["hosts"]["lab1"]["sglang_secret_env"] = {"SGLANG_LAB_CANARY": canary}
    inventory = tmp_path / "inventory.yml"  # the operator's inventory (Vault in production)
    inventory.write_text(yaml.safe_dump(inv))
    seen_in_ps: list[str] = []
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-vvv", "-i", str(inventory), "playbooks/deploy.yml",
           "-e", f"config={LAB_CONFIGS / 'lab-port-31000.yml'}", "--limit", "lab1"]
    log = tmp_path / "deploy.log"  # a file, not a pipe: -vvv fills a pipe nobody reads while we poll
    with log.open("w") as sink:
        run = subprocess.Popen(cmd, cwd=REPO, env=lab.ansible_env(), text=True, stdout=sink, stderr=subprocess.STDOUT)
    try:
        while run.poll() is None:
            ps = lab.ssh("lab1", "ps -eo args=", check=False).stdout
            seen_in_ps += [line for line in ps.splitlines() if canary in line]
            local = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True, check=False).stdout
            seen_in_ps += [line for line in local.splitlines() if canary in line]
            time.sleep(0.5)
    finally:
        run.wait(timeout=600)
    out = log.read_text()
    assert run.returncode == 0, out[-3000:]
    assert canary not in out
    assert not seen_in_ps
    for folder in ("build", "reports"):
        # The lab hosts' own root filesystems live under build/lab*/hosts/: that is the host, not the controller.
        hits = subprocess.run(["grep", "-rl", "--exclude-dir=rootfs", canary, str(REPO / folder)],
                              capture_output=True, text=True, check=False).stdout
        assert hits == "", hits
    env_file = "/etc/sglang/lab-port-31000.env"
    folders = "/etc /var/lib /opt /run /tmp /root /usr/local"
    found = lab.ssh("lab1", f"grep -rlI {canary} {folders} 2>/dev/null; true").stdout
    assert found.split() == [env_file]
    assert lab.ssh("lab1", f"stat -c '%a %U %G' {env_file}").stdout.split() == ["640", "root", "sglang"]
    assert lab.ssh("lab1", f"journalctl --no-pager | grep -c {canary}; true").stdout.strip() == "0"
    # The service sees it (it is its environment), and nothing else does.
    pid = main_pid(lab, "sglang-lab-port-31000.service")
    assert canary in lab.ssh("lab1", f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout
    proc = deploy(lab, "ddtree-b15")
    assert proc.returncode == 0, output_of(proc)[-3000:]
    assert_baseline_serves(lab)


def test_non_default_state_dir_service_user_env_dir_and_release_root_work_end_to_end(lab, tmp_path):
    """Issue 19: every variable in the role's argument_specs works; testinfra checks the host."""
    if len(lab.hosts) < 2:
        pytest.skip("needs a second lab host")
    settings = {"sglang_deploy_state_dir": "/srv/sgd-state", "sglang_deploy_service_user": "sgsvc",
                "sglang_deploy_env_dir": "/etc/sgsvc", "sglang_deploy_release_root": "/srv/sgd-releases"}
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["all"]["children"]["gpu_hosts"]["hosts"]["lab2"].update(settings)
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(inv))
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), "playbooks/deploy.yml",
           "-e", "config=ddtree-b15", "--limit", "lab2"]
    proc = subprocess.run(cmd, cwd=REPO, env=lab.ansible_env(), text=True, capture_output=True, timeout=900,
                          check=False)
    try:
        assert proc.returncode == 0, output_of(proc)[-4000:]
        unit = lab.ssh("lab2", "systemctl cat sglang-ddtree-b15.service").stdout
        assert "User=sgsvc" in unit and "EnvironmentFile=/etc/sgsvc/ddtree-b15.env" in unit
        assert "/srv/sgd-releases/" in unit
        assert lab.ssh("lab2", "ls /srv/sgd-state/ddtree-b15/current.json /srv/sgd-state/ddtree-b15/records/").stdout
        assert lab.ssh("lab2", "test -e /var/lib/sglang-deploy/ddtree-b15", check=False).returncode != 0
        infra = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                                "tests/infra/test_service.py", "--hosts=ansible://lab2",
                                f"--ansible-inventory={inventory}"], cwd=REPO,
                               env=lab.ansible_env(), text=True, capture_output=True, timeout=300, check=False)
        assert infra.returncode == 0, infra.stdout[-3000:] + infra.stderr[-2000:]
        assert "passed" in infra.stdout and "skipped" not in infra.stdout, infra.stdout[-2000:]
    finally:
        lab.ssh("lab2", "systemctl disable --now sglang-ddtree-b15.service; "
                        "rm -rf /etc/systemd/system/sglang-ddtree-b15.service /srv/sgd-state /etc/sgsvc; "
                        "systemctl daemon-reload", check=False)


def with_secret(lab, tmp_path, value: str) -> Path:
    inv = yaml.safe_load(lab.inventory.read_text())
    inv["all"]["children"]["gpu_hosts"]["hosts"]["lab1"]["sglang_secret_env"] = {"SGLANG_LAB_TOKEN": value}
    inventory = tmp_path / f"inventory-{len(list(tmp_path.iterdir()))}.yml"  # the operator's (Vault in production)
    inventory.write_text(yaml.safe_dump(inv))
    return inventory


def deploy_from(lab, inventory: Path, config: str) -> subprocess.CompletedProcess:
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), "playbooks/deploy.yml",
           "-e", f"config={config}", "--limit", "lab1"]
    return subprocess.run(cmd, cwd=REPO, env=lab.ansible_env(), text=True, capture_output=True, timeout=900,
                          check=False)


def test_a_secrets_only_change_is_deployed_not_judged_unchanged(lab, tmp_path):
    config, unit = str(LAB_CONFIGS / "lab-port-31000.yml"), "sglang-lab-port-31000.service"
    old, new = f"old-{os.urandom(8).hex()}", f"new-{os.urandom(8).hex()}"
    for value, outcome in ((old, None), (old, "unchanged"), (new, "deployed")):
        proc = deploy_from(lab, with_secret(lab, tmp_path, value), config)
        out = output_of(proc)
        assert proc.returncode == 0, out[-3000:]
        assert old not in out and new not in out
        if outcome:
            assert newest_record(lab, "lab-port-31000")["outcome"] == outcome
    # The new value is what the service runs with, and the plan said only "changed".
    assert lab.ssh("lab1", f"grep -c {new} /etc/sglang/lab-port-31000.env").stdout.strip() == "1"
    assert new in lab.ssh("lab1", f"tr '\\0' '\\n' < /proc/{main_pid(lab, unit)}/environ").stdout
    proc = deploy(lab, "ddtree-b15")
    assert proc.returncode == 0, output_of(proc)[-3000:]
    assert_baseline_serves(lab)


def under_load(lab, tmp_path, name: str, *deploy_args: str) -> dict:
    """A deploy while tests/lab/unhealthy_window.py sends 10 requests/s to lab1's port 30000."""
    out = tmp_path / f"{name}.json"
    cmd = [sys.executable, str(REPO / "tests/lab/unhealthy_window.py"), "--url", f"http://{lab.address('lab1')}:30000",
           "--rate", "10", "--max-requests", "3000", "--max-seconds", "500", "--json", str(out), "--",
           str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(lab.inventory), "playbooks/deploy.yml",
           "--limit", "lab1", *deploy_args]
    subprocess.run(cmd, cwd=REPO, env=lab.ansible_env(), text=True, capture_output=True, timeout=600, check=False)
    result = json.loads(out.read_text())
    timings = REPO / "build" / "lab-unhealthy-window.json"
    saved = json.loads(timings.read_text()) if timings.exists() else {}
    saved[name] = {k: v for k, v in result.items() if k != "output_tail"}
    timings.parent.mkdir(exist_ok=True)
    timings.write_text(json.dumps(saved, indent=1))
    return result


def test_a_switch_and_a_rollback_under_steady_load_drop_no_accepted_request(lab, tmp_path):
    """Drain under steady load: the deploy finishes; requests fail only while nothing listens or the
    server turns them away (503 while draining or loading); none that was taken is dropped."""
    switch = under_load(lab, tmp_path, "switch", "-e", "config=ddtree-b32")
    assert switch["rc"] == 0, switch["output_tail"]
    assert switch["broken"] == 0 and switch["ok"] > 0, switch["windows"]
    assert server_info(lab, "lab1")["speculative_ddtree_budget"] == 32
    proc = deploy(lab, "ddtree-b15")
    assert proc.returncode == 0, output_of(proc)[-3000:]
    rollback = under_load(lab, tmp_path, "rollback", "-e", "config=ddtree-b64-nofork")  # fails its acceptance gate
    assert rollback["rc"] != 0 and "Rolled back to sglang-ddtree-b15.service" in rollback["output_tail"]
    assert rollback["broken"] == 0 and rollback["ok"] > 0, rollback["windows"]
    assert all(w["closed"] for w in rollback["windows"]), rollback["windows"]  # it answers again at the end
    assert_baseline_serves(lab)
