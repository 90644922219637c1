"""Budget sweep end to end in the lab (issues 10 and 33): real deploys over SSH, the deploy's gates run on
every variant with the bench through a tunnel, the report on disk, and the config that ran before running
again afterwards.

Two sweeps on lab1: without state forking over budgets 8, 15, 16, 32 (16 and 32 leak: no forking above
block_size - 1; neither may be recommended); with it over 15, 32, 64 (budget 8 tells nothing more there
and a variant costs a deploy). Each variant is deployed by the deploy playbook (35-60 s each here,
depending on the load), then gated and benchmarked with 4 (8 with forking) requests of 512 tokens (long
enough that budget 32's extra accepted tokens show up as fewer verify steps; at 96 tokens budgets 15 to
64 all need 7). 8-9 minutes in all on a busy 2-core machine.

The second sweep connects as a non-root user with privilege escalation (``lab.add_deployer``: ``deployer``
with passwordless sudo, ``ansible_become: true``, the shape of inventory/example.yml) and so proves that the
sweep's host changes (its deploys, the tunnel, the cleanup that disables the variant units and forgets their
current.json in the root-owned state folder) go through Ansible with become (issue 35).

The engine is the simulator (tests/sim): its numbers prove the plumbing (deploys, gates, report,
restore), not how SGLang behaves.
"""

from __future__ import annotations

import json
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import lab as labmod
import pytest

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
BEFORE = "ddtree-b15"
# Extra ansible-playbook arguments for the sweep's deploys (none: they run as a user's would).
EXTRA: list[str] = []


def is_active(lab, unit: str) -> str:
    return lab.ssh("lab1", f"systemctl is-active {unit}", check=False).stdout.strip()


def is_enabled(lab, unit: str) -> str:
    return lab.ssh("lab1", f"systemctl is-enabled {unit}", check=False).stdout.strip()


@pytest.fixture
def before_running(lab):
    """ddtree-b15 runs on lab1 before each sweep (deployed when it does not)."""
    if is_active(lab, f"sglang-{BEFORE}.service") != "active":
        lab.ansible_playbook("playbooks/deploy.yml", "--limit", "lab1", *EXTRA, extra_vars={"config": BEFORE})
    assert is_active(lab, f"sglang-{BEFORE}.service") == "active"
    return lab


@pytest.fixture
def deployer_inventory(lab) -> Path:
    """The lab's inventory as the non-root ``deployer`` with ``ansible_become: true`` (lab.add_deployer)."""
    return labmod.add_deployer(lab.config)


def run_sweep(lab, tmp_path, config: str, budgets: str, *options: str, requests: int = 4,
              inventory: Path | None = None) -> tuple[subprocess.CompletedProcess, dict, float]:
    cmd = [sys.executable, "-m", "sgdeploy.sweep", "--config", config, "--budgets", budgets,
           "--inventory", str(inventory or lab.inventory), "--host", "lab1", "--out", str(tmp_path),
           "--requests", str(requests),
           "--max-tokens", "512", "--json", *options, *EXTRA]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=lab.ansible_env(), text=True, capture_output=True, timeout=900,
                          stdin=subprocess.DEVNULL)
    seconds = time.monotonic() - start
    print(f"\n{config} sweep: {seconds:.0f} s\n{proc.stderr[-3000:]}")
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-4000:]}"
    return proc, json.loads(proc.stdout), seconds


def check_report(tmp_path: Path, results: dict, config: str, budgets: list[int], requests: int = 4) -> None:
    (folder,) = tmp_path.iterdir()
    assert folder.name.startswith(f"{config}-") and folder.name.endswith("Z")
    on_disk = json.loads((folder / "results.json").read_text())
    assert on_disk == results
    assert {"schema", "config", "host", "started", "finished", "variants", "cliff", "best", "fastest",
            "recommendation", "warning", "restored", "tie_tolerance"} <= set(on_disk)
    assert on_disk["schema"] == 1 and on_disk["config"] == config and on_disk["host"] == "lab1"
    keys = {"budget", "topk_cap", "accept_length_mean", "accept_length_sd", "tokens_per_s", "step_time_ms",
            "requests", "failures", "status", "error"}
    assert [v["budget"] for v in on_disk["variants"]] == budgets
    for v in on_disk["variants"]:
        assert keys <= set(v) and v["status"] == "ok" and v["topk_cap"] == 8, v
        assert v["requests"] == requests and v["failures"] == 0, v
    md = (folder / "results.md").read_text()
    assert f"# Sweep of {config} on lab1" in md and "**Recommendation**:" in md
    # Every variant ran the deploy's four gates; the table shows each verdict and whether it leaks.
    assert "| leaks | smoke | exactness | throughput | acceptance | status |" in md
    for v in on_disk["variants"]:
        assert set(v["gates"]) == {"smoke", "exactness", "throughput", "acceptance"}, v
        assert {g["verdict"] for g in v["gates"].values()} <= {"pass", "fail", "inconclusive"}, v["gates"]
        assert v["gates"]["smoke"]["verdict"] == "pass", v["gates"]  # its deploy passed the smoke gate
        assert isinstance(v["leaks"], bool) and isinstance(v["gates_failed"], list), v
    for key in ("best", "fastest"):
        if on_disk[key]:
            assert on_disk[key]["leaks"] is False and on_disk[key]["gates_failed"] == [], on_disk[key]
    # The lab's engine is the simulator: the report says its numbers prove the plumbing only.
    assert on_disk["simulated"] is True and "**Simulated**:" in md
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir() if p.is_file()}
    assert set(modes.values()) == {0o644}, modes
    png = (folder / "sweep.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    width, height = struct.unpack(">II", png[16:24])
    assert width >= 400 and height >= 300


def check_restored(lab, results: dict) -> None:
    assert results["restored"] == BEFORE
    assert is_active(lab, f"sglang-{BEFORE}.service") == "active"
    # What runs, as the deploy's status module reads it (nothing of sgdeploy is on the host).
    active = lab.ssh("lab1", "for f in /var/lib/sglang-deploy/*/current.json; do c=$(basename $(dirname $f)); "
                             "systemctl is-active --quiet sglang-$c.service && echo $c; done").stdout.split()
    assert active == [BEFORE]
    # The restore went through the normal gates, not the sweep's smoke-only mode.
    newest = lab.ssh("lab1", f"ls -1t /var/lib/sglang-deploy/{BEFORE}/records/*.json | head -1").stdout.strip()
    record = json.loads(lab.ssh("lab1", f"cat {newest}").stdout)
    assert record["outcome"] == "deployed"
    assert {g["gate"]: g["verdict"] for g in record["gates"]} == {"smoke": "pass", "throughput": "pass",
                                                                  "acceptance": "pass"}
    for v in results["variants"]:
        unit = f"sglang-{v['config']}.service"
        assert is_active(lab, unit) != "active" and is_enabled(lab, unit) != "enabled", unit


def test_sweep_without_state_forking_never_recommends_a_leaking_budget(before_running, tmp_path):
    lab = before_running
    proc, results, _ = run_sweep(lab, tmp_path, "ddtree-b15-nofork", "8 15 16 32")
    rows = {v["budget"]: v for v in results["variants"]}
    assert results["cliff"]["budget"] == 32 and results["cliff"]["topk_cap"] == 8
    assert results["cliff"]["drop_pct"] > 25
    assert rows[32]["accept_length_mean"] < 0.75 * rows[15]["accept_length_mean"]
    # The variants above block_size - 1 ran with the state leak on purpose, the others without; the leaking
    # ones are marked and never recommended nor fastest, whatever their tokens/s (16 is about as fast as 15).
    assert [v["reproduce_state_leak"] for v in results["variants"]] == [False, False, True, True]
    assert [v["leaks"] for v in results["variants"]] == [False, False, True, True]
    for b in (16, 32):
        assert rows[b]["not_recommended"][0] == "leaks: no state forking above block_size - 1", rows[b]
        assert f"budget {b} cap 8 (leaks: no state forking above block_size - 1" in results["recommendation"]
    assert results["best"]["budget"] == 15, (results["recommendation"], rows[15]["gates"])
    assert results["fastest"]["budget"] in (8, 15)
    assert "recommended: budget 15 cap 8" in results["recommendation"]
    md = (next(tmp_path.iterdir()) / "results.md").read_text()
    assert [line.split(" | ")[8] for line in md.splitlines() if line.startswith("| 16 | 8 |")] == ["yes"]
    assert "[4/4] budget 32 cap 8: accept" in proc.stderr and "; gates: smoke pass, exactness " in proc.stderr
    assert "LEAKS (no state forking above block_size - 1)" in proc.stderr
    assert "note: the host runs the lab's simulated engine (tests/sim)" in proc.stderr
    check_report(tmp_path, results, "ddtree-b15-nofork", [8, 15, 16, 32])
    check_restored(lab, results)


def test_sweep_with_state_forking_finds_no_cliff_and_recommends_the_largest_budget(before_running, tmp_path,
                                                                                   deployer_inventory):
    lab = before_running
    sudo_log = labmod.DEPLOYER_SUDO_LOG
    lab.ssh("lab1", f"rm -f {sudo_log}")
    # As deployer with become (the sweep's deploys, its tunnel and its cleanup); the checks below run as root.
    # 8 requests and a 5% tie band: this lab shares two cores with another lab running deploys, and a
    # variant's bench lasts a few seconds, so load changes between variants move tokens/s by a few
    # percent (the default band, 3%, is for a GPU host; tests/unit/tool/test_report.py checks it exactly).
    proc, results, _ = run_sweep(lab, tmp_path, "ddtree-b15", "15 32 64", "--tie-tolerance", "0.05", requests=8,
                                 inventory=deployer_inventory)
    rows = {v["budget"]: v for v in results["variants"]}
    assert results["cliff"] is None and results["warning"] is None
    assert results["recommendation"].startswith("no acceptance cliff up to budget 64")
    # Forking keeps the acceptance past block_size - 1: 32 and 64 accept at least what 15 does.
    assert rows[32]["accept_length_mean"] >= 0.97 * rows[15]["accept_length_mean"]
    assert rows[64]["accept_length_mean"] >= 0.97 * rows[15]["accept_length_mean"]
    # In the simulator 32 and 64 are within 1% in tokens/s (acceptance plateaus below the block size):
    # a tie, so the largest budget tested is recommended, naming the tie when the fastest measured was
    # another budget.
    assert results["tie_tolerance"] == 0.05
    assert rows[64]["tokens_per_s"] >= 0.95 * results["fastest"]["tokens_per_s"], results["fastest"]
    assert results["best"]["budget"] == 64
    assert "recommended: budget 64 cap 8" in results["recommendation"]
    if results["fastest"]["budget"] != 64:
        assert f"budget {results['fastest']['budget']} cap 8 at" in results["recommendation"]
    assert "[3/3] budget 64 cap 8: accept" in proc.stderr
    assert [v["leaks"] for v in results["variants"]] == [False, False, False]
    check_report(tmp_path, results, "ddtree-b15", [15, 32, 64], requests=8)
    check_restored(lab, results)
    # The cleanup (exit 0 needs it: it fails on any step) forgot every variant's current.json in the root-owned
    # state folder, which deployer cannot write without become; and deployer did escalate, through sudo.
    for v in results["variants"]:
        current = f"/var/lib/sglang-deploy/{v['config']}/current.json"
        assert lab.ssh("lab1", f"test -e {current}", check=False).returncode == 1, current
    assert lab.ssh("lab1", "stat -c %U /var/lib/sglang-deploy").stdout.strip() == "root"
    escalations = lab.ssh("lab1", f"cat {sudo_log}").stdout
    assert "deployer : " in escalations and "USER=root" in escalations
