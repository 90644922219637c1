"""Issue 33 item 5: the stdout callback sgdeploy.host.summary (ansible.cfg): waits print what they wait
for and how long so far (never FAILED - RETRYING), skipped tasks are hidden unless asked, a failure is
one line and a rescued one does not repeat its reason, and a SUMMARY table closes the output."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent

PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: A task that is skipped
      ansible.builtin.debug: {msg: never}
      when: false
    - name: Wait for the thing to be ready
      ansible.builtin.shell: "echo x >> {{ counter }}; test $(wc -l < {{ counter }}) -ge 3"
      register: waited
      until: waited.rc == 0
      retries: 5
      delay: 0
      changed_when: false
    - name: Deploy under a block
      block:
        - name: A step that fails and is handled
          ansible.builtin.fail: {msg: the rescued reason xyzzy}
      rescue:
        - name: Keep the outcome
          ansible.builtin.set_fact:
            sglang_deploy__summary:
              before: [ddtree-b15]
              after: ddtree-b32
              outcome: rolled_back
              gates:
                - {gate: smoke, verdict: pass, value: 1.0, metric: answered}
                - {gate: throughput, verdict: pass, value: 687.414, metric: tokens_per_s}
                - {gate: acceptance, verdict: fail, value: 3.5, metric: accept_length}
              downtime_s: 4.25
              record: reports/deploys/localhost/20261203T101010Z.json
        - name: Fail the run
          ansible.builtin.fail: {msg: "DEPLOY FAILED on localhost: the final reason"}
"""


def run(tmp_path, **env_extra) -> str:
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_COLLECTIONS_PATH=str(REPO / "collections"), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"),
               **env_extra)
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", str(play),
                           "-e", f"counter={tmp_path / 'counter'}",
                           "-e", f"ansible_python_interpreter={sys.executable}"], cwd=REPO, env=env,
                          text=True, capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return run(tmp_path_factory.mktemp("cb"))


def test_waits_say_what_they_wait_for_and_never_failed_retrying(out):
    assert "FAILED - RETRYING" not in out
    assert re.search(r"^WAITING on localhost: Wait for the thing to be ready \([0-9]+ s so far\)$", out, re.M), out


def test_skipped_tasks_are_hidden_unless_asked(out, tmp_path):
    assert "A task that is skipped" not in out and "skipping:" not in out
    shown = run(tmp_path, ANSIBLE_DISPLAY_SKIPPED_HOSTS="true")
    assert "skipping: [localhost]" in shown


def test_a_failure_is_printed_once_with_its_reason(out):
    assert "xyzzy" not in out  # the rescue handles it: only "failed; handling it"
    assert "localhost: A step that fails and is handled failed; handling it" in out
    assert out.count("the final reason") == 2  # the FAILED line, then once under FAILURES
    fatal = [line for line in out.splitlines() if line.startswith("fatal: ")]
    assert fatal == ['fatal: [localhost]: FAILED! => {"msg": "DEPLOY FAILED on localhost: the final reason"}'], out
    assert "Traceback" not in out


def test_a_summary_table_closes_the_output(out):
    tail = out[out.index("PLAY RECAP"):]
    assert "SUMMARY" in tail
    lines = tail[tail.index("SUMMARY"):].splitlines()
    header = next(line for line in lines if line.strip().startswith("host"))
    assert header.split() == ["host", "config", "before", "->", "after", "outcome", "gates", "downtime", "record"]
    row = next(line for line in lines if line.strip().startswith("localhost "))
    assert "ddtree-b15 -> ddtree-b32" in row and "rolled_back" in row
    assert "smoke PASS; throughput PASS 687.41 tok/s; acceptance FAIL 3.5" in row
    assert "4.25 s" in row and row.rstrip().endswith("reports/deploys/localhost/20261203T101010Z.json")
    assert lines[-1].strip() == "localhost: DEPLOY FAILED on localhost: the final reason"


def test_the_reason_of_a_loop_is_its_failed_items():
    sys.path.insert(0, str(REPO / "collections"))
    from ansible_collections.sgdeploy.host.plugins.callback.summary import reason_of

    data = {"msg": "One or more items failed", "results": [{"failed": False}, {"failed": True, "msg": "port  busy",
                                                                                  "detail": "pid 7"}]}
    assert reason_of(data) == "port busy: pid 7"
    assert reason_of({"stderr": "boom\n"}) == "boom"
