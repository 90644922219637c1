"""The fleet canary's post-deploy watch (issue 37, docs/monitoring-watch.md): the watch judges the canary engine's own
metrics, and live traffic reaches that engine only through the fleet router(s). So the role sglang_fleet hands the
deploy role every running fleet router for the canary: the canary goes back into each of them before its watch
window, and a failed watch takes it out of each of them before the rollback (then the fleet role puts it back on its
old config and stops the rollout). Read from the task files themselves, and their expressions rendered by Ansible's
own templar."""

from __future__ import annotations

import pytest
from role_tasks import ROLES
from role_tasks import flat as _flat
from role_tasks import load as _tasks
from role_tasks import render as _render

ROUTERS = [{"host": "lab4", "url": "http://127.0.42.14:31300"}, {"host": "lab5", "url": "http://127.0.42.15:31300"}]


def _named(tasks: list[dict], start: str) -> int:
    hits = [i for i, t in enumerate(tasks) if t.get("name", "").startswith(start)]
    assert len(hits) == 1, (start, [t.get("name") for t in tasks])
    return hits[0]


def _fleet_deploy_vars() -> dict:
    main = _flat(_tasks(ROLES / "sglang_fleet/tasks/engine.yml"))
    return main[_named(main, "Deploy the engine")]["vars"]


@pytest.mark.parametrize("canary,routers,want_routers,want_skip", [
    (True, ROUTERS, ROUTERS, ""),
    (True, ROUTERS[:1], ROUTERS[:1], ""),
    (True, [], [], "no fleet router yet (a first rollout): no live traffic reaches the canary"),
    (False, ROUTERS, [], "not the canary of the fleet"),
])
def test_the_fleet_hands_the_canary_every_running_fleet_router_for_its_watch(canary, routers, want_routers, want_skip):
    """Before: the fleet role set no watch router, so the canary was watched while out of the fleet router (no live
    traffic reached it: every interval inconclusive) and a first rollout watched an engine no router sent to."""
    v = _fleet_deploy_vars()
    ctx = {"sglang_fleet__is_canary": canary, "sglang_fleet__routers": routers,
           "sglang_fleet__e": {"url": "http://127.0.42.11:31300"}}
    assert _render(v["sglang_deploy_watch_routers"], **ctx) == want_routers
    assert _render(v["sglang_deploy_watch_skip"], **ctx) == want_skip
    assert _render(v["sglang_deploy_watch_worker_url"], **ctx) == "http://127.0.42.11:31300"


def test_the_canary_is_out_of_the_fleet_routers_for_its_gates_and_back_in_only_for_its_watch():
    main = _flat(_tasks(ROLES / "sglang_fleet/tasks/engine.yml"))
    out, deploy, back = (_named(main, n) for n in ("Take the engine out of every fleet router", "Deploy the engine",
                                                   "Put the engine back into every fleet router"))
    assert out < deploy < back
    for i in (out, back):
        assert main[i]["loop"] == "{{ sglang_fleet__routers | default([]) }}"
        assert main[i]["delegate_to"] == "{{ item.host | default(inventory_hostname) }}"
    # A failed deploy (its watch included): put back only into the routers this step took it out of, then stop.
    put, stop = _named(main, "Put the rolled-back engine back"), _named(main, "Stop the rollout")
    assert back < put < stop and main[put]["loop"] == "{{ sglang_fleet__out_of | default([]) }}"


def test_the_watch_puts_the_canary_in_first_and_takes_a_failed_one_out_before_its_rollback():
    watch = _flat(_tasks(ROLES / "sglang_deploy/tasks/watch.yml"))
    put_in = _named(watch, "Put the canary into the router(s) for its watch")
    start = _named(watch, "Start the watch")
    take_out = _named(watch, "Take the failed canary out of the router(s)")
    fail = _named(watch, "Fail when the watch failed")
    rescue_out = _named(watch, "Take the canary out of the router(s) before the rollback")
    assert put_in < start < take_out < fail
    for i in (put_in, take_out, rescue_out):
        assert watch[i]["loop"] == "{{ sglang_deploy__watch_routers | default([]) }}", watch[i]
        assert watch[i]["delegate_to"] == "{{ item.host | default(inventory_hostname) }}", watch[i]
    assert watch[take_out]["when"] == "sglang_deploy__watch.result == 'failed'"
    assert watch[put_in]["sgdeploy.host.sglang_router_workers"]["present"] == ["{{ sglang_deploy__watch_worker }}"]
    assert watch[take_out]["sgdeploy.host.sglang_router_workers"]["absent"] == ["{{ sglang_deploy__watch_worker }}"]
    # The routers: the fleet's list, else the host's own router (role sglang_replicas), else none.
    pick = watch[_named(watch, "Find the routers the canary is put into")]["ansible.builtin.set_fact"]
    base = {"sglang_deploy_watch_routers": [], "sglang_deploy_watch_router_url": "", "inventory_hostname": "lab1",
            "sglang_deploy_watch_worker_url": "", "sglang_deploy__url": "http://127.0.42.1:31201"}
    assert _render(pick["sglang_deploy__watch_routers"], **base) == []
    assert _render(pick["sglang_deploy__watch_routers"], **{**base, "sglang_deploy_watch_router_url": "http://r:1"}) \
        == [{"url": "http://r:1", "host": "lab1"}]
    assert _render(pick["sglang_deploy__watch_routers"], **{**base, "sglang_deploy_watch_routers": ROUTERS}) == ROUTERS
    assert _render(pick["sglang_deploy__watch_worker"], **base) == "http://127.0.42.1:31201"
    assert _render(pick["sglang_deploy__watch_worker"], **{**base, "sglang_deploy_watch_worker_url": "http://e:2"}) \
        == "http://e:2"
    # The watch reads the canary engine's own metrics (the engine it judges), not a router's.
    assert watch[start]["sgdeploy.host.sglang_watch"]["url"] == "{{ sglang_deploy__url }}"
