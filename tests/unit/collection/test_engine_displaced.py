"""A deploy that stops a rank of an engine over several hosts (docs/multinode.md; issue 37 deliver 2) stops it only
when every other host of that engine stops its rank in the same batch: each host's conflict check
(sgdeploy.host.sglang_deploy_conflicts) lists the engines it stops, and the role's task in tasks/lock.yml refuses on
a host whose engine partner did not find the same engine (refused there, or its deploy does not displace it). The
role's own Jinja, rendered as Ansible renders it."""

from __future__ import annotations

from role_tasks import ROLES, flat, load
from role_tasks import render as _render

TASK = "Refuse to stop a rank of an engine over several hosts unless its other hosts stop theirs"
ENGINE = {"config": "two-host", "unit_name": "sglang-two-host.service", "node_rank": 1,
          "engine_hosts": ["lab1", "lab2"]}


def _task() -> dict:
    tasks = [t for t in flat(load(ROLES / "sglang_deploy/tasks/lock.yml")) if t.get("name", "").startswith(TASK)]
    assert len(tasks) == 1
    return tasks[0]


def _refusals(hosts: dict[str, list], me: str, batch=("lab1", "lab2"), check_mode=False) -> list[str]:
    """The messages of the task on host `me`, one per engine it refuses; hosts: each host's conflicts.engines (None:
    its conflict check failed there)."""
    task = _task()
    hostvars = {h: {"sglang_deploy__conflicts": {"engines": e} if e is not None else {"failed": True}}
                for h, e in hosts.items()}
    out = []
    ctx = {"hostvars": hostvars, "inventory_hostname": me, "ansible_play_batch": list(batch),
           "ansible_check_mode": check_mode, "sglang_deploy__conflicts": hostvars[me]["sglang_deploy__conflicts"],
           "sglang_deploy__d": {"config": "one-host"}}
    for item in _render(task["loop"], **ctx):
        c = {**ctx, "item": item}
        c["sglang_deploy__engine_left"] = _render(task["vars"]["sglang_deploy__engine_left"], **c)
        if _render("{{ " + task["when"] + " }}", **c):
            out.append(" ".join(str(_render(task["ansible.builtin.fail"]["msg"], **c)).split()))
    return out


def test_every_host_of_the_engine_stopping_its_rank_in_the_batch_is_not_refused():
    rank0 = {**ENGINE, "node_rank": 0}
    assert _refusals({"lab1": [rank0], "lab2": [ENGINE]}, "lab1") == []
    assert _refusals({"lab1": [rank0], "lab2": [ENGINE]}, "lab2") == []
    assert _refusals({"lab1": [], "lab2": []}, "lab2") == []  # no engine over several hosts stopped


def test_a_rank_whose_partner_does_not_stop_its_rank_is_refused_on_either_host_naming_it():
    rank0 = {**ENGINE, "node_rank": 0}
    # lab1's deploy does not displace the engine there (another GPU): lab2 must not stop rank 1 alone.
    msg = _refusals({"lab1": [], "lab2": [ENGINE]}, "lab2")
    assert msg == ["DEPLOY REFUSED on lab2 before any change: deploying one-host would stop two-host here, rank 1 of "
                   "an engine over hosts lab1,lab2 whose other host lab1 does not stop it in this batch (refused "
                   "there, or the deploy there does not displace it); its ranks stop only together, rank 0 first: "
                   "deploy on every host of the engine in one batch a config that displaces it there "
                   "(REPLACES=two-host), or roll the engine off first (systemctl disable --now "
                   "sglang-two-host.service on lab1, then on lab2)"], msg
    # lab2's check refused (its conflicts failed there, or it left the batch): lab1 must not stop rank 0 alone.
    assert _refusals({"lab1": [rank0], "lab2": None}, "lab1")[0].startswith(
        "DEPLOY REFUSED on lab1 before any change: deploying one-host would stop two-host here, rank 0 of an engine "
        "over hosts lab1,lab2 whose other host lab2 does not stop it in this batch")
    assert _refusals({"lab1": [rank0], "lab2": [ENGINE]}, "lab1", batch=("lab1",))
    assert _refusals({"lab1": [], "lab2": [ENGINE]}, "lab2", check_mode=True)[0].startswith(
        "PLAN on lab2: the deploy would be refused: deploying one-host would stop two-host here, rank 1")
