"""The exactness gate end to end in the lab (issues 22 and 33). With no reference on the host, the README's
deploy (`make deploy CONFIG=ddtree-b15`) is decided by the check against the target's own prefill on the
same server, and budget 64 without forking, acceptance forced up, is caught by its tokens alone and rolled
back; then an autoregressive deploy records its model's reference, against which a forking DDTree deploy
passes and the leak fails again. Real ansible-playbook over SSH, the simulated engine in the rendered units.
Order matters: the tests build on each other's state."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from test_deploy import LAB_CONFIGS, REPO, RESET, active_unit, deploy, deployed_line, newest_record, output_of

pytestmark = pytest.mark.lab

KEY = "Qwen--Qwen3.6-27B@main"  # the target model of every Qwen3.6-27B config: repository @ revision
REFERENCE = f"/var/lib/sglang-deploy/references/{KEY}.json"
LEAK = str(LAB_CONFIGS / "lab-b64-nofork-accept-forced.yml")


@pytest.fixture(scope="module", autouse=True)
def fresh_hosts(lab):
    for host in lab.hosts:
        lab.ssh(host, RESET)
    yield


def gates(record: dict) -> dict[str, str]:
    return {g["gate"]: g["verdict"] for g in record["gates"]}


def make_deploy(lab, config: str):
    """The README's deploy command, against this lab's inventory and its first host."""
    return subprocess.run(["make", "deploy", f"CONFIG={config}", f"INVENTORY={lab.inventory}", "LIMIT=lab1"],
                          cwd=REPO, env=lab.ansible_env(), capture_output=True, text=True, timeout=900, check=False)


def gate_lines(out: str) -> list[str]:
    """The gate summary lines a deploy printed (the debug task's list, one quoted string per line)."""
    return [m.group(1) for m in re.finditer(r'^\s*"((?:smoke|exactness|throughput|acceptance) .*|gates .*)",?$',
                                            out, re.MULTILINE)]


def test_without_a_reference_the_readme_deploy_is_decided_on_the_targets_own_prefill(lab):
    proc = make_deploy(lab, "ddtree-b15")
    out = output_of(proc)
    assert proc.returncode == 0, out[-4000:]
    lines = gate_lines(proc.stdout)
    exact = [ln for ln in lines if ln.startswith("exactness ")]
    assert exact and re.match(r"exactness +PASS +[0-9]+ of 1024 tokens ", exact[0]), lines
    assert "are the target's top-1 under its own prefill on this server" in exact[0]
    assert "(self-check: no reference outputs for Qwen/Qwen3.6-27B@main on this host yet" in exact[0]
    assert lines[-1] == "gates passed", lines
    assert "INCONCLUSIVE" not in out and "does not block" not in out
    assert "; exactness PASS " in deployed_line(proc.stdout)
    record = newest_record(lab, "lab1", "ddtree-b15")
    assert record["outcome"] == "deployed", record
    assert record["message"].endswith("; gates passed; watch did not run: watch.enabled is false"), record["message"]
    e = record["exactness"]
    assert e["verdict"] == "pass" and e["details"]["method"] == "self-check"
    assert e["details"]["tokens"] == 16 * 64 and e["details"]["outside"] == 0
    # Each prefill was computed, not served from what the decode left in the prefix cache.
    assert [p["prefill_cached_tokens"] for p in e["details"]["per_prompt"]] == [0] * 16
    assert lab.ssh("lab1", f"test -e {REFERENCE}", check=False).returncode != 0  # decided without one


def test_without_a_reference_a_leak_with_forced_acceptance_is_rolled_back_on_exactness(lab):
    proc = deploy(lab, LEAK)
    out = output_of(proc)
    assert proc.returncode != 0
    assert "GATE FAILED" in out and "Rolled back to sglang-ddtree-b15.service" in out, out[-4000:]
    exact = [ln for ln in gate_lines(proc.stdout) if ln.startswith("exactness ")]
    assert exact and re.match(r"exactness +FAIL +prompt x01-capital token ", exact[0]), exact
    assert "gates failed: exactness" in gate_lines(proc.stdout)
    assert active_unit(lab, "lab1", "sglang-ddtree-b15.service") == "active"
    record = newest_record(lab, "lab1", "lab-b64-nofork-accept-forced")
    assert record["outcome"] == "rolled_back"
    assert gates(record) == {"smoke": "pass", "throughput": "pass", "acceptance": "pass"}  # speed looks fine
    e = record["exactness"]
    assert e["verdict"] == "fail" and e["details"]["method"] == "self-check"
    assert "but the target's top-1 after the same prefix is" in e["reason"]
    assert "not within the near-tie tolerance 0.1" in e["reason"]
    assert "(self-check: no reference outputs for Qwen/Qwen3.6-27B@main on this host yet" in e["reason"]


def test_an_autoregressive_deploy_records_the_reference(lab):
    proc = deploy(lab, "ar")
    assert proc.returncode == 0, output_of(proc)[-4000:]
    record = newest_record(lab, "lab1", "ar")
    assert record["outcome"] == "deployed" and record["exactness"]["verdict"] == "pass"
    assert f"recorded the reference for Qwen/Qwen3.6-27B@main (16 prompts x 64 tokens) in {REFERENCE}" \
        in record["exactness"]["reason"]
    ref = json.loads(lab.ssh("lab1", f"cat {REFERENCE}").stdout)
    assert ref["config"] == "ar" and len(ref["outputs"]) == 16
    assert all(len(o["tokens"]) == 64 and len(o["top"]) == 64 for o in ref["outputs"])
    fetched = REPO / "reports" / "references" / "lab1" / f"{KEY}.json"
    assert json.loads(fetched.read_text())["created"] == ref["created"]


def test_a_forking_ddtree_deploy_passes_the_exactness_gate(lab):
    proc = deploy(lab, "ddtree-b15")
    assert proc.returncode == 0, output_of(proc)[-4000:]
    record = newest_record(lab, "lab1", "ddtree-b15")
    assert record["outcome"] == "deployed" and set(gates(record).values()) == {"pass"}
    assert record["exactness"]["verdict"] == "pass", record["exactness"]["reason"]
    assert "of 16 prompts equal the reference" in record["exactness"]["reason"]
    assert record["exactness"]["details"]["method"] == "reference"


def test_a_state_leak_with_forced_acceptance_fails_exactness_and_rolls_back(lab):
    proc = deploy(lab, LEAK)
    out = output_of(proc)
    assert proc.returncode != 0
    assert "GATE FAILED" in out and "exactness" in out and "Rolled back to sglang-ddtree-b15.service" in out, \
        out[-4000:]
    assert active_unit(lab, "lab1", "sglang-ddtree-b15.service") == "active"
    record = newest_record(lab, "lab1", "lab-b64-nofork-accept-forced")
    assert record["outcome"] == "rolled_back"
    assert gates(record) == {"smoke": "pass", "throughput": "pass", "acceptance": "pass"}  # speed looks fine
    e = record["exactness"]
    assert e["verdict"] == "fail" and e["reason"].startswith("prompt x01-capital first differs at token ")
    assert "not below the near-tie tolerance 0.1" in e["reason"]

    status = lab.ansible_playbook("playbooks/status.yml", check=False)
    assert status.returncode == 0, output_of(status)[-3000:]
    lines = [ln for ln in status.stdout.splitlines() if "lab-b64-nofork-accept-forced" in ln and "rolled_back" in ln]
    assert lines and " fail " in lines[0], status.stdout[-3000:]
    assert any("exactness" in ln and "outcome" in ln for ln in status.stdout.splitlines())


def test_make_reference_records_one_on_demand(lab):
    lab.ssh("lab1", "rm -rf /var/lib/sglang-deploy/references")
    proc = subprocess.run(["make", "reference", "CONFIG=ddtree-b15", "HOST=lab1", f"INVENTORY={lab.inventory}"],
                          cwd=REPO, env=lab.ansible_env(), capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    ref = json.loads(lab.ssh("lab1", f"cat {REFERENCE}").stdout)
    assert ref["config"] == "reference-ddtree-b15"
    assert active_unit(lab, "lab1", "sglang-ddtree-b15.service") == "active"
    assert active_unit(lab, "lab1", "sglang-reference-ddtree-b15.service") != "active"
    assert newest_record(lab, "lab1", "ddtree-b15")["exactness"]["verdict"] == "pass"
