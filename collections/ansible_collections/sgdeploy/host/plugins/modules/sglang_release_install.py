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


ARGUMENT_SPEC = dict(
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
)
UV_PATHS = ("/usr/local/bin/uv", "/usr/bin/uv")


def wheel_version(path):
    """(version, python tag) from a wheel file name: sglang-0.5.23+x-cp311-cp311-plat.whl."""
    parts = os.path.basename(path)[: -len(".whl")].split("-")
    if len(parts) < 5 or not path.endswith(".whl"):
        return None, None
    return parts[1], parts[2]


def run(cmd, what):
    """(stdout, None) or (None, why it failed: the exit code and the last lines of its output)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        return None, f"{what} failed (exit {proc.returncode}): {' | '.join(lines[-5:])}"
    return proc.stdout.strip(), None


class ReleaseInstall:
    """One release directory: check the wheel, see whether it is installed already, install it, record it."""

    def __init__(self, module):
        self.module = module
        self.p = module.params
        self.release_dir, self.wheel = self.p["release_dir"], self.p["wheel"]
        self.venv = os.path.join(self.release_dir, "venv")
        self.venv_python = os.path.join(self.venv, "bin", "python")
        self.record_path = os.path.join(self.release_dir, "release.json")
        self.version = self.pytag = self.sha = None
        self.uv = shutil.which("uv") or next((c for c in UV_PATHS if os.access(c, os.X_OK)), None)
        self.installer = "uv" if self.uv and self.p["installer"] != "pip" else "pip"

    def fail(self, msg, **more):
        self.module.fail_json(msg=msg, **more)

    def check_wheel(self):
        """The file exists, carries the label, and has the digest recorded at its build."""
        p, wheel = self.p, self.wheel
        if not os.path.isfile(wheel):
            self.fail(f"wheel {wheel} not found on the host")
        self.version, self.pytag = wheel_version(wheel)
        if self.version is None or not self.version.endswith(f"+{p['label']}"):
            self.fail(f"wheel {os.path.basename(wheel)} does not carry label {p['label']!r} "
                      "(expected sglang-<version>+<label>-<tags>.whl)")
        if p["installer"] == "uv" and not self.uv:
            self.fail("installer=uv but uv is not on the host (allowed: auto, uv, pip)")
        self.sha = self.module.sha256(wheel)
        if p["wheel_sha256"] and self.sha != p["wheel_sha256"].lower():
            self.fail(f"wheel {wheel} on the host: sha256 {self.sha} is not {p['wheel_sha256']}, the digest recorded "
                      "at its build; it changed after the build: nothing was installed")

    def installed(self):
        """release.json when it names this label and wheel and the venv reports the wheel's version; else None."""
        current = read_json(self.record_path)
        if (isinstance(current, dict) and current.get("wheel_sha256") == self.sha
                and current.get("label") == self.p["label"] and os.access(self.venv_python, os.X_OK)):
            got, _ = run([self.venv_python, "-c", VERSION_PROBE], "version probe")
            if got == self.version:
                return current
        return None

    def check_python(self):
        """The wheel's Python tag is the host interpreter's."""
        python = self.p["python"]
        host_py, err = run([python, "-c", PY_PROBE], f"{python} -c sys.version_info")
        if err:
            self.fail(f"sglang_release_python {python}: {err}")
        if self.pytag != f"cp{''.join(host_py.split('.')[:2])}":
            self.fail(f"wheel {os.path.basename(self.wheel)} is for {self.pytag} but {python} is Python "
                      f"{host_py}: build the wheel with --python {'.'.join(host_py.split('.')[:2])}")

    def steps(self):
        """The installer's commands: make the venv, install the wheel (with or without its dependencies)."""
        p, venv, venv_python, wheel = self.p, self.venv, self.venv_python, self.wheel
        index, deps = [], ["--no-deps", "--no-index"]
        if p["install_deps"]:
            deps = []
            if p["index_url"]:
                index += ["--index-url", p["index_url"]]
            for url in p["extra_index_urls"]:
                index += ["--extra-index-url", url]
        if self.installer == "uv":
            return [([self.uv, "venv", "--python", p["python"], venv], "uv venv"),
                    ([self.uv, "pip", "install", "--python", venv_python, "--compile-bytecode", *deps, *index, wheel],
                     "uv pip install")]
        return [([p["python"], "-m", "venv", venv], f"{p['python']} -m venv"),
                ([venv_python, "-m", "pip", "install", "--no-input", "--disable-pip-version-check", *deps, *index,
                  wheel], "pip install")]

    def install(self):
        """Remove what a former try left, run the steps, check the installed version; the venv goes on failure."""
        for stale in (self.record_path, self.venv):
            if os.path.isdir(stale):
                shutil.rmtree(stale)
            elif os.path.exists(stale):
                os.unlink(stale)
        for cmd, what in self.steps():
            _, err = run(cmd, what)
            if err:
                shutil.rmtree(self.venv, ignore_errors=True)
                self.fail(f"release {self.p['label']}: {err}", cmd=cmd)
        got, err = run([self.venv_python, "-c", VERSION_PROBE], "version probe")
        if err or got != self.version:
            shutil.rmtree(self.venv, ignore_errors=True)
            self.fail(f"release {self.p['label']}: installed sglang reports {got!r}, expected {self.version!r}"
                      + (f" ({err})" if err else ""))

    def record(self):
        """Write release.json last, crash-safely: a release without it is not installed."""
        venv_py_version, _ = run([self.venv_python, "-c", PY_PROBE], "python version")
        release = {
            "label": self.p["label"],
            "patches": self.p["patches"],
            "features": self.p["features"],
            "wheel": os.path.basename(self.wheel),
            "wheel_sha256": self.sha,
            "python": venv_py_version,
            "version": self.version,
            "installer": self.installer,
            "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        write_json(self.record_path, release)
        return release


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    os.umask(0o022)  # the service user must be able to read the release
    release = ReleaseInstall(module)
    release.check_wheel()
    current = release.installed()
    if current is not None:
        module.exit_json(changed=False, release=current, installer=release.installer)
    release.check_python()
    if module.check_mode:
        module.exit_json(changed=True, release=read_json(release.record_path) or {}, installer=release.installer)
    release.install()
    module.exit_json(changed=True, release=release.record(), installer=release.installer)


if __name__ == "__main__":
    main()
