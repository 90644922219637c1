"""The collection's controller-side action plugins sgdeploy.host.controller_wheel and controller_model_pack
(issue 35, "one crossing"): plays get the wheel of a config in-process, exactly what
``sgdeploy wheel --config ... --json`` prints, and pack a controller model folder with the same function as
``python -m sgdeploy.models pack``; a bad input fails the task with its one line, no traceback.

The success case uses the config ``ar`` (no patch features: the pristine wheel, label ``stock``): once built in
build/wheels (about 10 s, the pristine wheel is the one tests/unit/series/test_wheel.py downloads) it is found.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

from sgdeploy import wheel

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent


def play(tmp_path: Path, tasks: list[dict], *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    """Run `tasks` on localhost from tmp_path (not the checkout), registering each task as r<i> (errors
    ignored); returns the run and the registered results."""
    dump = tmp_path / "results.json"
    tasks = [dict(t, register=f"r{i}", ignore_errors=True) for i, t in enumerate(tasks)]
    names = ", ".join(f"'r{i}': r{i}" for i in range(len(tasks)))
    tasks.append({"name": "Keep them", "ansible.builtin.copy": {"content": "{{ {" + names + "} | to_json }}",
                                                                "dest": str(dump)}, "check_mode": False})
    path = tmp_path / "play.yml"
    path.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default", ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e",
                           f"ansible_python_interpreter={sys.executable}", *extra, str(path)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    return proc, json.loads(dump.read_text())


def cli_json(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "sgdeploy.wheel", *args, "--json"], cwd=REPO, capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_the_in_process_wheel_is_what_wheel_json_prints(tmp_path):
    cli = cli_json("--config", "ar", "--python", "3.11")  # builds it when build/wheels lacks it
    build = {"sgdeploy.host.controller_wheel": {"config": "ar", "chdir": str(REPO), "python": "3.11"},
             "delegate_to": "localhost"}
    _, got = play(tmp_path, [
        build,
        # A relative path is taken from chdir, not from where ansible-playbook runs (tmp_path here).
        {"sgdeploy.host.controller_wheel": {"config": "configs/ar.yml", "chdir": str(REPO), "python": "3.11"}},
        dict(build, check_mode=True),
    ])
    found = dict(cli, built=False)
    for result in got.values():
        assert not result.get("failed"), result
        assert {k: result[k] for k in found} == found
        assert result["changed"] is False and result["log"] == []  # found, not built
    assert found["label"] == "stock" and found["patches"] == [] and found["features"] == []
    assert found["wheel"] == str(wheel.DEFAULT_OUT / "sglang-0.5.23+stock-cp311-cp311-manylinux_2_34_x86_64.whl")


def cli_error(*args: str) -> str:
    """The one line `sgdeploy wheel` prints for an error, as the plays showed it (without `error: `)."""
    proc = subprocess.run([sys.executable, "-m", "sgdeploy.wheel", *args, "--json"], cwd=REPO, capture_output=True,
                          text=True, check=False)
    assert proc.returncode != 0
    return proc.stderr.strip().splitlines()[-1].removeprefix("error: ")


def test_bad_inputs_fail_the_task_with_the_line_the_command_printed(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("extends: ddtree-b15\nserving: {replicas: 0}\n")
    proc, got = play(tmp_path, [
        {"sgdeploy.host.controller_wheel": {"config": "bad.yml", "chdir": str(tmp_path), "python": "3.11"}},
        {"sgdeploy.host.controller_wheel": {"config": "ar", "chdir": str(REPO), "python": "3.9"}},
        {"sgdeploy.host.controller_wheel": {"config": "no-such-config", "chdir": str(REPO), "python": "3.11"}},
        {"sgdeploy.host.controller_wheel": {"config": "ar", "chdir": str(REPO)}},
    ])
    assert got["r0"]["failed"] and got["r0"]["msg"] == cli_error("--config", str(bad), "--python", "3.11")
    assert got["r0"]["msg"].startswith(f"{bad}: serving.replicas: 0: must be between 1 and 64")
    assert got["r1"]["failed"] and got["r1"]["msg"] == cli_error("--config", "ar", "--python", "3.9") == (
        f"--python 3.9: no pinned sglang 0.5.23 wheel in {wheel.DEFAULT_PINS} "
        f"(allowed: {', '.join(sorted(wheel.load_pins().wheels))})")
    assert got["r2"]["failed"] and got["r2"]["msg"] == cli_error("--config", "no-such-config", "--python", "3.11")
    assert got["r2"]["msg"].startswith("no-such-config: no config of that name in ")
    assert got["r3"]["failed"] and "missing required arguments: python" in got["r3"]["msg"]
    assert all("\n" not in r["msg"] and not r.get("changed") for r in got.values())


def test_pack_tars_a_controller_folder_once_and_never_in_check_mode(tmp_path):
    src = tmp_path / "model"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "sub" / "weights.bin").write_bytes(b"\0" * 100)
    out = tmp_path / "cache" / "model-0123.tar"
    pack = {"sgdeploy.host.controller_model_pack": {"src": str(src), "out": str(out)}}
    _, got = play(tmp_path, [dict(pack, check_mode=True), pack, pack,
                             {"sgdeploy.host.controller_model_pack": {"src": str(tmp_path / "nope"), "out": str(out)}}])
    assert got["r0"]["packed"] is False and got["r0"]["tar"] == str(out)  # check mode: nothing written ...
    assert got["r1"]["packed"] is True and got["r2"]["packed"] is False   # ... then written once
    assert not any(r.get("changed") for r in got.values())  # a controller cache, never a change
    assert got["r3"]["failed"] and got["r3"]["msg"] == f"src: {tmp_path / 'nope'}: no such folder"
    with tarfile.open(out) as tar:
        members = {m.name: (m.uname, m.uid, m.mode, m.size) for m in tar.getmembers()}
    assert members == {"config.json": ("root", 0, 0o644, 2), "sub/weights.bin": ("root", 0, 0o644, 100)}
    cli = tmp_path / "cli.tar"
    subprocess.run([sys.executable, "-m", "sgdeploy.models", "pack", "--src", str(src), "--out", str(cli)],
                   cwd=REPO, check=True, capture_output=True)
    assert cli.read_bytes() == out.read_bytes()  # the same function as the command line's
