"""Issue 34 item 5: drift is found and undone; no secret is kept in the deploy state.

A unit or env file edited by hand on the host is a change (the plan says which file and what, by
setting and variable names only); previous.json keeps the env file's non-secret part and a digest,
never a secret value; an interrupted run's staging folder is removed by the run that recovers it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "collections"))

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_files as files  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_plan as planmod  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_txn as txn  # noqa: E402
from test_host_modules import deploy_of, host  # noqa: E402, F401  (host is a fixture)

UNIT = "[Service]\nNoNewPrivileges=yes\nProtectSystem=strict\nExecStart=/venv/bin/python -m sglang --port 30000\n"
ENV = '# env\nSGLANG_X="1"\nHF_TOKEN="tok-old"\n'
OWNER = (os.getuid(), os.getgid())


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def committed(paths, fake, unit=UNIT, env=ENV):
    """cfg runs, committed with the digests of its files (0644 unit, 0640 env file)."""
    Path(paths.unit("sglang-cfg.service")).write_text(unit)
    os.chmod(paths.unit("sglang-cfg.service"), 0o644)
    Path(paths.env("cfg")).write_text(env)
    os.chmod(paths.env("cfg"), 0o640)
    current = deploy_of("cfg", digest="d-cfg", release="r-old")
    current["unit_digest"] = current.pop("digest")
    current.update(unit_sha256=sha(unit), env_sha256=sha(env))
    files.write_json(paths.current("cfg"), current)
    fake.active.add("sglang-cfg.service")
    fake.enabled.add("sglang-cfg.service")


def plan_same(paths, tmp_path, staged=ENV, unit_text=UNIT):
    env_src = tmp_path / "run.env"
    env_src.write_text(staged)
    return planmod.plan(deploy_of("cfg", digest="d-cfg", release="r-old"), 8, paths.state_dir, sockets=[],
                        env_src=str(env_src), env_dir=paths.env_dir, unit_dir=paths.unit_dir, unit_text=unit_text,
                        env_gid=OWNER[1], root=OWNER)


def test_files_as_deployed_are_unchanged(host, tmp_path):  # noqa: F811
    paths, fake = host
    committed(paths, fake)
    out = plan_same(paths, tmp_path)
    assert out["unchanged"] is True and out["drift"] == []


def test_a_hand_edited_unit_is_drift_named_by_its_settings_not_values(host, tmp_path):  # noqa: F811
    paths, fake = host
    committed(paths, fake)
    edited = UNIT.replace("NoNewPrivileges=yes", "NoNewPrivileges=no").replace("strict", "no").replace(
        "--port 30000", "--port 30000 --trust-remote-code --api-key hunter2")
    Path(paths.unit("sglang-cfg.service")).write_text(edited)
    out = plan_same(paths, tmp_path)
    assert out["unchanged"] is False and out["stop_units"] == ["sglang-cfg.service"]
    unit = paths.unit("sglang-cfg.service")
    what = "hand-edited (ExecStart, NoNewPrivileges, ProtectSystem differ from the rendered unit)"
    assert out["drift"] == [f"{unit}: {what}"]
    assert "hunter2" not in json.dumps(out)


def test_a_hand_edited_unit_is_found_by_its_digest_when_the_deploy_renders_another(host, tmp_path):  # noqa: F811
    paths, fake = host
    committed(paths, fake)
    Path(paths.unit("sglang-cfg.service")).write_text(UNIT + "Environment=X=1\n")
    other = deploy_of("cfg", digest="d-other", release="r-old")
    out = planmod.plan(other, 8, paths.state_dir, sockets=[], env_dir=paths.env_dir, unit_dir=paths.unit_dir,
                       unit_text="[Service]\n", env_gid=OWNER[1], root=OWNER)
    unit = paths.unit("sglang-cfg.service")
    assert out["drift"] == [f"{unit}: hand-edited (its digest differs from the deployed unit's)"]


def test_an_env_file_made_0644_is_drift(host, tmp_path):  # noqa: F811
    paths, fake = host
    committed(paths, fake)
    os.chmod(paths.env("cfg"), 0o644)
    out = plan_same(paths, tmp_path)
    assert out["unchanged"] is False
    assert out["drift"] == [f"{paths.env('cfg')}: mode 0644, expected 0640"]


def test_a_hand_edited_env_file_is_drift_a_rotated_secret_is_a_change(host, tmp_path):  # noqa: F811
    paths, fake = host
    committed(paths, fake)
    rotated = plan_same(paths, tmp_path, staged=ENV.replace("tok-old", "tok-new"))
    assert rotated["unchanged"] is False and rotated["env_changed"] is True and rotated["drift"] == []
    Path(paths.env("cfg")).write_text(ENV.replace('"1"', '"2"').replace("tok-old", "tok-hand"))
    out = plan_same(paths, tmp_path)
    env = paths.env("cfg")
    assert out["drift"] == [f"{env}: hand-edited (variables HF_TOKEN, SGLANG_X differ from the rendered file)"]
    assert "tok-" not in json.dumps(out)


def test_a_missing_unit_is_drift(host, tmp_path):  # noqa: F811
    paths, fake = host
    committed(paths, fake)
    os.unlink(paths.unit("sglang-cfg.service"))
    assert plan_same(paths, tmp_path)["drift"] == [f"{paths.unit('sglang-cfg.service')}: missing"]


def switch_to_new(paths, fake, secret_keys=("HF_TOKEN",)):
    new = deploy_of("cfg", digest="d-new")
    new.update(env_public='# env\nSGLANG_X="1"', secret_keys=list(secret_keys))
    txn.begin(paths, "run-1", new, stop_units=["sglang-cfg.service"])
    txn.install(paths, "run-1", "[Service]\nExecStart=/new\n", '# env\nSGLANG_X="1"\nHF_TOKEN="tok-new"\n', os.getgid())
    txn.start(paths, "run-1")
    return txn.commit(paths, "run-1")


def test_previous_and_current_keep_digests_and_the_non_secret_part_never_a_secret(host):  # noqa: F811
    paths, fake = host
    committed(paths, fake)  # committed before env_public was kept: its text comes from the file, secrets dropped
    switch_to_new(paths, fake)
    previous = json.loads(Path(paths.previous("cfg")).read_text())
    current = json.loads(Path(paths.current("cfg")).read_text())
    assert "tok-" not in Path(paths.previous("cfg")).read_text() + Path(paths.current("cfg")).read_text()
    assert "env_text" not in previous
    assert previous["env_public"] == '# env\nSGLANG_X="1"' and previous["env_sha256"] == sha(ENV)
    assert previous["unit_text"] == UNIT
    assert current["env_public"] == '# env\nSGLANG_X="1"' and current["secret_keys"] == ["HF_TOKEN"]
    assert current["env_sha256"] == sha(Path(paths.env("cfg")).read_text())
    assert current["unit_sha256"] == sha("[Service]\nExecStart=/new\n")


def test_a_previous_json_that_kept_the_env_text_loses_its_secrets_at_the_next_commit(host):  # noqa: F811
    paths, fake = host
    committed(paths, fake)
    files.write_json(paths.previous("cfg"), {"config": "cfg", "unit_text": "[Service]\n", "env_text": ENV})
    new = deploy_of("cfg", digest="d-cfg", release="r-old")  # a redeploy of what runs: previous.json is kept
    new.update(secret_keys=["HF_TOKEN"])
    txn.begin(paths, "run-1", new, stop_units=["sglang-cfg.service"])
    txn.install(paths, "run-1", UNIT, ENV, os.getgid())
    txn.commit(paths, "run-1")
    previous = json.loads(Path(paths.previous("cfg")).read_text())
    assert "env_text" not in previous and "tok-old" not in json.dumps(previous)
    assert previous["env_public"] == '# env\nSGLANG_X="1"' and previous["unit_text"] == "[Service]\n"


def test_the_staging_folders_of_runs_that_are_gone_are_removed(tmp_path):
    for run in ("run-dead", "run-me"):
        (tmp_path / "runs" / run).mkdir(parents=True)
        (tmp_path / "runs" / run / "cfg.env").write_text('HF_TOKEN="x"\n')
    assert txn.remove_stale_runs(str(tmp_path), "run-me") == ["run-dead"]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["run-me"]
    assert txn.remove_stale_runs(str(tmp_path / "absent"), "run-me") == []
