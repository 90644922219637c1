"""DDTree budget schedule in the lab (issue 38): the sweep's batch dimension derives a schedule, and a scheduled
config deploys with its gates like any other.

1. ``sgdeploy.sweep --batches "1 4"`` over budgets 15 and 32 on lab1 (two variant deploys): each variant is
   benchmarked with 1 and then 4 requests in flight; the report holds the per-bucket table, the schedule and a
   config (``ddtree-b15-sched.yml``) that validates. Nothing ran on lab1 before (a fresh lab, or this file's
   cleanup), so the sweep stops and disables its variants afterwards (no restore deploy).
2. ``configs/ddtree-sched.yml`` (1:64, 4:32, 8:15) deployed by the deploy playbook with the full gates
   (smoke, exactness, throughput, acceptance): the unit carries ``--speculative-ddtree-budget-schedule``, the
   engine's Decode batch lines say the budget of the running batch, and the record says deployed.

The engine is the simulator (tests/sim): its numbers prove the plumbing, not how SGLang behaves; the simulated
step-time model scales every budget's cost alike with the batch, so which budget a bucket gets is its noise.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
SCHED = "ddtree-sched"


def active_configs(lab) -> list[str]:
    return lab.ssh("lab1", "for f in /var/lib/sglang-deploy/*/current.json; do [ -e \"$f\" ] || continue; "
                           "c=$(basename $(dirname $f)); systemctl is-active --quiet sglang-$c.service && echo $c; "
                           "done", check=False).stdout.split()


def test_a_sweep_with_batches_writes_a_schedule_and_its_config(lab, tmp_path):
    for config in active_configs(lab):  # the sweep runs on an empty lab1: no restore deploy afterwards
        lab.ssh("lab1", f"systemctl disable --now sglang-{config}.service && "
                        f"rm -f /var/lib/sglang-deploy/{config}/current.json")
    cmd = [sys.executable, "-m", "sgdeploy.sweep", "--config", "ddtree-b15", "--budgets", "15 32",
           "--batches", "1 4", "--inventory", str(lab.inventory), "--host", "lab1", "--out", str(tmp_path),
           "--requests", "4", "--max-tokens", "256", "--tie-tolerance", "0.05", "--json"]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=lab.ansible_env(), text=True, capture_output=True, timeout=900,
                          stdin=subprocess.DEVNULL)
    print(f"\nsweep with batches: {time.monotonic() - start:.0f} s\n{proc.stderr[-3000:]}")
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-4000:]}"
    results = json.loads(proc.stdout)
    (folder,) = tmp_path.iterdir()
    assert json.loads((folder / "results.json").read_text()) == results
    assert results["batches"] == [1, 4] and results["simulated"] is True
    for v in results["variants"]:
        assert [(c["batch"], c["status"], c["requests"], c["failures"]) for c in v["by_batch"]] == [
            (1, "ok", 2, 0), (4, "ok", 8, 0)], v["by_batch"]
        assert all(c["tokens_per_s"] > 0 and c["accept_length_mean"] > 1 for c in v["by_batch"]), v["by_batch"]
    sched = results["budget_schedule"]
    assert [b["batch"] for b in sched["buckets"]] == [1, 4]
    assert all(b["budget"] in (15, 32) for b in sched["buckets"]), sched["buckets"]
    assert sched["schedule"][0][0] == 1 and sched["config_problems"] == []
    assert "    batch 4: accept " in proc.stderr and f"budget schedule: {sched['flag']} (config: " in proc.stderr
    md = (folder / "results.md").read_text()
    assert "## Budget schedule" in md and "| budget | top-k cap | batch 1 | batch 4 |" in md
    assert f"**Schedule**: `{sched['flag']}`" in md and "**Simulated**:" in md
    written = (folder / "ddtree-b15-sched.yml").read_text()
    assert "SIMULATED engine" in written.splitlines()[0] and "extends: ddtree-b15" in written
    check = subprocess.run([sys.executable, "-m", "sgdeploy", "validate", str(folder / "ddtree-b15-sched.yml")],
                           cwd=REPO, text=True, capture_output=True)
    assert check.returncode == 0, check.stdout + check.stderr
    # Nothing ran before: the variants are stopped and disabled, nothing restored.
    assert results["restored"] is None and active_configs(lab) == []


def test_a_scheduled_config_deploys_with_its_gates(lab):
    lab.ansible_playbook("playbooks/deploy.yml", "--limit", "lab1", extra_vars={"config": SCHED})
    unit = lab.ssh("lab1", f"systemctl cat sglang-{SCHED}.service").stdout
    assert "--speculative-ddtree-budget 64 " in unit
    assert "--speculative-ddtree-budget-schedule 1:64,4:32,8:15" in unit
    newest = lab.ssh("lab1", f"ls -1t /var/lib/sglang-deploy/{SCHED}/records/*.json | head -1").stdout.strip()
    record = json.loads(lab.ssh("lab1", f"cat {newest}").stdout)
    assert record["outcome"] == "deployed", record
    assert {g["gate"]: g["verdict"] for g in record["gates"]} == {"smoke": "pass", "throughput": "pass",
                                                                  "acceptance": "pass"}
    assert record["exactness"]["verdict"] == "pass", record["exactness"]
    journal = lab.ssh("lab1", f"journalctl -u sglang-{SCHED}.service --no-pager -o cat").stdout
    assert "DDTree budget schedule: 64 from 1 running, 32 from 4 running, 15 from 8 running" in journal
    # The gates' bench ran 4 requests at a time: the engine stepped them at budget 32.
    assert any("#running-req: 4," in ln and ln.endswith("ddtree budget: 32") for ln in journal.splitlines()), \
        [ln for ln in journal.splitlines() if "Decode batch" in ln][-10:]
