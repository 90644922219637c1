"""Deploy records: written atomically, read back, the last good deploy found, the status table."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from engine_stub import ROOT

from sgdeploy import records


def gates(*verdicts: str) -> list[dict]:
    return [{"gate": g, "metric": "m", "value": 1.0, "threshold": None, "baseline": None, "verdict": v,
             "reason": "", "details": {}} for g, v in zip(("smoke", "throughput", "acceptance"), verdicts,
                                                         strict=False)]


def rec(finished: str, outcome: str = "deployed", verdicts=("pass", "pass", "pass"), config="ddtree-b15",
        host="lab1", release="ddtree.fork.topk.abcdef12", accept=14.9, tps=173.4, **kw) -> dict:
    report = {"gates": gates(*verdicts), "bench": {"accept_length_mean": accept, "tokens_per_s": tps}}
    return records.build_record(config=config, host=host, release=release, outcome=outcome,
                                started=finished.replace(":05:", ":01:"), finished=finished, report=report,
                                config_digest="c0ffee", unit_digest="d1g3st", patches=["0001-ddtree.patch"],
                                features=["ddtree"], **kw)


def test_a_record_has_the_documented_shape():
    r = rec("2026-01-01T10:05:00Z", rollback=None, message="ok")
    # exactness, same_window: optional (older records lack them)
    assert list(r) == [*records.KEYS, "exactness", "same_window", "watch"]
    assert r["schema"] == 1 and r["outcome"] == "deployed" and len(r["gates"]) == 3
    assert r["bench"]["tokens_per_s"] == 173.4


def test_build_rejects_an_unknown_outcome():
    with pytest.raises(records.RecordError, match="outcome 'ok' is not allowed; allowed: deployed, rolled_back"):
        records.build_record(config="c", host="h", release="stock", outcome="ok", started="x")


def test_write_is_atomic_never_overwrites_and_reads_back(tmp_path):
    a = records.write_record(tmp_path / "recs", rec("2026-01-01T10:05:00Z"))
    b = records.write_record(tmp_path / "recs", rec("2026-01-01T10:05:00Z", outcome="rolled_back"))
    assert a.name == "20260101T100500Z.json" and b.name == "20260101T100500Z-2.json"
    assert {p.name for p in (tmp_path / "recs").iterdir()} == {a.name, b.name}  # no temporary files
    assert [r["outcome"] for r in records.read_records(tmp_path / "recs")] == ["deployed", "rolled_back"]
    assert records.read_record(a)["outcome"] == "deployed"
    assert records.read_record(b)["outcome"] == "rolled_back"


def test_read_record_names_the_file_and_the_problem(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"schema": 1, "config": "c"}')
    with pytest.raises(records.RecordError, match=f"{bad}: not a deploy record; missing config_digest"):
        records.read_record(bad)
    bad.write_text("{")
    with pytest.raises(records.RecordError, match=f"{bad}: not JSON"):
        records.read_record(bad)


def test_last_good_is_the_newest_deployed_record_with_every_gate_passed(tmp_path):
    want = rec("2026-01-02T10:05:00Z", release="good-newest")
    for r in [
        rec("2026-01-01T10:05:00Z", release="good-older"),
        want,
        rec("2026-01-03T10:05:00Z", outcome="rolled_back", verdicts=("pass", "pass", "fail")),
        rec("2026-01-04T10:05:00Z", verdicts=("pass", "inconclusive", "pass")),  # deployed, not all passed
        rec("2026-01-05T10:05:00Z", verdicts=()),  # deployed without gates
        rec("2026-01-06T10:05:00Z", host="lab2"),
        rec("2026-01-07T10:05:00Z", config="ddtree-b32"),
        rec("2026-01-08T10:05:00Z", outcome="failed", verdicts=("fail",)),
    ]:
        records.write_record(tmp_path, r)
    (tmp_path / "garbage.json").write_text("not json")
    assert records.last_good(tmp_path, "ddtree-b15", "lab1") == want
    assert records.last_good(tmp_path, "ddtree-b15", "lab2")["host"] == "lab2"
    assert records.last_good(tmp_path, "ar", "lab1") is None
    assert records.last_good(tmp_path / "missing", "ddtree-b15", "lab1") is None


def test_status_table_shows_the_newest_record_per_config_and_host(tmp_path):
    recs = [rec("2026-01-01T10:05:00Z"),
            rec("2026-01-02T10:05:00Z", outcome="rolled_back", verdicts=("pass", "pass", "fail"), accept=4.1,
                tps=92.0),
            rec("2026-01-01T11:05:00Z", host="lab2")]
    table = records.status_table(recs).splitlines()
    assert table[0].split() == ["config", "host", "release", "outcome", "gates", "exactness", "accept", "tok/s",
                                "when"]
    assert table[1].split()[:4] == ["ddtree-b15", "lab1", "ddtree.fork.topk.abcdef12", "rolled_back"]
    assert table[1].endswith("2026-01-02 10:05:00Z")
    assert "fail: acceptance" in table[1] and "4.10" in table[1] and "92.0" in table[1]
    assert "lab2" in table[2] and "deployed" in table[2] and "14.90" in table[2]
    assert len(table) == 3
    assert len(records.status_table(recs, every=True).splitlines()) == 4
    assert records.status_table([]) == "no deploy records"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sgdeploy.records", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_cli_status_last_good_and_write(tmp_path):
    recs = tmp_path / "records"
    good = records.write_record(recs, rec("2026-01-01T10:05:00Z"))
    records.write_record(recs, rec("2026-01-02T10:05:00Z", outcome="rolled_back", verdicts=("fail",)))
    (recs / "broken.json").write_text("{")

    status = cli("status", str(recs), "--json")
    assert status.returncode == 0
    rows = json.loads(status.stdout)
    assert [r["outcome"] for r in rows] == ["rolled_back"]
    assert set(rows[0]) == {"config", "host", "release", "outcome", "gates", "accept_length", "tokens_per_s",
                            "finished", "message", "exactness", "watch", "what", "measured"}
    assert "warning:" in status.stderr and "broken.json: not JSON" in status.stderr

    found = cli("last-good", str(recs), "--config", "ddtree-b15", "--host", "lab1")
    assert found.returncode == 0 and found.stdout.strip() == str(good)
    none = cli("last-good", str(recs), "--config", "ddtree-b15", "--host", "lab9")
    assert none.returncode == 1 and "no good deploy of ddtree-b15 on lab9" in none.stderr

    report = tmp_path / "report.json"
    report.write_text(json.dumps({"gates": gates("pass", "pass", "pass"), "bench": {"tokens_per_s": 1.0}}))
    release = tmp_path / "release.json"
    release.write_text(json.dumps({"label": "ddtree.fork.abcdef12", "patches": ["a.patch", "b.patch"],
                                   "features": ["ddtree", "fork"]}))
    wrote = cli("write", str(recs), "--config", "ddtree-b15", "--host", "lab1", "--outcome", "deployed",
                "--release-json", str(release), "--report", str(report), "--started", "2026-02-01T00:00:00Z",
                "--json")
    assert wrote.returncode == 0, wrote.stderr
    path = json.loads(wrote.stdout)["path"]
    written = records.read_record(path)
    assert written["release"] == "ddtree.fork.abcdef12" and written["features"] == ["ddtree", "fork"]
    assert written["gates"][0]["verdict"] == "pass" and written["bench"] == {"tokens_per_s": 1.0}
    assert records.last_good(recs, "ddtree-b15", "lab1") == written


@pytest.mark.parametrize("args, message", [
    (["status", "/nonexistent"], "records folder /nonexistent: does not exist"),
    (["write", "DIR", "--config", "c", "--host", "h", "--outcome", "ok", "--release", "x"],
     "invalid choice: 'ok'"),
    (["write", "DIR", "--config", "c", "--host", "h", "--outcome", "failed"], "give --release LABEL"),
    (["write", "DIR", "--config", "c", "--host", "h", "--outcome", "failed", "--release", "x",
      "--report", "/nonexistent.json"], "--report /nonexistent.json: cannot read it"),
    (["write", "DIR", "--config", "c", "--host", "h", "--outcome", "failed", "--release", "x",
      "--rollback-json", "{"], "--rollback-json '{': not JSON"),
])
def test_cli_misuse_exits_2_with_one_line(tmp_path, args, message):
    out = cli(*[str(tmp_path) if a == "DIR" else a for a in args])
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # nothing written


# --- make status: now, then the history (issue 33) ---------------------------------------------------------

def unchanged(finished: str, **kw) -> dict:
    """An unchanged deploy: only the smoke gate ran, so its record has no bench numbers."""
    r = rec(finished, outcome="unchanged", verdicts=("pass",), **kw)
    r["bench"] = None
    return r


def test_an_unchanged_deploy_shows_the_last_measured_numbers():
    """Before: `- -` for accept and tok/s (its smoke gate measures nothing)."""
    recs = [rec("2026-01-01T10:05:00Z", accept=14.9, tps=173.4),
            rec("2026-01-02T10:05:00Z", outcome="rolled_back", verdicts=("pass", "fail"), accept=3.0, tps=50.0),
            unchanged("2026-01-03T10:05:00Z")]
    rows = records.history_rows(recs)
    assert len(rows) == 1
    row = rows[0]
    assert (row["outcome"], row["accept_length"], row["tokens_per_s"]) == ("unchanged", 14.9, 173.4)
    assert row["measured"] == "2026-01-01T10:05:00Z"
    assert row["what"] == "deploy, unchanged (numbers of 2026-01-01 10:05:00Z)"
    line = records.history_table(recs).splitlines()[1]
    assert line.split()[-4:-2] == ["14.90", "173.4"], line  # accept, tok/s (then the date and time)
    # Nothing measured before: the numbers stay unknown, and the row says no more than that.
    alone = records.history_rows([unchanged("2026-01-03T10:05:00Z")])[0]
    assert (alone["accept_length"], alone["tokens_per_s"], alone["measured"]) == (None, None, None)
    assert alone["what"] == "deploy, unchanged"


def test_history_rows_say_what_each_record_was():
    """Before: a sweep variant, a manual rollback and a deploy looked alike (config, outcome)."""
    variant = rec("2026-01-01T10:05:00Z", config="ddtree-b15-b32-k8", verdicts=("pass",))
    variant["gates"][0]["gate"] = "smoke"
    manual = rec("2026-01-02T10:05:00Z", outcome="rolled_back", verdicts=("pass",),
                 rollback={"manual": True, "restored": ["sglang-ddtree-b15.service"], "restored_healthy": True})
    manual_failed = rec("2026-01-02T11:05:00Z", outcome="failed", verdicts=(),
                        rollback={"manual": True, "restored": [], "restored_healthy": False})
    recovery = rec("2026-01-03T10:05:00Z", outcome="rolled_back", verdicts=(),
                   rollback={"interrupted_run": "r1", "interrupted_step": "started", "restored": ["u"]})
    automatic = rec("2026-01-04T10:05:00Z", outcome="rolled_back", verdicts=("pass", "pass", "fail"),
                    rollback={"reason": "gate", "restored": ["u"], "restored_healthy": True})
    full = rec("2026-01-05T10:05:00Z", config="ddtree-b15-b32-k8")  # a config of that name, fully gated
    assert [records.what_of(r) for r in (variant, manual, manual_failed, recovery, automatic, full)] == [
        "sweep variant of ddtree-b15 (budget 32, top-k cap 8)",
        "manual rollback to ddtree-b15",
        "manual rollback, failed (what ran before was restored)",
        "recovery of an interrupted switch",
        "deploy, rolled back",
        "deploy",
    ]
    table = records.history_table([variant, manual], every=True).splitlines()
    assert table[0].split() == ["config", "host", "what", "release", "outcome", "gates", "exactness", "watch",
                                "accept", "tok/s", "when"]
    assert "sweep variant of ddtree-b15 (budget 32, top-k cap 8)" in table[1]
    assert "manual rollback to ddtree-b15" in table[2] and " rolled_back " in table[2]


def current(config: str, active: bool = True, healthy: bool | None = True, **kw) -> dict:
    return {"config": config, "unit_name": f"sglang-{config}.service", "release": "ddtree.fork.topk.abcdef12",
            "bind_address": "127.0.0.1", "ports": [30000, 30001], "unit_digest": "d1g3st",
            "deployed": "2026-01-01T10:04:30Z", "active": active, "enabled": active, "healthy": healthy, **kw}


def test_now_shows_what_serves_on_each_host_with_its_last_measured_numbers():
    """Before: the table had history only; what serves now was a debug line per host, without numbers."""
    recs = [rec("2026-01-01T10:05:00Z", accept=14.9, tps=173.4), unchanged("2026-01-03T10:05:00Z"),
            rec("2026-01-02T10:05:00Z", host="lab2", config="ar", accept=1.0, tps=60.0)]
    now = {"lab1": {"deployed": [current("ddtree-b15")], "uncommitted": None},
           "lab2": {"deployed": [current("ar", healthy=False), current("ddtree-b32", active=False, healthy=None)],
                    "uncommitted": {"config": "ddtree-b64", "active": True}},
           "lab3": {"deployed": [], "uncommitted": None},
           "lab4": None}
    rows = records.now_rows(now, recs)
    assert [(r["host"], r["config"], r["state"]) for r in rows] == [
        ("lab1", "ddtree-b15", "serving"),
        ("lab2", "ar", "running, /health does not answer"),
        ("lab2", "ddtree-b32", "NOT RUNNING"),
        ("lab2", "ddtree-b64",
         "uncommitted (an interrupted switch; the next deploy or rollback rolls it back), running"),
        ("lab3", None, "nothing deployed by sgdeploy"),
        ("lab4", None, "UNREACHABLE: what serves there is unknown"),
    ]
    assert (rows[0]["accept_length"], rows[0]["tokens_per_s"], rows[0]["measured"]) == (14.9, 173.4,
                                                                                        "2026-01-01T10:05:00Z")
    assert rows[1]["tokens_per_s"] == 60.0 and rows[2]["tokens_per_s"] is None
    text = records.status_report(recs, now).splitlines()
    assert text[0].startswith("now (what serves on each host")
    assert text[1].split()[:3] == ["host", "serves", "now"]
    assert text[2].split()[:3] == ["lab1", "ddtree-b15", "serving"] and "14.90" in text[2] and "173.4" in text[2]
    history = text.index("history (the newest record of each config on each host):")
    assert history > 7 and text[history + 1].split()[:3] == ["config", "host", "what"]


def test_cli_status_with_the_hosts_state(tmp_path):
    recs = tmp_path / "records"
    records.write_record(recs / "lab1", rec("2026-01-01T10:05:00Z"))
    now = tmp_path / "now"
    now.mkdir()
    (now / "lab1.json").write_text(json.dumps({"deployed": [current("ddtree-b15")], "uncommitted": None}))
    out = cli("status", str(recs), "--now", str(now), "--hosts", "lab1,lab2")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[2].split()[:3] == ["lab1", "ddtree-b15", "serving"]
    assert lines[3].startswith("lab2") and "UNREACHABLE: what serves there is unknown" in lines[3]
    assert not any(line.startswith("localhost") for line in lines)
    data = json.loads(cli("status", str(recs), "--now", str(now), "--hosts", "lab1", "--json").stdout)
    assert [r["state"] for r in data["now"]] == ["serving"] and data["history"][0]["what"] == "deploy"
    (now / "lab1.json").write_text("[")
    bad = cli("status", str(recs), "--now", str(now))
    assert bad.returncode == 2 and f"{now / 'lab1.json'}: not JSON" in bad.stderr and "Traceback" not in bad.stderr


def test_now_shows_an_engine_over_several_hosts_as_one_row_with_its_ranks():
    """Before: each rank of an engine (serving.nnodes 2) was a row of its own, rank 1 as if it were a deploy."""
    recs = [rec("2026-01-01T10:05:00Z", config="k2", accept=3.1, tps=40.0)]
    engine = {"nnodes": 2, "engine_hosts": ["lab2", "lab1"]}
    now = {"lab1": {"deployed": [current("k2", healthy=None, node_rank=1, **engine), current("ddtree-b15")],
                    "uncommitted": None},
           "lab2": {"deployed": [current("k2", node_rank=0, **engine)], "uncommitted": None},
           "lab3": {"deployed": [current("k3", node_rank=0, nnodes=2, engine_hosts=["lab3", "lab4"])],
                    "uncommitted": None},
           "lab4": None}
    rows = records.now_rows(now, [{**r, "host": "lab2"} for r in recs])
    assert [(r["host"], r["config"], r["state"]) for r in rows] == [
        ("lab2,lab1", "k2", "serving"),  # rank 0 first
        ("lab1", "ddtree-b15", "serving"),
        ("lab3", "k3", "serving; rank 1 (lab4) not found"),
        ("lab4", None, "UNREACHABLE: what serves there is unknown"),
    ]
    assert rows[0]["ranks"] == [{"host": "lab2", "rank": 0, "state": "serving"},
                                {"host": "lab1", "rank": 1, "state": "running"}]
    assert rows[0]["tokens_per_s"] == 40.0  # rank 0's numbers
    now["lab1"]["deployed"][0] |= {"active": False}
    assert records.now_rows(now, recs)[0]["state"] == "serving; rank 1 (lab1) NOT RUNNING"
    text = records.status_report(recs, now).splitlines()
    assert text[2].split()[:3] == ["lab2,lab1", "k2", "serving;"]
