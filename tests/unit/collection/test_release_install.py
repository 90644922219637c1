"""sgdeploy.host.sglang_release_install, run the way Ansible runs it on a host: what it refuses (a wheel without
the label, a digest other than the build's, another Python), check mode, and a real install that a second run
leaves alone. The module's main was one 131-line function (issue 35); these tests hold its behaviour."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import platform
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

COLLECTIONS = Path(__file__).resolve().parents[3] / "collections"
MODULE = COLLECTIONS / "ansible_collections/sgdeploy/host/plugins/modules/sglang_release_install.py"
LABEL = "0a1b2c3d4e5f"
PYTAG = f"cp{sys.version_info.major}{sys.version_info.minor}"


def make_wheel(folder: Path, label: str = LABEL, pytag: str = PYTAG) -> Path:
    """A minimal valid wheel of a distribution named sglang (one module), installable offline."""
    version = f"0.5.23+{label}"
    path = folder / f"sglang-{version}-{pytag}-{pytag}-linux_{platform.machine()}.whl"
    dist = f"sglang-{version}.dist-info"
    files = {
        "sglang_standin_probe.py": b"VALUE = 1\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {pytag}-{pytag}-"
                         f"linux_{platform.machine()}\n".encode(),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return path


def run_module(args: dict, tmp_path: Path, check_mode: bool = False) -> tuple[int, dict]:
    args_file = tmp_path / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=check_mode)}))
    env = dict(os.environ, PYTHONPATH=str(COLLECTIONS))
    proc = subprocess.run([sys.executable, str(MODULE), str(args_file)], capture_output=True, text=True, env=env,
                          check=False, timeout=300)
    try:
        return proc.returncode, json.loads(proc.stdout)
    except ValueError:
        raise AssertionError(f"no JSON result: {proc.stdout}\n{proc.stderr}") from None


def args_for(wheel: Path, release_dir: Path, **more) -> dict:
    return dict({"release_dir": str(release_dir), "wheel": str(wheel), "label": LABEL,
                 "wheel_sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(), "python": sys.executable,
                 "install_deps": False, "installer": "pip", "patches": ["0001-x.patch"], "features": ["ddtree"]},
                **more)


def test_a_wheel_without_the_label_is_refused(tmp_path):
    wheel = make_wheel(tmp_path, label="ffffffffffff")
    rc, out = run_module(args_for(wheel, tmp_path / "rel"), tmp_path)
    assert rc != 0 and "does not carry label '0a1b2c3d4e5f'" in out["msg"], out
    assert not (tmp_path / "rel").exists()


def test_a_wheel_with_another_digest_is_refused_and_nothing_is_installed(tmp_path):
    wheel = make_wheel(tmp_path)
    rc, out = run_module(args_for(wheel, tmp_path / "rel", wheel_sha256="0" * 64), tmp_path)
    assert rc != 0 and "is not " + "0" * 64 in out["msg"] and "nothing was installed" in out["msg"], out
    assert not (tmp_path / "rel").exists()


def test_a_wheel_for_another_python_names_the_build_option(tmp_path):
    wheel = make_wheel(tmp_path, pytag="cp39")
    rc, out = run_module(args_for(wheel, tmp_path / "rel"), tmp_path)
    want = f"--python {sys.version_info.major}.{sys.version_info.minor}"
    assert rc != 0 and "is for cp39" in out["msg"] and want in out["msg"], out


def test_check_mode_reports_an_install_and_makes_nothing(tmp_path):
    wheel = make_wheel(tmp_path)
    rc, out = run_module(args_for(wheel, tmp_path / "rel"), tmp_path, check_mode=True)
    assert rc == 0 and out["changed"] is True and out["installer"] == "pip", out
    assert not (tmp_path / "rel").exists()


@pytest.mark.slow
def test_an_install_records_the_release_and_a_second_run_changes_nothing(tmp_path):
    wheel = make_wheel(tmp_path)
    rel = tmp_path / "rel"
    rel.mkdir()
    rc, out = run_module(args_for(wheel, rel), tmp_path)
    assert rc == 0 and out["changed"] is True, out
    record = json.loads((rel / "release.json").read_text())
    assert record["label"] == LABEL and record["version"] == f"0.5.23+{LABEL}" and record["installer"] == "pip"
    assert record["patches"] == ["0001-x.patch"] and record["features"] == ["ddtree"]
    assert (rel / "venv/bin/python").exists()
    rc, again = run_module(args_for(wheel, rel), tmp_path)
    assert rc == 0 and again["changed"] is False and again["release"] == record, again
