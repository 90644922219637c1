"""Config strings that must never reach a unit or a shell, typed into the real `make` targets (issue 20).

Each is refused on the controller before any host is touched: exit 2, one line naming the field or
variable and its value, no traceback, the command in the string never runs (no /tmp/pwned on the
controller or a host), and the lab host's units, files and processes are as they were. The same
rules have unit tests (tests/unit/tool/test_makefile.py, test_spec.py, test_render.py); this runs them
end to end against the lab's inventory.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from test_deploy import HOST_FILES

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
PWNED = "/tmp/pwned"
TARGETS = ("config", "validate", "deploy")
HOST_STATE = HOST_FILES + ("; for u in $(systemctl list-units 'sglang-*' --all --no-legend --plain | cut -d' ' -f1); "
                           "do systemctl show -p Id,MainPID,ActiveState $u; done")


def make(lab, target: str, config: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in lab.ansible_env().items() if not k.startswith(("MAKE", "MFLAGS"))}
    env.pop("CONFIG", None)
    return subprocess.run(["make", "-s", "--no-print-directory", target, f"CONFIG={config}",
                           f"INVENTORY={lab.inventory}", "LIMIT=lab1"], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=300, check=False)


def refused(lab, target: str, config: str) -> str:
    """Run the target and check the refusal; returns its one line."""
    proc = make(lab, target, config)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, (target, out)
    assert "Traceback" not in out and "PLAY" not in out, (target, out)
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("make: ***")]
    assert len(lines) == 1 and proc.stdout == "", (target, out)
    assert not os.path.exists(PWNED), f"make {target} CONFIG={config!r} ran the command"
    return lines[0]


@pytest.fixture
def host_unchanged(lab):
    """Nothing of /tmp/pwned anywhere before; afterwards neither, and lab1 is as it was."""
    for host in lab.hosts:
        lab.ssh(host, f"rm -f {PWNED}")
    if os.path.exists(PWNED):
        os.unlink(PWNED)
    before = lab.ssh("lab1", HOST_STATE).stdout
    yield
    assert not os.path.exists(PWNED)
    for host in lab.hosts:
        assert lab.ssh(host, f"test -e {PWNED}", check=False).returncode != 0, host
    assert lab.ssh("lab1", HOST_STATE).stdout == before


@pytest.mark.parametrize("value", [f"ddtree-b15;touch {PWNED}", f"ddtree-b15`touch {PWNED}`",
                                   f"ddtree-b15$(touch {PWNED})"], ids=["semicolon", "backticks", "dollar-paren"])
def test_a_config_name_with_shell_syntax_is_refused_by_make(lab, host_unchanged, value):
    for target in TARGETS:
        line = refused(lab, target, value)
        assert line.startswith(f"CONFIG='{value}' is not allowed: use a config name from configs/ "), line
        assert "or the path of a .yml/.yaml file" in line, line


def test_a_description_with_unit_lines_is_refused_by_make(lab, host_unchanged, tmp_path):
    config = tmp_path / "evil-description.yml"
    config.write_text('extends: ddtree-b15\ndescription: "x\\n[Service]\\nExecStartPre=+/bin/touch /tmp/pwned"\n')
    for target in TARGETS:
        line = refused(lab, target, str(config))
        assert line.startswith(f"{config}: description: 'x\\n[Service]\\nExecStartPre=+/bin/touch /tmp/pwned': "), line
        assert "one line of printable text, without newline" in line and "(found '\\n')" in line, line


def test_ansible_playbook_under_limit_refuses_the_description_in_one_message(lab, host_unchanged, tmp_path):
    """Without make, under --limit (the controller's check play does not run then): the deploy play stops on
    the renderer's one line, before any host task."""
    config = tmp_path / "evil-description.yml"
    config.write_text('extends: ddtree-b15\ndescription: "x\\n[Service]\\nExecStartPre=+/bin/touch /tmp/pwned"\n')
    proc = lab.ansible_playbook("playbooks/deploy.yml", "--limit", "lab1", "-e", f"config={config}", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out[-3000:]
    fatal = [line for line in out.splitlines() if line.startswith("fatal: ")]
    assert len(fatal) == 1, out[-3000:]
    assert '"msg": "' + str(config) + ": description: " in fatal[0], fatal[0]
    assert "one line of printable text, without newline" in fatal[0] and '"rc"' not in fatal[0], fatal[0]


@pytest.mark.parametrize("stem,text,fragment", [
    ("router-31200", "extends: ddtree-b15\n", "name: 'router-31200': names starting with 'router-' are the routers'"),
    ("n" * 250, "extends: ddtree-b15\n", "at most 200 characters (250 given)"),
    ("tp-abbrev", "extends: ddtree-b15\nserving: {extra_args: ['--tp', '4']}\n",
     "serving.extra_args[0]: '--tp': --tp (SGLang reads it as --tp-size) is set from the config's own fields"),
    ("api-key-argv", "extends: ddtree-b15\nserving: {extra_args: ['--api-key=s3cret']}\n",
     "serving.extra_args[0]: '--api-key=s3cret': --api-key: a secret never goes on the command line"),
    ("ld-preload", "extends: ddtree-b15\nserving: {env: {LD_PRELOAD: /tmp/x.so}}\n",
     "serving.env.LD_PRELOAD: '/tmp/x.so': LD_PRELOAD may not be set in serving.env"),
], ids=["router-unit-name", "name-250", "tp-abbreviation", "api-key-in-argv", "ld-preload"])
def test_inputs_that_would_take_over_a_unit_or_the_engine_are_refused_by_make(lab, host_unchanged, tmp_path, stem,
                                                                              text, fragment):
    """Issue 34: a config named router-<port> (its unit would replace the router's), a name too long for a unit
    (the deploy died with an OSError traceback), a managed flag by abbreviation, the API key in argv, the
    loader's LD_PRELOAD: exit 2, one line, before any host is touched."""
    config = tmp_path / f"{stem}.yml"
    config.write_text(text)
    for target in TARGETS:
        line = refused(lab, target, str(config))
        assert line.startswith(f"{config}: ") and fragment in line, line
