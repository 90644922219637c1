"""The one `sgdeploy` command (issue 19): installed by pyproject.toml, every controller entry point
a subcommand, bad input one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sgdeploy import cli, report

REPO = Path(__file__).resolve().parents[3]
SGDEPLOY = Path(sys.executable).parent / "sgdeploy"
SUBCOMMANDS = ("config", "validate", "render", "gate", "tunnel", "hosts", "report", "rules", "wheel", "sweep", "bench",
               "records")


def sgdeploy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SGDEPLOY), *args], capture_output=True, text=True, cwd=REPO, check=False, timeout=120)


def test_pyproject_builds_and_installs_the_command():
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert data["build-system"]["build-backend"] == "setuptools.build_meta"
    assert data["project"]["scripts"] == {"sgdeploy": "sgdeploy.cli:main"}
    assert SGDEPLOY.is_file(), f"{SGDEPLOY}: `make setup` installs the sgdeploy command"


def test_help_lists_every_subcommand():
    result = sgdeploy("--help")
    assert result.returncode == 0, result.stderr
    listed = {line.split()[0] for line in result.stdout.splitlines() if line.startswith("    ") and line.split()}
    assert set(SUBCOMMANDS) <= listed, result.stdout


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_each_subcommand_has_help(sub, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([sub, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and "--" in out


def test_a_wrong_subcommand_or_argument_is_one_line_exit_2():
    result = sgdeploy("deploy-everything")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("sgdeploy: ")
    assert "invalid choice: 'deploy-everything'" in result.stderr
    result = sgdeploy("render")
    assert result.returncode == 2 and result.stderr.strip() == (
        "sgdeploy render: the following arguments are required: config")


def test_delegated_subcommands_run_the_modules_own_command_line(monkeypatch):
    seen = []
    for name, (module, _help) in cli.DELEGATED.items():
        monkeypatch.setattr(f"sgdeploy.{module}.main", lambda argv, _n=name: seen.append((_n, argv)) or 7)
    assert cli.main(["sweep", "--config", "ddtree-b15", "--budgets", "8 15"]) == 7
    assert cli.main(["wheel", "--features", "ddtree"]) == 7
    assert seen == [("sweep", ["--config", "ddtree-b15", "--budgets", "8 15"]), ("wheel", ["--features", "ddtree"])]


def test_python_dash_m_sgdeploy_is_the_same_command():
    result = subprocess.run([sys.executable, "-m", "sgdeploy", "validate", "ar"], capture_output=True, text=True,
                            cwd=REPO, check=False)
    assert result.returncode == 0 and result.stdout.strip() == "1 config(s) valid: ar"


def _results(tmp_path: Path) -> Path:
    rows = [report.variant_row(b, 8, accept_length_mean=a, tokens_per_s=t)
            for b, a, t in ((8, 4.0, 100.0), (15, 5.0, 110.0), (32, 2.0, 90.0))]
    results = report.build_results(config="ddtree-b15", host="lab1", started="s", finished="f", variants=rows)
    (tmp_path / "results.json").write_text(json.dumps(results))
    return tmp_path


def test_report_rewrites_the_markdown_and_the_plot(tmp_path):
    folder = _results(tmp_path)
    result = sgdeploy("report", str(folder))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(folder / "results.md"), str(folder / "sweep.png")]
    assert "15" in (folder / "results.md").read_text()
    assert (folder / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_of_something_else_is_refused(tmp_path):
    (tmp_path / "results.json").write_text('{"schema": 9}')
    result = sgdeploy("report", str(tmp_path))
    assert result.returncode == 2 and "not a sweep report" in result.stderr and "Traceback" not in result.stderr


def test_tunnel_without_such_a_host_is_refused(tmp_path):
    inventory = tmp_path / "inv.yml"
    inventory.write_text("all:\n  children:\n    gpu_hosts:\n      hosts:\n        a: {ansible_host: 127.0.0.9}\n")
    result = sgdeploy("tunnel", "ddtree-b15", "--inventory", str(inventory), "--host", "nope")
    assert result.returncode == 2 and result.stderr.startswith("sgdeploy tunnel: ") and "nope" in result.stderr


def test_tunnel_refuses_an_ssh_option_it_cannot_honour_before_connecting(tmp_path):
    """Issue 35: the tunnel honours the inventory's SSH settings; one it cannot is named, with the host."""
    inventory = tmp_path / "inv.yml"
    inventory.write_text("all:\n  children:\n    gpu_hosts:\n      hosts:\n        a: {ansible_host: 127.0.0.9, "
                         "ansible_ssh_common_args: '-o ProxyJump=bastion -o Ciphers=aes128-ctr'}\n")
    result = sgdeploy("tunnel", "ddtree-b15", "--inventory", str(inventory), "--host", "a")
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(f"sgdeploy tunnel: --inventory {inventory}: host a: ansible_ssh_common_args: "
                                    "ssh option -o Ciphers=aes128-ctr cannot be honoured"), result.stderr


def test_version_is_the_packages():
    """Before: `sgdeploy --version` was refused (exit 2)."""
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    result = sgdeploy("--version")
    assert result.returncode == 0 and result.stdout == f"sgdeploy {version}\n", (result.stdout, result.stderr)
    import sgdeploy as package

    assert package.__version__ == version


# --- sgdeploy hosts: the hosts a play on gpu_hosts would target, or one line and exit 2 (issue 33) -------

INVENTORY = """all:
  children:
    gpu_hosts:
      hosts:
        gpu-01: {ansible_host: 127.0.0.9}
        gpu-02: {ansible_host: 127.0.0.10}
    other:
      hosts:
        bastion: {}
"""


def inventory(tmp_path: Path, text: str = INVENTORY, name: str = "inv.yml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def refused(result: subprocess.CompletedProcess, sub: str = "hosts") -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == "" and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"sgdeploy {sub}: ")
    return result.stderr.strip().removeprefix(f"sgdeploy {sub}: ")


def test_hosts_lists_what_a_play_on_gpu_hosts_targets(tmp_path):
    inv = inventory(tmp_path)
    assert sgdeploy("hosts", "--inventory", inv).stdout.split() == ["gpu-01", "gpu-02"]
    assert sgdeploy("hosts", "--inventory", inv, "--limit", "gpu-0*:!gpu-01").stdout.split() == ["gpu-02"]
    quiet = sgdeploy("hosts", "--inventory", inv, "--limit", "gpu-02", "-q")
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""


def test_hosts_refuses_a_missing_or_unparsable_inventory(tmp_path):
    missing = tmp_path / "prod.yml"
    assert refused(sgdeploy("hosts", "--inventory", str(missing))) == (
        f"inventory {missing}: no such file or folder; give an Ansible inventory that lists the hosts in group "
        "gpu_hosts, as inventory/example.yml does")
    bad = inventory(tmp_path, "all:\n  children: {gpu_hosts: {hosts: {a: {}}}\n")
    line = refused(sgdeploy("hosts", "--inventory", bad))
    assert line.startswith(f"inventory {bad}: Ansible cannot parse it: YAML parsing failed: ") and f"({bad}:" in line
    ini = inventory(tmp_path, "[gpu_hosts\nfoo bar = =\n", "inv.ini")
    assert refused(sgdeploy("hosts", "--inventory", ini)).startswith(
        f"inventory {ini}: Ansible cannot parse it: Failed to parse inventory: ")


def test_hosts_refuses_an_inventory_without_gpu_hosts(tmp_path):
    inv = inventory(tmp_path, "all:\n  hosts:\n    gpu-01: {}\n")
    assert refused(sgdeploy("hosts", "--inventory", inv)) == (
        f"inventory {inv}: group gpu_hosts has no host; give an Ansible inventory that lists the hosts in group "
        "gpu_hosts, as inventory/example.yml does")


@pytest.mark.parametrize("limit, message", [
    ("gpu-9", "limit 'gpu-9' matches no host in {inv} (hosts of gpu_hosts there: gpu-01, gpu-02)"),
    ("gpu-01,gpu-9", "limit 'gpu-01,gpu-9': 'gpu-9' matches no host in {inv} (hosts of gpu_hosts there: gpu-01, "
                     "gpu-02)"),
    ("bastion", "limit 'bastion' matches no host of group gpu_hosts in {inv} (hosts of gpu_hosts there: gpu-01, "
                "gpu-02)"),
])
def test_hosts_refuses_a_limit_that_matches_nothing(tmp_path, limit, message):
    inv = inventory(tmp_path)
    assert refused(sgdeploy("hosts", "--inventory", inv, "--limit", limit)) == message.format(inv=inv)


def test_gate_names_an_unparsable_inventory(tmp_path):
    """Before: `group gpu_hosts has no hosts` (Ansible parsed nothing and said so only in a warning)."""
    bad = inventory(tmp_path, "- gpu-01\n")
    line = refused(sgdeploy("gate", "ddtree-b15", "--inventory", bad), "gate")
    assert line == (f"inventory {bad}: Ansible cannot parse it: YAML inventory has invalid structure, it should be a "
                    "dictionary, got: a list")


def test_sweep_names_an_unparsable_inventory_and_a_host_outside_gpu_hosts(tmp_path):
    """Before: `group gpu_hosts has no hosts` for an inventory Ansible could not parse."""
    bad = inventory(tmp_path, "- gpu-01\n")
    line = refused(sgdeploy("sweep", "--config", "ddtree-b15", "--inventory", bad), "sweep")
    assert line.startswith(f"inventory {bad}: Ansible cannot parse it: "), line
    inv = inventory(tmp_path)
    line = refused(sgdeploy("sweep", "--config", "ddtree-b15", "--inventory", inv, "--host", "bastion"), "sweep")
    assert line.startswith(f"--host 'bastion' matches no host of group gpu_hosts in {inv}"), line
