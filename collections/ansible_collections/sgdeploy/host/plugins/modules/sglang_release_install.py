#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
"""Ansible module: install a patched SGLang wheel into a release directory's virtualenv."""

from __future__ import annotations

# Ansible module layout: documentation strings come before the imports (E402); the host may run
# Python 3.10 (Ubuntu 22.04), which has no datetime.UTC (UP017).
# ruff: noqa: E402, UP017

DOCUMENTATION = r"""
---
module: sglang_release_install
short_description: Install an SGLang wheel into <release_dir>/venv and record it in release.json
description:
  - Creates C(<release_dir>/venv) (with C(uv) when it is on the host and O(installer) allows it,
    else C(python -m venv) and pip), installs the wheel, checks that the installed C(sglang)
    distribution has the wheel's version, and writes C(<release_dir>/release.json) last.
  - Idempotent. When C(release.json) names the same label and wheel sha256 and the venv reports
    that version, nothing is done.
  - Supports check mode (reports whether an install would happen).
options:
  release_dir: {type: path, required: true, description: The release directory (C(<root>/<label>)).}
  wheel: {type: path, required: true, description: The wheel file on the host.}
  label: {type: str, required: true, description: The release label.}
  wheel_sha256:
    type: str
    default: ""
    description: The sha256 recorded at the wheel's build; a wheel on the host with another digest is refused.
  patches: {type: list, elements: str, default: [], description: "Patch file names, in order."}
  features: {type: list, elements: str, default: [], description: Patch features.}
  python: {type: path, default: /usr/bin/python3, description: Interpreter the venv is made from.}
  install_deps: {type: bool, default: true, description: Install the wheel's dependencies from the index.}
  index_url: {type: str, default: "", description: Package index for the dependencies (empty = installer default).}
  extra_index_urls: {type: list, elements: str, default: [], description: Extra package indexes.}
  installer: {type: str, default: auto, choices: [auto, uv, pip], description: Which installer to use.}
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
attributes:
  check_mode:
    support: full
    details:
      - Checks the wheel (label, sha256, Python tag) and reports whether an install would happen; installs nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Install the release virtualenv
  sgdeploy.host.sglang_release_install:
    release_dir: /opt/sglang/releases/59d01d1e39ee
    wheel: /opt/sglang/releases/59d01d1e39ee/sglang-0.5.23+59d01d1e39ee-cp312-cp312-linux_x86_64.whl
    label: 59d01d1e39ee
    wheel_sha256: "{{ wheel_sha256 }}"  # recorded at the wheel's build (make wheel)
    patches:
      - 0001-ddtree-speculative-decoding.patch
      - 0002-ddtree-recurrent-state-forking.patch
      - 0003-fused-depth-topk.patch
      - 0004-ddtree-tree-conv.patch
    features: [ddtree, fork, topk]
    python: /usr/bin/python3
    install_deps: true
    installer: auto
  register: release
"""

RETURN = r"""
release: {description: The content of release.json., type: dict, returned: always}
installer: {description: The installer used (or that would be used)., type: str, returned: always}
"""

import datetime
import os
import shutil
import subprocess

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_files import read_json, write_json

VERSION_PROBE = "import importlib.metadata as m; print(m.version('sglang'))"
PY_PROBE = "import sys; print('%d.%d.%d' % sys.version_info[:3])"


def wheel_version(path):
    """(version, python tag) from a wheel file name: sglang-0.5.23+x-cp311-cp311-plat.whl."""
    parts = os.path.basename(path)[: -len(".whl")].split("-")
    if len(parts) < 5 or not path.endswith(".whl"):
        return None, None
    return parts[1], parts[2]


def run(module, cmd, what):
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        return None, f"{what} failed (exit {proc.returncode}): {' | '.join(lines[-5:])}"
    return proc.stdout.strip(), None


def main():
    module = AnsibleModule(
        argument_spec=dict(
            release_dir=dict(type="path", required=True),
            wheel=dict(type="path", required=True),
            label=dict(type="str", required=True),
            wheel_sha256=dict(type="str", default=""),
            patches=dict(type="list", elements="str", default=[]),
            features=dict(type="list", elements="str", default=[]),
            python=dict(type="path", default="/usr/bin/python3"),
            install_deps=dict(type="bool", default=True),
            index_url=dict(type="str", default=""),
            extra_index_urls=dict(type="list", elements="str", default=[]),
            installer=dict(type="str", default="auto", choices=["auto", "uv", "pip"]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    os.umask(0o022)  # the service user must be able to read the release
    release_dir, wheel = p["release_dir"], p["wheel"]
    venv = os.path.join(release_dir, "venv")
    venv_python = os.path.join(venv, "bin", "python")
    record_path = os.path.join(release_dir, "release.json")

    if not os.path.isfile(wheel):
        module.fail_json(msg=f"wheel {wheel} not found on the host")
    version, pytag = wheel_version(wheel)
    if version is None or not version.endswith(f"+{p['label']}"):
        module.fail_json(
            msg=f"wheel {os.path.basename(wheel)} does not carry label {p['label']!r} "
            "(expected sglang-<version>+<label>-<tags>.whl)"
        )
    uv = shutil.which("uv") or next((c for c in ("/usr/local/bin/uv", "/usr/bin/uv") if os.access(c, os.X_OK)), None)
    if p["installer"] == "uv" and not uv:
        module.fail_json(msg="installer=uv but uv is not on the host (allowed: auto, uv, pip)")
    installer = "uv" if uv and p["installer"] != "pip" else "pip"
    sha = module.sha256(wheel)
    if p["wheel_sha256"] and sha != p["wheel_sha256"].lower():
        module.fail_json(msg=f"wheel {wheel} on the host: sha256 {sha} is not {p['wheel_sha256']}, the digest recorded "
                             "at its build; it changed after the build: nothing was installed")

    current = read_json(record_path)
    if (
        isinstance(current, dict)
        and current.get("wheel_sha256") == sha
        and current.get("label") == p["label"]
        and os.access(venv_python, os.X_OK)
    ):
        got, _ = run(module, [venv_python, "-c", VERSION_PROBE], "version probe")
        if got == version:
            module.exit_json(changed=False, release=current, installer=installer)

    host_py, err = run(module, [p["python"], "-c", PY_PROBE], f"{p['python']} -c sys.version_info")
    if err:
        module.fail_json(msg=f"sglang_release_python {p['python']}: {err}")
    want = f"cp{''.join(host_py.split('.')[:2])}"
    if pytag != want:
        module.fail_json(
            msg=f"wheel {os.path.basename(wheel)} is for {pytag} but {p['python']} is Python "
            f"{host_py}: build the wheel with --python {'.'.join(host_py.split('.')[:2])}"
        )
    if module.check_mode:
        module.exit_json(changed=True, release=current or {}, installer=installer)

    for stale in (record_path, venv):
        if os.path.isdir(stale):
            shutil.rmtree(stale)
        elif os.path.exists(stale):
            os.unlink(stale)

    index = []
    if p["install_deps"]:
        if p["index_url"]:
            index += ["--index-url", p["index_url"]]
        for url in p["extra_index_urls"]:
            index += ["--extra-index-url", url]
        deps = []
    else:
        deps = ["--no-deps", "--no-index"]
    if installer == "uv":
        steps = [
            ([uv, "venv", "--python", p["python"], venv], "uv venv"),
            (
                [uv, "pip", "install", "--python", venv_python, "--compile-bytecode", *deps, *index, wheel],
                "uv pip install",
            ),
        ]
    else:
        steps = [
            ([p["python"], "-m", "venv", venv], f"{p['python']} -m venv"),
            (
                [
                    venv_python,
                    "-m",
                    "pip",
                    "install",
                    "--no-input",
                    "--disable-pip-version-check",
                    *deps,
                    *index,
                    wheel,
                ],
                "pip install",
            ),
        ]
    for cmd, what in steps:
        _, err = run(module, cmd, what)
        if err:
            shutil.rmtree(venv, ignore_errors=True)
            module.fail_json(msg=f"release {p['label']}: {err}", cmd=cmd)
    got, err = run(module, [venv_python, "-c", VERSION_PROBE], "version probe")
    if err or got != version:
        shutil.rmtree(venv, ignore_errors=True)
        module.fail_json(
            msg=f"release {p['label']}: installed sglang reports {got!r}, expected {version!r}"
            + (f" ({err})" if err else "")
        )
    venv_py_version, _ = run(module, [venv_python, "-c", PY_PROBE], "python version")
    release = {
        "label": p["label"],
        "patches": p["patches"],
        "features": p["features"],
        "wheel": os.path.basename(wheel),
        "wheel_sha256": sha,
        "python": venv_py_version,
        "version": version,
        "installer": installer,
        "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    write_json(record_path, release)  # release.json last, written crash-safely
    module.exit_json(changed=True, release=release, installer=installer)


if __name__ == "__main__":
    main()
