"""The sweep drives Ansible through ansible-runner (issue 35): what it asks of runner, how it reads runner's
events and return codes, and that runner takes neither the sweep's signals nor its restore.

Most tests stand in for ``ansible_runner.run`` (they check the arguments and feed events back); one runs a
real ansible-runner with a local playbook that signals the sweep in the middle of a deploy.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
from pathlib import Path

import yaml
from test_sweep_plan import Fake, inventory

from sgdeploy import sweep, tunnel


def become_inventory(tmp_path) -> Path:
    inv = tmp_path / "prod.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {"gpu_hosts": {
        "hosts": {"gpu-01": {"ansible_host": "10.0.0.11", "gpu_count": 8}},
        "vars": {"ansible_user": "ubuntu", "ansible_become": True, "ansible_port": 2222,
                 "sglang_deploy_state_dir": "/srv/sglang-deploy"}}}}}))
    return inv


class FakeRunner:
    """What ``ansible_runner.run`` returns: status, rc and the stdout file."""

    def __init__(self, status: str, rc: int, stdout: str = ""):
        self.status, self.rc, self._stdout = status, rc, stdout

    @property
    def stdout(self):
        return io.StringIO(self._stdout)


def event(kind: str, host: str = "gpu-01", task: str = "a task", ignore_errors: bool | None = None, **res) -> dict:
    return {"event": kind, "stdout": f"{kind} [{host}]",
            "event_data": {"host": host, "task": task, "ignore_errors": ignore_errors, "res": res}}


def fake_runner(monkeypatch, respond) -> list[dict]:
    """Replace ``ansible_runner.run``: ``respond(kwargs)`` gives (status, rc, events, stdout); the handlers the
    sweep passed get the start and the events as runner would call them."""
    calls: list[dict] = []

    def run(**kw):
        calls.append(kw)
        status, rc, events, stdout = respond(kw)
        kw["status_handler"]({"status": "starting", "command": ["ansible-playbook", "x.yml"]}, runner_config=None)
        for e in events:
            kw["event_handler"](e)
        return FakeRunner(status, rc, stdout)

    monkeypatch.setattr(sweep.ansible_runner, "run", run)
    return calls


def prepared(tmp_path, monkeypatch, budgets="15 16", *extra: str) -> sweep.Sweep:
    monkeypatch.setattr(sweep, "BUILD_DIR", tmp_path / "build")
    args = sweep.build_parser().parse_args(["--config", "ddtree-b15-nofork", "--budgets", budgets, "--inventory",
                                            str(become_inventory(tmp_path)), "--out", str(tmp_path / "r"), *extra])
    s = sweep.prepare(args)
    s.deployed = list(s.variants)
    return s


# --------------------------------------------------------------------------------------------------
# The cleanup: runner's ad-hoc module, with the inventory's become and state folder


def test_the_cleanup_runs_through_ansible_runner_with_the_inventorys_become_and_state_dir(tmp_path, monkeypatch):
    """ansible_user: ubuntu + ansible_become: true (inventory/example.yml): the cleanup must run as the deploy
    does, through Ansible (which applies become and the SSH settings), never as the bare SSH user."""
    s = prepared(tmp_path, monkeypatch, "15 16", "-e", "ansible_become_method=sudo")

    def no_bare_ssh(*a, **k):
        raise AssertionError("the cleanup ran over a bare SSH connection (no become)")

    monkeypatch.setattr(tunnel, "run", no_bare_ssh)
    calls = fake_runner(monkeypatch, lambda kw: ("successful", 0, [event("runner_on_ok", rc=0, stdout="")], ""))
    assert s.cleanup_variants(stop=True) is None
    (kw,) = calls
    assert kw["module"] == "ansible.builtin.shell" and kw["host_pattern"] == "gpu-01"
    assert kw["inventory"] == str((tmp_path / "prod.yml").resolve())
    assert kw["cmdline"] == "-e ansible_become_method=sudo"
    # runner's own SIGINT/SIGTERM handlers stay out (they would take the sweep's), its output stays quiet
    # (the sweep prints its own lines) and its artifacts go under build/, not /tmp
    assert callable(kw["cancel_callback"]) and kw["cancel_callback"]() is False and kw["quiet"] is True
    assert Path(kw["private_data_dir"]) == tmp_path / "build" / s.sweep_id / "ansible-runner"
    assert not (Path(kw["private_data_dir"]) / "artifacts" / kw["ident"]).exists()
    script = json.loads(kw["module_args"])["cmd"]
    assert "systemctl disable --now --quiet" in script
    assert "sglang-ddtree-b15-nofork-b15-k8.service sglang-ddtree-b15-nofork-b16-k8.service" in script
    assert "/srv/sglang-deploy/ddtree-b15-nofork-b16-k8" in script and "/var/lib/sglang-deploy" not in script
    assert "/etc/systemd/system" not in script  # the unit is asked of systemd, wherever it lives


def test_a_failed_cleanup_is_one_line_naming_the_host_result(tmp_path, monkeypatch):
    s = prepared(tmp_path, monkeypatch, "32")
    fake_runner(monkeypatch, lambda kw: ("failed", 2, [event(
        "runner_on_failed", rc=1, stdout="sglang-ddtree-b15-nofork-b32-k8.service is still active\n", stderr="",
        msg="non-zero return code")], "[WARNING]: something\n"))
    assert s.cleanup_variants(stop=True) == (
        "stopping the variant units failed (ansible exit 2): gpu-01 | FAILED | rc=1 | (stdout) "
        "sglang-ddtree-b15-nofork-b32-k8.service is still active")


def test_an_unreachable_host_and_a_timeout_are_one_line_each(tmp_path, monkeypatch):
    s = prepared(tmp_path, monkeypatch, "32")
    fake_runner(monkeypatch, lambda kw: ("failed", 4, [event(
        "runner_on_unreachable", msg="Failed to connect to the host via ssh: Permission denied (publickey).",
        unreachable=True)], ""))
    assert s.cleanup_variants(stop=False) == (
        "stopping the variant units failed (ansible exit 4): gpu-01 | UNREACHABLE!: Failed to connect to the host "
        "via ssh: Permission denied (publickey).")
    calls = fake_runner(monkeypatch, lambda kw: ("timeout", 254, [], ""))
    assert s.cleanup_variants(stop=False) == ("stopping the variant units failed (ansible exit 254): gpu-01: no "
                                              f"answer in {sweep.ADHOC_TIMEOUT_S} s")
    assert calls[0]["timeout"] == sweep.ADHOC_TIMEOUT_S


# --------------------------------------------------------------------------------------------------
# What runs before: the status module's result from runner's runner_on_ok event


def test_running_before_reads_the_status_modules_result_from_its_event(tmp_path, monkeypatch):
    s = prepared(tmp_path, monkeypatch, "15")
    deployed = [{"config": "ddtree-b15", "active": True, "gpus": [0], "ports": [30000], "bind_address": "127.0.0.1"},
                {"config": "elsewhere", "active": True, "gpus": [7], "ports": [31000], "bind_address": "127.0.0.1"},
                {"config": "stopped", "active": False, "gpus": [0], "ports": [30000], "bind_address": "127.0.0.1"}]
    calls = fake_runner(monkeypatch, lambda kw: ("successful", 0, [
        event("runner_on_ok", changed=False, deployed=deployed)], "gpu-01 | SUCCESS => {not json"))
    assert s.running_before() == ["ddtree-b15"]
    assert calls[0]["module"] == "sgdeploy.host.sglang_deploy_status"
    assert json.loads(calls[0]["module_args"]) == {"state_dir": "/srv/sglang-deploy"}
    fake_runner(monkeypatch, lambda kw: ("failed", 2, [event("runner_on_failed", msg="state folder unreadable")], ""))
    try:
        s.running_before()
    except tunnel.TunnelError as exc:
        assert str(exc) == ("gpu-01: reading what runs there (sgdeploy.host.sglang_deploy_status) exited 2: "
                            "gpu-01 | FAILED! => state folder unreadable")
    else:
        raise AssertionError("no TunnelError")


# --------------------------------------------------------------------------------------------------
# A deploy: runner's playbook run, its outcome from status, rc and the runner_on_failed events


def test_a_deploy_is_runners_playbook_with_the_config_as_extravars(tmp_path, monkeypatch):
    s = prepared(tmp_path, monkeypatch, "15", "-e", "@vault.yml")
    calls = fake_runner(monkeypatch, lambda kw: ("successful", 0, [event("runner_on_ok")], "PLAY RECAP\n"))
    log = tmp_path / "logs" / "v.log"
    result = s.deploy(s.variants[0].path, "smoke", log, sweep.Signals(lambda line: None))
    assert result.ok and result.message == "" and result.log == log
    (kw,) = calls
    assert kw["playbook"] == str(sweep.PLAYBOOK) and kw["limit"] == "gpu-01"
    assert kw["extravars"] == {"config": str(s.variants[0].path), "sglang_deploy_gate_mode": "smoke"}
    assert kw["cmdline"] == "-e @vault.yml" and kw["project_dir"] == str(sweep.REPO_ROOT)
    # The log: the command runner ran, then everything Ansible printed.
    assert log.read_text() == "$ ansible-playbook x.yml\nPLAY RECAP\n"
    assert oct(log.stat().st_mode & 0o777) == oct(sweep.report.FILE_MODE)


def test_the_failure_is_the_roles_verdict_else_the_last_failed_task_never_an_ignored_one():
    def run(*events, stdout="", status="failed", rc=2):
        return sweep.AnsibleRun(status, rc, list(events), stdout, [])

    rescued = event("runner_on_failed", msg="health: no answer in 60 s")
    verdict = event("runner_on_failed", msg="DEPLOY FAILED on lab1: ddtree-b15 (release x) at step\n 'health': "
                                            "no answer.  Rolled back")
    ignored = event("runner_on_failed", ignore_errors=True, msg="probe failed")
    assert sweep.failure_message(run(rescued, verdict, ignored)) == ("DEPLOY FAILED on lab1: ddtree-b15 (release x) "
                                                                     "at step 'health': no answer. Rolled back")
    assert sweep.failure_message(run(event("runner_on_failed", msg="GATE FAILED on lab1 for x: throughput FAIL"),
                                     rescued)) == "GATE FAILED on lab1 for x: throughput FAIL"
    assert sweep.failure_message(run(rescued, ignored)) == "health: no answer in 60 s"
    loop = event("runner_on_failed", msg="One or more items failed",
                 results=[{"failed": False}, {"failed": True, "stderr": "port 30000 in use"}])
    assert sweep.failure_message(run(loop)) == "port 30000 in use"
    assert sweep.failure_message(run(event("runner_on_unreachable", host="lab1", msg="ssh: timed out"))) == (
        "lab1: unreachable: ssh: timed out")
    # No task ran: Ansible's own error line (2.19 prints [ERROR]:, older ERROR!).
    assert sweep.failure_message(run(stdout="[WARNING]: x\n[ERROR]: the playbook: p.yml could not be found\n"
                                            "Origin: <cli>\n")) == "[ERROR]: the playbook: p.yml could not be found"
    assert sweep.failure_message(run(stdout="")) == "no output (ansible-runner: failed, exit 2)"


# --------------------------------------------------------------------------------------------------
# Signals: runner neither takes them nor leaves Ansible running


def test_a_signal_while_reading_the_host_cancels_that_read_and_deploys_nothing(tmp_path, monkeypatch, capsys):
    """SIGTERM while the status module runs (read-only): runner's cancel callback says stop, the sweep
    ends as interrupted (130) without a deploy, and its own handlers are gone again."""
    real = sweep.Sweep.running_before
    fake = Fake()
    fake.install(monkeypatch)
    monkeypatch.setattr(sweep.Sweep, "running_before", real)  # through the stand-in runner below

    def respond(kw):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while "Ansible runs"
        assert kw["cancel_callback"]() is True, "runner was not told to cancel the read"
        return "canceled", 254, [], ""

    fake_runner(monkeypatch, respond)
    monkeypatch.setattr(sweep, "BUILD_DIR", tmp_path / "build")
    handler_before = signal.getsignal(signal.SIGTERM)
    args = sweep.build_parser().parse_args(["--config", "ddtree-b15", "--budgets", "8", "--inventory",
                                            str(inventory(tmp_path)), "--out", str(tmp_path / "r")])
    s = sweep.prepare(args)
    code, results = s.run()
    assert code == 130 and results["interrupted"] is True and fake.calls == []
    assert results["restore"]["action"] == "none"
    assert signal.getsignal(signal.SIGTERM) == handler_before
    assert not s.runner_dir.exists()


PLAYBOOK = """\
- name: A stand-in deploy that signals the sweep halfway through
  hosts: gpu_hosts
  gather_facts: false
  tasks:
    - name: Signal the sweep, then go on as a deploy does
      ansible.builtin.shell: >-
        kill -{{ sweep_signal }} {{ sweep_pid }}; sleep 2; echo {{ config | basename }} >> {{ marker }}
      changed_when: true
"""


def test_ctrl_c_during_a_real_runner_deploy_lets_it_finish_then_restores(tmp_path, monkeypatch, capsys):
    """A real ansible-runner run of a local playbook that sends SIGINT to the sweep while it runs: the deploy
    finishes (runner neither takes the signal nor passes it to Ansible), the next variant is not deployed, the
    host is restored (nothing ran before: the variants are stopped), the sweep exits 130 with its own handlers
    gone, and runner's private folder under build/ is removed. (One playbook run: the restore's deploy is the
    same code, tested with stand-ins above.)"""
    real = sweep.Sweep.deploy
    fake = Fake(before=())
    fake.install(monkeypatch)
    monkeypatch.setattr(sweep.Sweep, "deploy", real)  # the real deploy, through ansible-runner
    playbook = tmp_path / "deploy.yml"
    playbook.write_text(PLAYBOOK)
    monkeypatch.setattr(sweep, "PLAYBOOK", playbook)
    monkeypatch.setattr(sweep, "BUILD_DIR", tmp_path / "build")
    inv = tmp_path / "local.yml"
    inv.write_text(yaml.safe_dump({"all": {"children": {"gpu_hosts": {"hosts": {"gpu-local": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable, "gpu_count": 8}}}}}}))
    marker = tmp_path / "marker"
    handler_before = signal.getsignal(signal.SIGINT)
    args = sweep.build_parser().parse_args([
        "--config", "ddtree-b15-nofork", "--budgets", "8 15", "--inventory", str(inv), "--out", str(tmp_path / "r"),
        "-e", json.dumps({"sweep_pid": os.getpid(), "sweep_signal": "INT", "marker": str(marker)})])
    s = sweep.prepare(args)
    code, results = s.run()
    out = capsys.readouterr().out
    assert code == 130, out
    # The first variant's deploy ran to its end after the signal; the second never started.
    assert marker.read_text() == "ddtree-b15-nofork-b8-k8.yml\n"
    assert "SIGINT: letting the step in progress finish, then the sweep stops and restores the host" in out
    assert results["interrupted"] is True and results["restore"]["ok"] is True
    assert fake.calls == [("cleanup", True)]
    assert signal.getsignal(signal.SIGINT) == handler_before
    assert not s.runner_dir.exists() and s.runner_dir.parent.is_dir()
    log = (s.report_dir / "logs" / "ddtree-b15-nofork-b8-k8.log").read_text()
    assert log.startswith("$ ansible-playbook ") and "Signal the sweep, then go on as a deploy does" in log
