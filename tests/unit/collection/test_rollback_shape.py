"""make rollback of an engine over several hosts whose previous deploy had another shape (docs/multinode.md): the hosts
that had a previous deploy go back to it, a rank above 0 with none (the engine grew from one host) is stopped and
removed; any other host of the engine with nothing to go back to (its rank 0) refuses on every host before any change,
naming the host and why. The role's own Jinja (rollback_nodes.yml, rollback.yml), rendered as Ansible renders it."""

from __future__ import annotations

from role_tasks import ROLES, flat, load
from role_tasks import render as _render

ROLE = ROLES / "sglang_deploy"


def _task(path: str, start: str) -> dict:
    tasks = [t for t in flat(load(ROLE / path)) if t.get("name", "").startswith(start)]
    assert len(tasks) == 1, start
    return tasks[0]


def _node_facts(current: dict | None, previous: dict | None) -> dict:
    """rollback_nodes.yml's facts on one host, from its current.json and previous.json."""
    facts = _task("tasks/rollback_nodes.yml", "Note the hosts the engine spans")["ansible.builtin.set_fact"]
    state = {"sglang_deploy__rb_nodes_state": {"current": current, "previous": previous}}
    return {k: _render(v, **state) for k, v in facts.items()}


def _refusal(hosts: dict[str, dict], me: str = "lab1"):
    """(refused?, message) of rollback.yml's shape refusal on host `me`."""
    task = _task("tasks/rollback.yml", "Refuse a rollback of an engine over several hosts where one of its hosts")
    ctx = {"hostvars": hosts, "inventory_hostname": me, "sglang_deploy__engine_hosts": list(hosts),
           "sglang_deploy__rb_asked": "kimi", "sglang_deploy_state_dir": "/var/lib/sglang-deploy",
           **hosts[me]}
    for name in ("sglang_deploy__rb_missing", "sglang_deploy__rb_having"):
        ctx[name] = _render(task["vars"][name], **ctx)
    if not _render("{{ " + task["when"] + " }}", **ctx):
        return False, ""  # Ansible renders the message only when the task runs
    return True, " ".join(str(_render(task["vars"]["sglang_deploy__rb_shape_refusal"], **ctx)).split())


RANK0, RANK1 = {"nnodes": 2, "node_rank": 0}, {"nnodes": 2, "node_rank": 1}
ONE_HOST = {"nnodes": 1}


def _retire(hosts: dict[str, dict], me: str) -> bool:
    task = _task("tasks/rollback.yml", "Note whether this host stops and removes its rank")
    ctx = {"hostvars": hosts, "sglang_deploy__engine_hosts": list(hosts), **hosts[me]}
    return bool(_render(task["ansible.builtin.set_fact"]["sglang_deploy__rb_retire"], **ctx))


def test_an_engine_grown_from_one_host_goes_back_on_rank_0_and_its_other_rank_is_removed():
    hosts = {"lab1": _node_facts(RANK0, ONE_HOST), "lab2": _node_facts(RANK1, None)}
    assert hosts["lab1"]["sglang_deploy_rollback_nnodes"] == 2 and hosts["lab2"]["sglang_deploy_rollback_nnodes"] == 2
    assert not _refusal(hosts, "lab1")[0] and not _refusal(hosts, "lab2")[0]
    assert (_retire(hosts, "lab1"), _retire(hosts, "lab2")) == (False, True)


def test_an_engine_whose_rank_0_had_no_previous_deploy_is_refused_on_every_host_naming_it():
    hosts = {"lab1": _node_facts(RANK0, None), "lab2": _node_facts(RANK1, ONE_HOST)}
    for me in hosts:
        refused, msg = _refusal(hosts, me)
        assert refused, me
        assert msg.startswith(f"ROLLBACK REFUSED on {me} before any change: config kimi: its engine runs on lab1, lab2 "
                              "now, but lab1 had no previous deploy of it (/var/lib/sglang-deploy/kimi/previous.json) "
                              "and is not a rank above 0 that could just stop, while the previous deploy on lab2 "
                              "ran on 1 host(s)"), msg
        assert msg.endswith("stop sglang-kimi.service on lab1"), msg


def test_every_host_going_back_to_its_own_one_host_deploy_or_to_the_same_engine_is_not_refused_here():
    # Each host had a one-host deploy of the config: each goes back to its own.
    one_each = {"lab1": _node_facts(RANK0, ONE_HOST), "lab2": _node_facts(RANK1, ONE_HOST)}
    assert not _refusal(one_each)[0] and not _retire(one_each, "lab2")
    # The same two hosts before and now.
    same = {"lab1": _node_facts(RANK0, RANK0), "lab2": _node_facts(RANK1, RANK1)}
    assert not _refusal(same)[0] and not _retire(same, "lab2")
    # Back from one host to the engine over two (lab2 runs nothing of it now): every host has a previous deploy.
    assert not _refusal({"lab1": _node_facts(ONE_HOST, RANK0), "lab2": _node_facts(None, RANK1)})[0]


def test_no_host_with_a_previous_deploy_is_left_to_the_nothing_to_roll_back_to_refusal():
    hosts = {"lab1": _node_facts(RANK0, None), "lab2": _node_facts(RANK1, None)}
    assert not _refusal(hosts)[0] and not _retire(hosts, "lab2")  # rollback_one.yml: "no previous deploy recorded"
