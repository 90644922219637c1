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
    assert list(r) == [*records.KEYS, "exactness", "same_window"]
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
                            "finished", "message", "exactness"}
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
