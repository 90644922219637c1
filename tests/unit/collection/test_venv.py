"""module_utils/sglang_venv: the pinned venv the router and hub install modules keep (one implementation)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "collections"))
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_venv as venv  # noqa: E402

PROBE = ["-c", "print('1.2.3')"]
RECORD = {"version": "1.2.3", "wheel_sha256": "ab" * 32}


def test_a_venv_is_current_only_with_its_record_and_a_probe_that_answers_the_pin(tmp_path):
    v, rec = tmp_path / "venv", tmp_path / "r.json"
    assert not venv.is_current(str(v), str(rec), RECORD, PROBE, "1.2.3")  # nothing there
    (v / "bin").mkdir(parents=True)
    (v / "bin" / "python").symlink_to(sys.executable)
    assert not venv.is_current(str(v), str(rec), RECORD, PROBE, "1.2.3")  # no record
    rec.write_text(json.dumps(RECORD))
    assert venv.is_current(str(v), str(rec), RECORD, PROBE, "1.2.3")
    assert not venv.is_current(str(v), str(rec), {**RECORD, "version": "1.2.4"}, PROBE, "1.2.3")  # another pin
    assert not venv.is_current(str(v), str(rec), RECORD, PROBE, "1.2.4")  # the probe says otherwise
    rec.write_text("{not json")
    assert not venv.is_current(str(v), str(rec), RECORD, PROBE, "1.2.3")


def test_a_failed_step_names_itself_and_writes_no_record(tmp_path):
    v, rec = tmp_path / "root" / "venv", tmp_path / "root" / "r.json"
    with pytest.raises(venv.VenvError, match=r"^python -m venv failed \(exit 1\)"):
        venv.make("/bin/false", str(v), ["x.whl"], "pip install of the wheel", str(rec), RECORD, PROBE, "1.2.3",
                  "run the thing 1.2.3")
    assert not rec.exists()
    # A real venv, then pip fails offline on a wheel that is not there: named, the old venv gone, no record.
    with pytest.raises(venv.VenvError, match=r"^pip install of the wheel failed \(exit [1-9]"):
        venv.make(sys.executable, str(v), [str(tmp_path / "missing-1.0-py3-none-any.whl")],
                  "pip install of the wheel", str(rec), RECORD, PROBE, "1.2.3", "run the thing 1.2.3")
    assert not rec.exists() and (v / "bin" / "python").exists()


def test_the_record_is_written_only_after_the_probe_answers_the_pin(tmp_path, monkeypatch):
    v, rec = tmp_path / "venv", tmp_path / "r.json"
    calls = []

    def fake_run(cmd):
        calls.append(cmd)
        return (0, "9.9.9" if "-c" in cmd else "", "")

    monkeypatch.setattr(venv, "run", fake_run)
    with pytest.raises(venv.VenvError, match=r"^the venv does not run the thing 1\.2\.3: 9\.9\.9$"):
        venv.make("/usr/bin/python3", str(v), ["--find-links", "w", "-r", "req.txt"], "pip install", str(rec), RECORD,
                  PROBE, "1.2.3", "run the thing 1.2.3")
    assert not rec.exists()
    assert calls[0] == ["/usr/bin/python3", "-m", "venv", str(v)]
    assert calls[1][-4:] == ["--find-links", "w", "-r", "req.txt"] and "--no-index" in calls[1]
    monkeypatch.setattr(venv, "run", lambda cmd: (0, "1.2.3" if "-c" in cmd else "", ""))
    venv.make("/usr/bin/python3", str(v), ["x.whl"], "pip install", str(rec), RECORD, PROBE, "1.2.3", "run it")
    assert json.loads(rec.read_text()) == RECORD and (rec.stat().st_mode & 0o777) == 0o644
