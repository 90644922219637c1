"""The sgdeploy.host collection's module_utils: the run-owned lock, the switch journal, the plan, health.

systemctl is replaced by a recorder that keeps a small model of unit states, so these tests see
the order of what the modules ask systemd to do (the lab tests run the real thing).
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "collections"))

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_files as files  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_lock as lock  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_plan as planmod  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_records as hostrecords  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_txn as txn  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_units as units  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_http  # noqa: E402

# ---------------------------------------------------------------------------------------------
# The lock


def test_a_second_run_is_refused_with_who_holds_the_lock(tmp_path):
    path = str(tmp_path / "lock")
    lock.acquire("run-a", "ctl1", "deploy", 300, lock=path, now=1000.0)
    with pytest.raises(lock.LockError) as err:
        lock.acquire("run-b", "ctl2", "rollback", 300, lock=path, now=1010.0)
    msg = str(err.value)
    assert "another deploy holds the lock" in msg and "run run-a from ctl1" in msg and "expires in 290 s" in msg
    assert json.loads(Path(path).read_text())["run_id"] == "run-a"


def test_an_expired_lease_is_taken_over_with_a_message(tmp_path):
    path = str(tmp_path / "lock")
    lock.acquire("run-a", "ctl1", "deploy", 300, lock=path, now=1000.0)
    out = lock.acquire("run-b", "ctl2", "deploy", 300, lock=path, now=1301.0)
    assert out["lock"]["run_id"] == "run-b"
    assert "run run-a from ctl1" in out["recovered"] and "lease expired" in out["recovered"]


def test_renewing_keeps_the_lock_and_only_the_holder_renews_or_releases(tmp_path):
    path = str(tmp_path / "lock")
    lock.acquire("run-a", "ctl1", "deploy", 300, lock=path, now=1000.0)
    lock.renew("run-a", 300, "wait healthy", lock=path, now=1250.0)
    with pytest.raises(lock.LockError):
        lock.acquire("run-b", "ctl2", "deploy", 300, lock=path, now=1400.0)  # 1250 + 300 not reached
    with pytest.raises(lock.LockError, match="no longer held by run run-b"):
        lock.renew("run-b", 300, lock=path, now=1400.0)
    assert lock.release("run-b", lock=path) is False
    assert lock.release("run-a", lock=path) is True and not os.path.exists(path)


def test_a_holder_proved_gone_by_its_controller_is_taken_over(tmp_path):
    path = str(tmp_path / "lock")
    lock.acquire("run-a", "ctl1", "deploy", 300, lock=path, now=1000.0, controller_pid=4242)
    out = lock.acquire("run-b", "ctl1", "deploy", 300, lock=path, now=1001.0, take_over="run-a")
    assert out["lock"]["run_id"] == "run-b" and "controller process is gone" in out["recovered"]


# ---------------------------------------------------------------------------------------------
# A fake systemd


class FakeSystemd:
    def __init__(self, active=(), enabled=(), restarts=None):
        self.active, self.enabled = set(active), set(enabled)
        self.restarts = dict(restarts or {})
        self.states: dict[str, str] = {}  # a state other than active/inactive (activating: the restart delay)
        self.calls: list[tuple[str, ...]] = []

    def state(self, unit):
        return self.states.get(unit) or ("active" if unit in self.active else "inactive")

    def __call__(self, *args):
        self.calls.append(args)
        verb, rest = args[0], [a for a in args[1:] if not a.startswith("--")]
        unit = rest[0] if rest else ""
        rc, out = 0, ""
        if verb == "is-active":
            rc = 0 if self.state(unit) == "active" else 3
            out = "" if "--quiet" in args else self.state(unit) + "\n"
        elif verb == "is-enabled":
            rc = 0 if unit in self.enabled else 1
        elif verb in ("start", "restart"):
            self.active.add(unit)
        elif verb == "stop":
            self.active.discard(unit)
            self.states.pop(unit, None)
        elif verb == "enable":
            self.enabled.add(unit)
        elif verb == "disable":
            self.enabled.discard(unit)
        elif verb == "reset-failed":
            self.restarts[unit] = 0
        elif verb == "show":
            out = f"NRestarts={self.restarts.get(unit, 0)}\nActiveState={self.state(unit)}\n"
        return type("P", (), {"returncode": rc, "stdout": out, "stderr": ""})()


@pytest.fixture()
def host(tmp_path, monkeypatch):
    paths = txn.Paths(str(tmp_path / "state"), str(tmp_path / "units"), str(tmp_path / "env"))
    os.makedirs(paths.unit_dir)
    os.makedirs(paths.env_dir)
    fake = FakeSystemd()
    monkeypatch.setattr(units, "systemctl", fake)
    return paths, fake


def deploy_of(config, port=30000, gpus=(0,), digest="d-new", release="r-new"):
    return {"config": config, "unit_name": f"sglang-{config}.service", "release": release, "bind_address": "127.0.0.1",
            "ports": [port], "gpus": list(gpus), "speculative": True, "digest": digest}


def put_running(paths, fake, config, text, port=30000, gpus=(0,)):
    Path(paths.unit(f"sglang-{config}.service")).write_text(text)
    Path(paths.env(config)).write_text(f"# env of {config}\n")
    current = deploy_of(config, port, gpus, digest=f"d-{config}", release="r-old")
    current["unit_digest"] = current.pop("digest")
    files.write_json(paths.current(config), current)
    fake.active.add(f"sglang-{config}.service")
    fake.enabled.add(f"sglang-{config}.service")
    return current


def test_undo_restarts_the_old_unit_first_and_writes_state_after(host, monkeypatch):
    paths, fake = host
    old = put_running(paths, fake, "old", "[Service]\nExecStart=/old\n")
    txn.begin(paths, "run-1", deploy_of("new"), stop_units=["sglang-old.service"])
    txn.set_step(paths, "run-1", "stopping")
    fake("stop", "sglang-old.service")
    txn.install(paths, "run-1", "[Service]\nExecStart=/new\n", "SECRET=x\n", os.getgid())
    txn.start(paths, "run-1")
    order = []
    real_write = txn.write_json
    monkeypatch.setattr(txn, "write_json",
                        lambda p, d, mode=0o644: (order.append(("write", p)), real_write(p, d, mode)))
    fake_calls = fake.calls
    start_at = len(fake_calls)
    out = txn.undo(paths)
    assert [r["unit"] for r in out["restarted"]] == ["sglang-old.service"]
    assert "sglang-old.service" in fake.active and "sglang-new.service" not in fake.active
    assert "sglang-new.service" not in fake.enabled and "sglang-old.service" in fake.enabled
    assert not os.path.exists(paths.unit("sglang-new.service")) and not os.path.exists(paths.env("new"))
    assert Path(paths.unit("sglang-old.service")).read_text() == "[Service]\nExecStart=/old\n"
    assert json.loads(Path(paths.current("old")).read_text()) == old
    assert not os.path.exists(paths.txn)
    started = [c for c in fake_calls[start_at:] if c[0] in ("start", "restart")]
    assert started == [("start", "sglang-old.service")]
    assert order and order[0][1] == paths.current("old")  # state written only after the start


def test_a_full_disk_under_the_state_folder_still_leaves_the_old_service_serving(host, monkeypatch):
    paths, fake = host
    put_running(paths, fake, "old", "[Service]\nExecStart=/old\n")
    txn.begin(paths, "run-1", deploy_of("new"), stop_units=["sglang-old.service"])
    txn.set_step(paths, "run-1", "stopping")
    fake("stop", "sglang-old.service")

    def enospc(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(txn, "write_json", enospc)
    out = txn.undo(paths)
    assert "sglang-old.service" in fake.active
    assert any("No space left on device" in n for n in out["notes"])


def test_undo_of_a_same_name_redeploy_restarts_it_but_a_never_stopped_unit_is_only_started(host):
    paths, fake = host
    put_running(paths, fake, "cfg", "[Service]\nExecStart=/v1\n")
    txn.begin(paths, "run-1", deploy_of("cfg"), stop_units=["sglang-cfg.service"])
    txn.set_step(paths, "run-1", "stopping")   # the stop timed out: it never stopped
    n = len(fake.calls)
    txn.undo(paths)
    assert ("restart", "sglang-cfg.service") not in fake.calls[n:] and ("start", "sglang-cfg.service") in fake.calls[n:]
    txn.begin(paths, "run-2", deploy_of("cfg"), stop_units=["sglang-cfg.service"])
    txn.install(paths, "run-2", "[Service]\nExecStart=/v2\n", "", os.getgid())
    n = len(fake.calls)
    txn.undo(paths)
    assert ("restart", "sglang-cfg.service") in fake.calls[n:]
    assert Path(paths.unit("sglang-cfg.service")).read_text() == "[Service]\nExecStart=/v1\n"


def test_start_resets_the_failed_state_and_journals_the_restart_baseline(host):
    paths, fake = host
    fake.restarts["sglang-new.service"] = 3
    txn.begin(paths, "run-1", deploy_of("new"), stop_units=[])
    txn.install(paths, "run-1", "[Service]\n", "", os.getgid())
    journal = txn.start(paths, "run-1")
    verbs = [c[0] for c in fake.calls if c[-1] == "sglang-new.service"]
    assert verbs.index("reset-failed") < verbs.index("start")
    assert journal["nrestarts_baseline"] == 0 and "sglang-new.service" not in fake.enabled


def test_commit_keeps_the_replaced_units_text_as_previous_and_enables_only_the_new_unit(host):
    paths, fake = host
    put_running(paths, fake, "old", "[Service]\nExecStart=/old\n")
    txn.begin(paths, "run-1", deploy_of("new"), stop_units=["sglang-old.service"])
    txn.install(paths, "run-1", "[Service]\nExecStart=/new\n", "", os.getgid())
    txn.start(paths, "run-1")
    txn.commit(paths, "run-1")
    previous = json.loads(Path(paths.previous("new")).read_text())
    assert previous["config"] == "old" and previous["unit_text"] == "[Service]\nExecStart=/old\n"
    assert "sglang-new.service" in fake.enabled and "sglang-old.service" not in fake.enabled
    assert not os.path.exists(paths.current("old"))
    assert json.loads(Path(paths.current("new")).read_text())["config"] == "new"


def test_a_begin_that_died_before_its_journal_is_undone_without_touching_anything(host):
    paths, fake = host
    os.makedirs(paths.files)
    out = txn.undo(paths)
    assert out["step"] is None and "no journal" in out["found"] and not fake.calls


def test_begin_refuses_while_another_switch_is_pending(host):
    paths, _ = host
    txn.begin(paths, "run-1", deploy_of("new"), stop_units=[])
    with pytest.raises(txn.TxnError, match="interrupted switch to new .run run-1, step begun"):
        txn.begin(paths, "run-2", deploy_of("new"), stop_units=[])


# ---------------------------------------------------------------------------------------------
# Plan


def test_an_enabled_but_inactive_config_on_the_same_port_is_disabled_by_the_switch(host):
    paths, fake = host
    put_running(paths, fake, "idle", "[Service]\n", port=30000, gpus=(5,))
    fake.active.discard("sglang-idle.service")           # enabled, not running: it would win the port at boot
    put_running(paths, fake, "elsewhere", "[Service]\n", port=31000, gpus=(6,))
    fake.active.discard("sglang-elsewhere.service")
    out = planmod.plan(deploy_of("new", gpus=(0,)), 8, paths.state_dir, sockets=[])
    assert out["disable_units"] == ["sglang-idle.service"] and out["stop_units"] == []


def test_a_port_held_by_something_else_is_refused(host):
    paths, _ = host
    sock = {"address": "127.0.0.1", "port": 30000, "pids": [7], "process": "nc", "unit": "stray.service"}
    refused = "port 127.0.0.1:30000 is already in use by nc .pid 7, unit stray.service"
    with pytest.raises(planmod.PlanError, match=refused):
        planmod.plan(deploy_of("new"), 8, paths.state_dir, sockets=[sock])


# ---------------------------------------------------------------------------------------------
# Health and atomic files


def test_restarts_are_judged_against_the_baseline_of_this_start(monkeypatch):
    fake = FakeSystemd(active=["u.service"], restarts={"u.service": 1})
    monkeypatch.setattr(units, "systemctl", fake)
    assert sglang_http.unit_problem("u.service", baseline=1) == ""
    fake.restarts["u.service"] = 2
    assert sglang_http.unit_problem("u.service", baseline=1) == "u.service restarted 1 time(s) since this start"


def test_an_atomic_write_that_fails_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "current.json"
    files.write_json(str(path), {"v": 1})

    def boom(_fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        files.write_json(str(path), {"v": 2})
    assert json.loads(path.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["current.json"]


def test_the_host_and_the_controller_build_records_with_one_implementation():
    # The record module writes the record on the host; `make status`, the baseline and the sweep read it
    # with sgdeploy.records: both are the collection's sglang_deploy_records (no second builder to drift).
    from sgdeploy import records

    for name in ("build_record", "write_record", "read_record", "last_good", "status_rows", "SCHEMA", "KEYS"):
        assert getattr(records, name) is getattr(hostrecords, name), name
    report = {"gates": [{"name": "smoke", "verdict": "pass"}], "bench": {"tokens_per_s": 1.0},
              "exactness": {"verdict": "fail", "reason": "prompt p1 first differs at token 4"}}
    host = hostrecords.build_record(config="ddtree-b15", host="lab1", release="abc", outcome="rolled_back",
                                    started="2026-12-01T00:00:00Z", report=report)
    assert set(host) >= set(hostrecords.KEYS) | {"exactness"}
    assert host["exactness"] == report["exactness"]


# ---------------------------------------------------------------------------------------------
# An engine over several hosts: rank 0 stops first, a rank above 0 (SGLang ignores its SIGTERM) after it


class RankIgnoringSigterm(FakeSystemd):
    """A rank above 0 of SGLang 0.5.23: `systemctl stop` leaves it deactivating; SIGKILL (or rank 0's end) stops it."""

    def __init__(self, stubborn=(), **kw):
        super().__init__(**kw)
        self.stubborn = set(stubborn)

    def __call__(self, *args):
        unit = [a for a in args[1:] if not a.startswith("--")][:1]
        if args[0] == "stop" and unit and unit[0] in self.stubborn:
            self.calls.append(args)
            self.states[unit[0]] = "deactivating"
            return type("P", (), {"returncode": 0, "stdout": "", "stderr": ""})()
        if args[0] == "kill" and unit:
            self.active.discard(unit[0])
            self.states.pop(unit[0], None)
        return super().__call__(*args)


def _rank_host(tmp_path, monkeypatch, fake):
    paths = txn.Paths(str(tmp_path / "state"), str(tmp_path / "units"), str(tmp_path / "env"))
    os.makedirs(paths.unit_dir)
    os.makedirs(paths.env_dir)
    monkeypatch.setattr(units, "systemctl", fake)
    return paths


def _as_rank(paths, config, node_rank):
    current = files.read_json(paths.current(config))
    files.write_json(paths.current(config), {**current, "nnodes": 2, "node_rank": node_rank})


def test_the_first_stop_leaves_a_rank_above_0_and_the_second_kills_it_only_if_it_outlives_the_grace(tmp_path,
                                                                                                   monkeypatch):
    fake = RankIgnoringSigterm(stubborn={"sglang-eng.service"})
    paths = _rank_host(tmp_path, monkeypatch, fake)
    put_running(paths, fake, "eng", "[Service]\n", port=30000, gpus=(0,))
    _as_rank(paths, "eng", 1)
    put_running(paths, fake, "solo", "[Service]\n", port=31000, gpus=(1,))  # a one-host engine: drains on SIGTERM
    txn.begin(paths, "run-1", deploy_of("new", gpus=(0, 1)), ["sglang-eng.service", "sglang-solo.service"])
    _, stopping, killed = txn.stop(paths, "run-1", "first")
    assert stopping == ["sglang-solo.service"] and killed == []
    assert ("stop", "--no-block", "sglang-eng.service") not in fake.calls  # never signalled before rank 0 stopped
    clock = iter(range(0, 1000, 1)).__next__
    _, stopping, killed = txn.stop(paths, "run-1", "above0", kill_after_s=30, sleep=lambda s: None,
                                   clock=lambda: float(clock()))
    assert stopping == ["sglang-eng.service"] and killed == ["sglang-eng.service"]
    assert fake.calls.index(("stop", "--no-block", "sglang-eng.service")) < \
        fake.calls.index(("kill", "--signal=SIGKILL", "sglang-eng.service"))
    assert fake.state("sglang-eng.service") == "inactive"


def test_a_rank_above_0_that_ends_with_its_rank_0_is_not_killed(tmp_path, monkeypatch):
    fake = FakeSystemd()  # the rank exits by itself (rank 0's clean stop ended it)
    paths = _rank_host(tmp_path, monkeypatch, fake)
    put_running(paths, fake, "eng", "[Service]\n")
    _as_rank(paths, "eng", 1)
    txn.begin(paths, "run-1", deploy_of("eng"), ["sglang-eng.service"])
    assert txn.stop(paths, "run-1", "first")[1:] == ([], [])
    _, stopping, killed = txn.stop(paths, "run-1", "above0", kill_after_s=30, sleep=lambda s: None)
    assert stopping == ["sglang-eng.service"] and killed == []
    assert not any(c[0] == "kill" for c in fake.calls)


def test_rank_0_and_one_host_engines_stop_in_the_first_step(tmp_path, monkeypatch):
    fake = FakeSystemd()
    paths = _rank_host(tmp_path, monkeypatch, fake)
    put_running(paths, fake, "eng", "[Service]\n")
    _as_rank(paths, "eng", 0)
    txn.begin(paths, "run-1", deploy_of("eng"), ["sglang-eng.service"])
    assert txn.stop(paths, "run-1", "first")[1] == ["sglang-eng.service"]
    assert txn.stop(paths, "run-1", "above0")[1:] == ([], [])


def _rank_1_stopped_to_retire(tmp_path, monkeypatch, unit_text: str):
    """A host whose engine "eng" runs rank 1 of an engine over two hosts, its switch begun with what runs and that
    rank stopped (the step before ``retire``): (the fake systemd, the paths)."""
    fake = FakeSystemd()
    paths = _rank_host(tmp_path, monkeypatch, fake)
    put_running(paths, fake, "eng", unit_text)
    _as_rank(paths, "eng", 1)
    current = files.read_json(paths.current("eng"))
    txn.begin(paths, "run-1", {**current, "digest": current["unit_digest"]}, ["sglang-eng.service"])
    txn.stop(paths, "run-1", "above0", sleep=lambda s: None)
    return fake, paths


def test_retire_removes_a_stopped_rank_and_keeps_what_ran_as_previous(tmp_path, monkeypatch):
    # make rollback of an engine that grew from one host: the rank above 0 with no previous deploy here goes away.
    fake, paths = _rank_1_stopped_to_retire(tmp_path, monkeypatch, "[Service]\nExecStart=rank 1\n")
    out = txn.retire(paths, "run-1")
    assert out["current"] == {} and out["previous"]["node_rank"] == 1
    for path in (paths.unit("sglang-eng.service"), paths.env("eng"), paths.current("eng"), paths.journal):
        assert not os.path.exists(path), path
    previous = files.read_json(paths.previous("eng"))
    assert previous["unit_text"] == "[Service]\nExecStart=rank 1\n" and previous["env_public"] == "# env of eng"
    assert "sglang-eng.service" not in fake.enabled and fake.state("sglang-eng.service") == "inactive"


def test_an_undo_before_the_retire_puts_the_rank_back_and_starts_it(tmp_path, monkeypatch):
    fake, paths = _rank_1_stopped_to_retire(tmp_path, monkeypatch, "[Service]\n")
    txn.undo(paths)
    assert fake.state("sglang-eng.service") == "active" and files.read_json(paths.current("eng"))["node_rank"] == 1
    assert os.path.exists(paths.unit("sglang-eng.service")) and not os.path.exists(paths.previous("eng"))
