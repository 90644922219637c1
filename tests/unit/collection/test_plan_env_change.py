"""Issue 20: a secrets-only change (same config, only a value in the env file differs) is a change.

The plan compares the env file rendered on the host for this run with the installed one by digest;
only the verdict comes back, never the digest or the value.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "collections"))

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_plan as planmod  # noqa: E402
from test_host_modules import deploy_of, host, put_running  # noqa: E402, F401  (host is a fixture)


def running_cfg(paths, fake, tmp_path, staged_text):
    put_running(paths, fake, "cfg", "[Service]\n")
    Path(paths.env("cfg")).write_text('SGLANG_X="old-secret"\n')
    staged = tmp_path / "run" / "cfg.env"
    staged.parent.mkdir()
    staged.write_text(staged_text)
    same = deploy_of("cfg", digest="d-cfg", release="r-old")  # the unit and release that run now
    return planmod.plan(same, 8, paths.state_dir, sockets=[], env_src=str(staged), env_dir=paths.env_dir)


def test_the_same_unit_release_and_env_file_is_unchanged(host, tmp_path):  # noqa: F811
    out = running_cfg(*host, tmp_path, 'SGLANG_X="old-secret"\n')
    assert out["unchanged"] is True and out["env_changed"] is False


def test_a_changed_secret_alone_is_a_change_and_the_plan_shows_no_value(host, tmp_path):  # noqa: F811
    out = running_cfg(*host, tmp_path, 'SGLANG_X="new-secret"\n')
    assert out["unchanged"] is False and out["env_changed"] is True
    assert out["stop_units"] == ["sglang-cfg.service"]
    text = json.dumps(out)
    assert "secret" not in text
    assert not any(len(word) == 64 for word in text.replace('"', " ").split())  # no sha256 digest either


def test_without_a_rendered_env_file_check_mode_judges_by_unit_and_release(host, tmp_path):  # noqa: F811
    paths, fake = host
    put_running(paths, fake, "cfg", "[Service]\n")
    out = planmod.plan(deploy_of("cfg", digest="d-cfg", release="r-old"), 8, paths.state_dir, sockets=[],
                       env_src=str(tmp_path / "absent.env"), env_dir=paths.env_dir)
    assert out["unchanged"] is True and out["env_changed"] is False
