"""Issue 33 item 4: `make plan` (check mode) diffs the new unit and env file against the installed ones
it replaces, never shows a secret value, and judges a secret-only change without writing on the host."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "collections"))

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_plan as planmod  # noqa: E402
from test_host_modules import deploy_of, host, put_running  # noqa: E402, F401  (host is a fixture)

OLD_ENV = '# env\nSGLANG_LOG="info"\nHF_TOKEN="hf_old_value"\n'


def test_the_unit_is_diffed_against_the_replaced_configs_installed_unit(host):  # noqa: F811
    paths, fake = host
    put_running(paths, fake, "b15", "[Service]\nExecStart=x --budget 15\n")
    Path(paths.env("b15")).write_text(OLD_ENV)
    new = deploy_of("b32")
    out = planmod.plan(new, 8, paths.state_dir, sockets=[], env_dir=paths.env_dir)
    assert out["replaces"] == ["b15"]
    diffs = planmod.plan_diff(new, out, paths.unit_dir, paths.env_dir, "[Service]\nExecStart=x --budget 32\n",
                              '# env\nSGLANG_LOG="info"\nHF_TOKEN="hf_old_value"\n', ["HF_TOKEN"])
    unit = diffs[0]
    assert unit["before_header"] == paths.unit("sglang-b15.service")
    assert unit["after_header"] == paths.unit("sglang-b32.service")
    assert "--budget 15" in unit["before"] and "--budget 32" in unit["after"]


def test_the_env_diff_shows_names_and_which_secret_changed_never_a_value(host):  # noqa: F811
    paths, fake = host
    put_running(paths, fake, "cfg", "[Service]\n")
    Path(paths.env("cfg")).write_text(OLD_ENV)
    new = deploy_of("cfg", digest="d-cfg", release="r-old")
    text = '# env\nSGLANG_LOG="debug"\nHF_TOKEN="hf_new_value"\n'
    out = planmod.plan(new, 8, paths.state_dir, sockets=[], env_dir=paths.env_dir, env_text=text)
    assert out["unchanged"] is False and out["env_changed"] is True
    diffs = planmod.plan_diff(new, out, paths.unit_dir, paths.env_dir, "[Service]\n", text, ["HF_TOKEN"])
    assert len(diffs) == 1  # the unit is the same
    env = diffs[0]
    assert 'SGLANG_LOG="info"' in env["before"] and 'SGLANG_LOG="debug"' in env["after"]
    assert "HF_TOKEN=<secret>" in env["before"] and "HF_TOKEN=<secret, changed>" in env["after"]
    assert "hf_" not in json.dumps(diffs) + json.dumps(out)


def test_check_mode_sees_that_nothing_changes_from_the_text_rendered_in_memory(host):  # noqa: F811
    paths, fake = host
    put_running(paths, fake, "cfg", "[Service]\n")
    Path(paths.env("cfg")).write_text(OLD_ENV)
    same = deploy_of("cfg", digest="d-cfg", release="r-old")
    out = planmod.plan(same, 8, paths.state_dir, sockets=[], env_dir=paths.env_dir, env_text=OLD_ENV)
    assert out["unchanged"] is True


def test_a_key_only_in_the_installed_file_is_redacted():
    text = planmod.redacted_env('A="1"\nOLD_SECRET="x"\n', set(), {"A"})
    assert text == 'A="1"\nOLD_SECRET=<secret>\n'
