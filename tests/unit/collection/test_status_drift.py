"""`make status` names files edited by hand since their deploy (issue 34 item 5): sglang_deploy_status gives each
deployed config a ``drift`` list from installed_drift, which judges the installed unit and env file by the digests,
modes and owners the deploy's commit recorded in current.json."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "collections"))

from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_plan import installed_drift  # noqa: E402


def deployed_files(tmp_path):
    unit_dir, env_dir = tmp_path / "units", tmp_path / "env"
    unit_dir.mkdir()
    env_dir.mkdir()
    unit = unit_dir / "sglang-x.service"
    unit.write_text("[Service]\nNoNewPrivileges=yes\nProtectSystem=strict\n")
    unit.chmod(0o644)
    env = env_dir / "x.env"
    env.write_text("A=1\n")
    env.chmod(0o640)
    current = {"config": "x", "unit_name": "sglang-x.service", "env_file": str(env),
               "unit_sha256": hashlib.sha256(unit.read_bytes()).hexdigest(),
               "env_sha256": hashlib.sha256(env.read_bytes()).hexdigest()}
    return current, unit, env, str(unit_dir)


@pytest.mark.skipif(os.getuid() != 0, reason="a deploy installs root:root files; as another user every file differs")
def test_files_as_deployed_have_no_drift(tmp_path):
    current, _, _, unit_dir = deployed_files(tmp_path)
    assert installed_drift(current, unit_dir) == []


def test_a_hand_edited_unit_and_a_loosened_env_file_are_named(tmp_path):
    current, unit, env, unit_dir = deployed_files(tmp_path)
    unit.write_text(unit.read_text().replace("NoNewPrivileges=yes", "NoNewPrivileges=no"))
    env.chmod(0o644)
    found = installed_drift(current, unit_dir)
    assert f"{unit}: hand-edited (its digest differs from the deployed unit's)" in found[0]
    assert any(line.startswith(f"{env}: ") and "mode 0644, expected 0640" in line for line in found), found


def test_a_removed_unit_is_named_missing(tmp_path):
    current, unit, _, unit_dir = deployed_files(tmp_path)
    unit.unlink()
    assert f"{unit}: missing" in installed_drift(current, unit_dir)


def test_the_status_entry_point_prints_drift_as_edited_by_hand():
    text = (Path(__file__).resolve().parents[3] / "collections" / "ansible_collections" / "sgdeploy" / "host" / "roles"
            / "sglang_deploy" / "tasks" / "status.yml").read_text()
    assert "DRIFT: {{ item.config }}" in text and "edited by hand since its" in text
