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


# A batch that holds every host of the displaced engine, each deploying its own one-host config over its rank
# (REPLACES=two-host, SERIAL=2): the hosts switch and go back together (tasks/lock.yml's sglang_deploy__together,
# tasks/engine_check.yml imported by main.yml and switch.yml), so a host whose gate fails sends the others back too
# and no host commits its one-host config while the restarted rank 0 waits for a rank that is gone.
TOGETHER = "Note the hosts that switch and go back together with this one"
RANK0 = {**ENGINE, "node_rank": 0}


def _together(me: str, engines: list, nnodes: int = 1, engine_hosts=("lab1", "lab2")) -> dict:
    return _noted(me, engines, nnodes, engine_hosts)["sglang_deploy__together"]


def _noted(me: str, engines: list, nnodes: int = 1, engine_hosts=("lab1", "lab2")) -> dict:
    """The facts lock.yml notes on host ``me`` for the engines its deploy displaces (sglang_deploy__together_engines,
    then sglang_deploy__together)."""
    ctx = {"inventory_hostname": me, "sglang_deploy__d": {"config": "one-host", "nnodes": nnodes},
           "sglang_deploy__engine_hosts": list(engine_hosts), "sglang_deploy__conflicts": {"engines": engines}}
    tasks = flat(load(ROLES / "sglang_deploy/tasks/lock.yml"))
    for name in ("Note the engines over other hosts that this deploy displaces (they go back with it)", TOGETHER):
        task = next(t for t in tasks if t.get("name") == name)
        ctx.update({k: _render(v, **ctx) for k, v in task["ansible.builtin.set_fact"].items()})
    return ctx


def _imports(tasks_file: str) -> dict[str, dict]:
    """engine_check.yml's imports in a task file, by stage."""
    return {t["vars"]["sglang_deploy__engine_stage"]: t for t in flat(load(ROLES / f"sglang_deploy/tasks/{tasks_file}"))
            if t.get("ansible.builtin.import_tasks") == "engine_check.yml"}


def _engine_check(imp: dict, me: str, engines: list, at: dict[str, str], check_mode=False, nnodes=1,
                  plan_unchanged=False) -> list[str] | None:
    """engine_check.yml as imported (``imp``) on host ``me`` whose deploy displaces ``engines``; ``at``: the step each
    host noted last. None when the import is skipped, else the ENGINE FAILED lines."""
    ctx = {"inventory_hostname": me, "ansible_check_mode": check_mode,
           "sglang_deploy__d": {"config": "one-host", "nnodes": nnodes},
           "sglang_deploy__engine_hosts": ["lab1", "lab2"],
           "sglang_deploy__plan": {"unchanged": plan_unchanged},
           "sglang_deploy__conflicts": {"engines": engines}}
    noted = _noted(me, engines, nnodes)
    ctx.update({k: noted[k] for k in ("sglang_deploy__together", "sglang_deploy__together_engines")})
    if not _render("{{ " + imp["when"] + " }}", **ctx):
        return None
    ctx.update({k: _render(v, **ctx) for k, v in imp["vars"].items()})
    check = flat(load(ROLES / "sglang_deploy/tasks/engine_check.yml"))
    if not _render("{{ " + check[0]["when"] + " }}", **ctx):
        return None
    at = {**at, me: ctx["sglang_deploy__engine_stage"]}
    ctx["hostvars"] = {h: {"sglang_deploy__engine_at": s} for h, s in at.items()}
    fail = check[1]
    ctx["sglang_deploy__engine_missing"] = _render(fail["vars"]["sglang_deploy__engine_missing"], **ctx)
    if not _render("{{ " + fail["when"] + " }}", **ctx):
        return []
    return [" ".join(str(_render(fail["ansible.builtin.fail"]["msg"], **ctx)).split())]


def test_the_hosts_of_a_displaced_engine_go_together_with_their_rank():
    assert _together("lab2", [ENGINE]) == {"lab1": "rank 0 of two-host", "lab2": "rank 1 of two-host"}
    assert _together("lab1", [RANK0]) == {"lab1": "rank 0 of two-host", "lab2": "rank 1 of two-host"}
    assert _together("lab1", []) == {}  # a one-host deploy that displaces no engine over several hosts: alone
    assert _together("lab1", [], nnodes=2) == {"lab1": "rank 0", "lab2": "rank 1"}


def test_a_host_of_a_displaced_engine_does_not_commit_when_rank_0s_host_failed_its_gate():
    # lab1 (rank 0 of two-host) failed its gate and waits in its rollback (its last step: the start); lab2's one-host
    # deploy passed its own gates: before its commit it fails too, so it goes back and restarts rank 1 of two-host.
    gates = _imports("main.yml")["the gates"]
    msg = _engine_check(gates, "lab2", [ENGINE], {"lab1": "the start"})
    assert msg == ["ENGINE FAILED: lab1 (rank 0 of two-host) did not get past the gates; the hosts of an engine switch "
                   "and go back together, and this deploy of one-host on lab2 displaces two-host (rank 1 of the engine "
                   "over lab1,lab2), so every host goes back: lab2 restarts its rank of two-host"], msg
    assert _engine_check(gates, "lab2", [ENGINE], {"lab1": "the gates"}) == []  # both got there: both commit
    assert _engine_check(gates, "lab2", [], {"lab1": "the start"}) is None  # displaces no engine: no check
    assert _engine_check(gates, "lab2", [ENGINE], {"lab1": "the start"}, check_mode=True) is None


def test_no_rank_above_0_of_a_displaced_engine_is_stopped_unless_its_rank_0_stopped():
    stop = _imports("switch.yml")["the stop of rank 0"]
    msg = _engine_check(stop, "lab2", [ENGINE], {"lab1": "the plan"})
    assert msg and msg[0].startswith(
        "ENGINE FAILED: lab1 (rank 0 of two-host) did not get past the stop of rank 0;"), msg
    assert _engine_check(stop, "lab2", [ENGINE], {"lab1": "the stop of rank 0"}) == []
    start = _imports("switch.yml")["the start"]
    assert _engine_check(start, "lab1", [RANK0], {"lab2": "the stop of rank 0"})[0].startswith(
        "ENGINE FAILED: lab2 (rank 1 of two-host) did not get past the start;")


def test_the_plan_of_a_displaced_engine_fails_on_every_host_also_in_check_mode():
    plan = _imports("main.yml")["the plan"]
    msg = _engine_check(plan, "lab1", [RANK0], {}, check_mode=True)
    assert msg and msg[0].endswith("so no host changes"), msg


def test_an_engine_over_several_hosts_keeps_its_line_also_when_it_replaces_one_over_the_same_hosts():
    gates = _imports("main.yml")["the gates"]
    line = ["ENGINE FAILED: lab1 (rank 0) (rank(s) of one-host with lab2) did not get past the gates; one rank failing "
            "fails the engine, so every rank goes back"]
    assert _engine_check(gates, "lab2", [], {"lab1": "the start"}, nnodes=2) == line
    assert _engine_check(gates, "lab2", [ENGINE], {"lab1": "the start"}, nnodes=2) == line  # a switch of two-host
    assert _together("lab2", [ENGINE], nnodes=2) == {"lab1": "rank 0", "lab2": "rank 1"}
    # An engine over lab2 and lab3 that the engine over lab1 and lab2 displaces on lab2: lab3 goes back with them.
    assert _together("lab2", [{**ENGINE, "engine_hosts": ["lab2", "lab3"]}], nnodes=2) == {
        "lab1": "rank 0", "lab2": "rank 1", "lab3": "rank 1 of two-host"}
