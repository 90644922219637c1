"""Issue 34, "Found": the rows no other lab test covered, as a user sees them (docs/hostile-review.md maps
every row to its lab test).

One host (lab1), ports 31800-31899 only, one deploy shared by the cases that need something serving:

- config inputs the engine's isolation depends on (`--tp=4`, CUDA_VISIBLE_DEVICES, PYTHONPATH,
  HF_HUB_OFFLINE in serving.env) and an engine on a non-loopback address without an API key: refused by
  `make validate` and `make deploy` with exit 2 and one line, the host untouched (test_bad_input.py has
  `--tp 4`, LD_PRELOAD, --api-key, router-<port> and the 250-character name);
- a stray process on the router's port: the replica rollout is refused before replica 0 changes, naming
  the port and its holder (it used to commit both replicas and leave the router failed);
- a unit edited by hand: `make status` names it (the deploy's plan and `make verify` do:
  test_drift.py); the one deploy of this file (lab-found-single: port 31820, GPU 2).

Simulated engine: proves plumbing, not behaviour.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_bad_input import host_unchanged, refused  # noqa: F401 (host_unchanged: a fixture)
from test_cli import make
from test_deploy import RESET, deploy, output_of

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
LAB_CONFIGS = REPO / "tests" / "lab" / "configs"
HOST = "lab1"
CONFIG = "lab-found-x2"
CONFIG_FILE = str(LAB_CONFIGS / f"{CONFIG}.yml")
ROUTER_PORT = 31810  # replicas on 31811 and 31813 (NCCL 31812, 31814), the router's metrics on 31809
ROUTER_UNIT = f"sglang-router-{ROUTER_PORT}.service"
SINGLE = "lab-found-single"  # port 31820, NCCL 31821, GPU 2
SINGLE_FILE = str(LAB_CONFIGS / f"{SINGLE}.yml")
UNIT = f"/etc/systemd/system/sglang-{SINGLE}.service"


@pytest.fixture(scope="module", autouse=True)
def fresh_host(lab):
    """Start and end with lab1 serving nothing (the other files' services do not hold this file's ports)."""
    lab.ssh(HOST, RESET)
    yield
    lab.ssh(HOST, RESET)


# --- Access: what a config may set (no deploy) ----------------------------------------------------------

@pytest.mark.parametrize("stem,text,fragment", [
    ("tp-equals", "extends: ddtree-b15\nserving: {extra_args: ['--tp=4']}\n",
     "serving.extra_args[0]: '--tp=4': --tp (SGLang reads it as --tp-size) is set from the config's own fields"),
    ("cuda-visible-devices", "extends: ddtree-b15\nserving: {env: {CUDA_VISIBLE_DEVICES: '0,1,2,3,4,5,6,7'}}\n",
     "serving.env.CUDA_VISIBLE_DEVICES: '0,1,2,3,4,5,6,7': CUDA_VISIBLE_DEVICES may not be set in serving.env: "
     "set from serving.gpus"),
    ("pythonpath", "extends: ddtree-b15\nserving: {env: {PYTHONPATH: /tmp/evil}}\n",
     "serving.env.PYTHONPATH: '/tmp/evil': PYTHONPATH may not be set in serving.env"),
    ("hf-hub-offline", "extends: ddtree-b15\nserving: {env: {HF_HUB_OFFLINE: '0'}}\n",
     "serving.env.HF_HUB_OFFLINE: '0': HF_HUB_OFFLINE may not be set in serving.env"),
    ("open-without-key", "extends: ddtree-b15\nserving: {host: 0.0.0.0}\n",
     "serving.api_key_secret: missing: required with serving.host 0.0.0.0 (not loopback)"),
], ids=["tp-equals", "cuda-visible-devices", "pythonpath", "hf-hub-offline", "open-without-key"])
def test_what_the_engine_runs_with_is_the_configs_own_fields(lab, host_unchanged, tmp_path, stem, text,  # noqa: F811
                                                             fragment):
    """Before: `--tp=4` passed validation (the engine ran at TP 4 on one GPU's isolation); serving.env set
    CUDA_VISIBLE_DEVICES (the engine saw all eight GPUs), PYTHONPATH, HF_HUB_OFFLINE=0; an engine on every
    address answered without credentials."""
    config = tmp_path / f"{stem}.yml"
    config.write_text(text)
    for target in ("validate", "deploy"):
        line = refused(lab, target, str(config))
        assert line.startswith(f"{config}: ") and fragment in line, line


# --- Replica changes: the router's port -----------------------------------------------------------------

def _units(lab) -> str:
    return lab.ssh(HOST, "ls /etc/systemd/system/ | grep '^sglang-' ; ls /etc/sglang/ 2>/dev/null; "
                         "ls /var/lib/sglang-deploy 2>/dev/null; true").stdout


def test_a_stray_process_on_the_routers_port_refuses_the_rollout_before_any_change(lab):
    """Before: both replicas were switched and committed, then the router could not bind its port and
    crash-looped to `failed`; the next deploy failed on systemd's start limit."""
    addr = lab.address(HOST)
    before = _units(lab)
    lab.ssh(HOST, f"setsid sh -c 'python3 -m http.server {ROUTER_PORT} --bind {addr} >/dev/null 2>&1 </dev/null & "
                  f"echo $! > /tmp/stray{ROUTER_PORT}.pid'")
    try:
        for _ in range(20):
            if lab.ssh(HOST, f"ss -ltnH 'src {addr} and sport = :{ROUTER_PORT}'", check=False).stdout.strip():
                break
            time.sleep(0.5)
        proc = deploy(lab, CONFIG_FILE)
        out = output_of(proc)
        assert proc.returncode != 0, out[-3000:]
        assert (f"ROLLOUT REFUSED on {HOST} before any change: config {CONFIG}: port {addr}:{ROUTER_PORT} "
                "(the router's port) is already in use by python3 (pid") in out, out[-3000:]
        assert "Traceback" not in out
        # Nothing of the config or its router was installed or started; no lock is left.
        assert _units(lab) == before
        assert lab.ssh(HOST, "test -e /run/sglang-deploy.lock", check=False).returncode != 0
        assert lab.ssh(HOST, f"systemctl is-active {ROUTER_UNIT}", check=False).stdout.strip() != "active"
    finally:
        lab.ssh(HOST, f"kill $(cat /tmp/stray{ROUTER_PORT}.pid) && rm -f /tmp/stray{ROUTER_PORT}.pid", check=False)


# --- Drift: seen by make status (one deploy, shared) ----------------------------------------------------

@pytest.fixture(scope="module")
def deployed(lab):
    """One config (no replicas) serving on lab1: a unit to edit by hand."""
    proc = deploy(lab, SINGLE_FILE)
    out = output_of(proc)
    assert proc.returncode == 0, out[-4000:]
    assert f"DEPLOYED on {HOST}: {SINGLE}" in out, out[-3000:]


def test_make_status_names_a_unit_edited_by_hand(lab, deployed):
    """Before: a unit edited by hand (NoNewPrivileges=no, ProtectSystem=no) was silent in status and verify,
    and the next deploy said unchanged. The deploy and verify now name it (test_drift.py); this is status, which
    stayed silent until the audit found it (docs/hostile-review.md)."""
    lab.ssh(HOST, f"cp -a {UNIT} /root/found-unit.bak && sed -i -e 's/^NoNewPrivileges=yes/NoNewPrivileges=no/' "
                  f"-e 's/^ProtectSystem=.*/ProtectSystem=no/' {UNIT} && systemctl daemon-reload")
    try:
        proc = make(lab, "status", f"INVENTORY={lab.inventory}", f"LIMIT={HOST}")
    finally:
        lab.ssh(HOST, f"cp -a /root/found-unit.bak {UNIT} && rm /root/found-unit.bak && systemctl daemon-reload")
    out = proc.stdout + proc.stderr
    assert UNIT in out and "edited by hand" in out, out[-3000:]
