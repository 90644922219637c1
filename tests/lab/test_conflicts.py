"""Issue 34 item 4 in the lab, "Nothing is replaced silently": a deploy whose port is another config's
NCCL port is refused before any change, naming that config and what collides, unless REPLACES names it
(then it says what it replaced); a manual rollback runs the same conflict plan (a previous deploy whose
GPU another config now uses is refused) and takes a config path as a deploy does (the file's stem is the
name).

Order matters: ddtree-b15 serves on lab1 first; nccl-taker then replaces it by name; conf-a (two
deploys, so that it has a previous one on GPU 2) and conf-b (now on GPU 2) set up the rollback.
"""

from __future__ import annotations

import json

import pytest
from test_deploy import RESET, active_unit, deploy, output_of

pytestmark = pytest.mark.lab


def main_pid(lab, unit: str) -> str:
    return lab.ssh("lab1", f"systemctl show -p MainPID --value {unit}").stdout.strip()


def unit_gpus(lab, config: str) -> str:
    unit = f"/etc/systemd/system/sglang-{config}.service"
    return lab.ssh("lab1", f"sed -n 's/^Environment=CUDA_VISIBLE_DEVICES=//p' {unit}", check=False).stdout.strip()


def write(path, text: str) -> str:
    path.write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    d = tmp_path_factory.mktemp("conflicts")
    return {
        # Its port is ddtree-b15's NCCL port (30001); its own GPU.
        "nccl-taker": write(d / "nccl-taker.yml",
                            "extends: ddtree-b15\nserving: {gpus: [1], port: 30001, nccl_port: 30002}\n"),
        "conf-b": write(d / "conf-b.yml", "extends: ddtree-b15\nserving: {gpus: [2], port: 30200, nccl_port: 30201}\n"),
        "dir": d,
    }


@pytest.fixture(scope="module", autouse=True)
def b15_serves(lab):
    lab.ssh("lab1", RESET)
    proc = deploy(lab, "ddtree-b15")
    assert proc.returncode == 0, output_of(proc)[-4000:]
    yield
    lab.ssh("lab1", RESET)


def test_a_port_on_another_configs_nccl_port_is_refused_naming_it(lab, configs):
    """Before: the deploy stopped and disabled ddtree-b15 without naming it."""
    pid = main_pid(lab, "sglang-ddtree-b15.service")
    plan = deploy(lab, configs["nccl-taker"], "--check", "--diff")
    out = output_of(plan)
    assert plan.returncode != 0, out[-3000:]
    assert ("PLAN on lab1: the deploy would be refused: deploying nccl-taker would stop or displace ddtree-b15 "
            "(active, sglang-ddtree-b15.service: its port 30001 is ddtree-b15's NCCL port); name it to replace it: "
            "REPLACES=ddtree-b15") in out, out[-3000:]
    proc = deploy(lab, configs["nccl-taker"])
    out = output_of(proc)
    assert proc.returncode != 0, out[-3000:]
    assert ("DEPLOY REFUSED on lab1 before any change: deploying nccl-taker would stop or displace ddtree-b15 (active, "
            "sglang-ddtree-b15.service: its port 30001 is ddtree-b15's NCCL port)") in out, out[-3000:]
    assert "Traceback" not in out
    # ddtree-b15 still serves, the same process; nothing of nccl-taker was installed; no lock left.
    assert active_unit(lab, "lab1", "sglang-ddtree-b15.service") == "active"
    assert main_pid(lab, "sglang-ddtree-b15.service") == pid
    assert lab.ssh("lab1", "test -e /etc/systemd/system/sglang-nccl-taker.service", check=False).returncode != 0
    assert lab.ssh("lab1", "test -e /run/sglang-deploy.lock", check=False).returncode != 0


def test_replaces_names_it_and_the_deploy_says_what_it_replaced(lab, configs):
    plan = deploy(lab, configs["nccl-taker"], "--check", "--diff", "-e", "replaces=ddtree-b15")
    out = output_of(plan)
    assert plan.returncode == 0, out[-3000:]
    assert "PLAN on lab1: nccl-taker replaces ddtree-b15 (active, sglang-ddtree-b15.service: its port 30001" in out
    assert "PLAN on lab1: would replace ddtree-b15 with nccl-taker" in out, out[-3000:]
    proc = deploy(lab, configs["nccl-taker"], "-e", "replaces=ddtree-b15")
    out = output_of(proc)
    assert proc.returncode == 0, out[-4000:]
    assert "REPLACING on lab1: nccl-taker replaces ddtree-b15 (active" in out, out[-3000:]
    assert "REPLACED on lab1: nccl-taker replaced ddtree-b15 (named by REPLACES; stopped and disabled)" in out
    assert active_unit(lab, "lab1", "sglang-nccl-taker.service") == "active"
    assert active_unit(lab, "lab1", "sglang-ddtree-b15.service") != "active"


def test_a_bad_replaces_name_is_one_line(lab, configs):
    # As make runs it (LIMIT with localhost: the controller's check, before any host).
    proc = deploy(lab, configs["nccl-taker"], "-e", "replaces=ok,Bad;name", limit="lab1,localhost")
    out = output_of(proc)
    assert proc.returncode != 0
    assert "REPLACES='ok,Bad;name' is not allowed: use config names" in out, out[-3000:]
    assert "Plan the switch" not in out
    # Without the controller's play (--limit lab1): the host's check says it in one line, before any change.
    proc = deploy(lab, configs["nccl-taker"], "-e", "replaces=ok,Bad;name")
    assert proc.returncode != 0
    assert ("DEPLOY REFUSED on lab1 before any change: replaces 'Bad;name' is not allowed: use config names"
            in output_of(proc)), output_of(proc)[-3000:]


def test_rollback_onto_a_gpu_another_config_uses_now_is_refused(lab, configs):
    """Before: the rollback had no conflict plan; both engines ran on CUDA_VISIBLE_DEVICES=2."""
    conf_a = configs["dir"] / "conf-a.yml"
    for gpu in (2, 3):  # two deploys: conf-a's previous one ran on GPU 2, its current one runs on GPU 3
        write(conf_a, f"extends: ddtree-b15\nserving: {{gpus: [{gpu}], port: 30100, nccl_port: 30101}}\n")
        proc = deploy(lab, str(conf_a))
        assert proc.returncode == 0, output_of(proc)[-4000:]
    assert unit_gpus(lab, "conf-a") == "3"
    proc = deploy(lab, configs["conf-b"])  # GPU 2: nothing runs there now
    assert proc.returncode == 0, output_of(proc)[-4000:]
    pids = {u: main_pid(lab, u) for u in ("sglang-conf-a.service", "sglang-conf-b.service")}
    proc = lab.ansible_playbook("playbooks/rollback.yml", "-e", f"config={conf_a}", "--limit", "lab1", check=False)
    out = output_of(proc)
    assert proc.returncode != 0, out[-3000:]
    assert ("ROLLBACK REFUSED on lab1 before any change: rolling back conf-a to its previous deploy (conf-a) would "
            "collide with conf-b (active, sglang-conf-b.service: GPU 2 overlaps (it uses GPUs [2], conf-b uses [2]))"
            ) in out, out[-3000:]
    assert {u: main_pid(lab, u) for u in pids} == pids
    assert unit_gpus(lab, "conf-a") == "3"
    # Named, it is still refused: a rollback stops only the config it rolls back.
    proc = lab.ansible_playbook("playbooks/rollback.yml", "-e", "config=conf-a", "-e", "replaces=conf-b",
                                "--limit", "lab1", check=False)
    assert proc.returncode != 0 and "a rollback stops only conf-a" in output_of(proc), output_of(proc)[-3000:]
    assert {u: main_pid(lab, u) for u in pids} == pids


def test_rollback_of_a_config_path_rolls_back_that_config_by_name(lab, configs):
    """Before: CONFIG=path/to/conf-a.yml was taken as the config's name (no previous deploy recorded)."""
    lab.ssh("lab1", "systemctl disable --now sglang-conf-b.service")  # GPU 2 is free again
    conf_a = str(configs["dir"] / "conf-a.yml")
    proc = lab.ansible_playbook("playbooks/rollback.yml", "-e", f"config={conf_a}", "--limit", "lab1", check=False)
    out = output_of(proc)
    assert proc.returncode == 0, out[-3000:]
    assert "lab1: conf-a rolled back to conf-a" in out, out[-3000:]
    assert active_unit(lab, "lab1", "sglang-conf-a.service") == "active"
    assert unit_gpus(lab, "conf-a") == "2"
    record = json.loads(lab.ssh("lab1", "cat $(ls -1t /var/lib/sglang-deploy/conf-a/records/*.json | head -1)").stdout)
    assert record["outcome"] == "rolled_back" and record["config"] == "conf-a"
    # The state is kept under the name, never under the path.
    assert "conflicts" not in lab.ssh("lab1", "find /var/lib/sglang-deploy -maxdepth 3").stdout
