# Copyright: sgdeploy contributors. Apache-2.0
"""A pinned virtualenv on the host, made from wheels already on the host and recorded beside it.

The modules sglang_router_install (the pinned sglang-router) and sglang_model_hub_install (the pinned
huggingface_hub) keep a venv whose record (a JSON file: what was installed, with its hashes) matches what they
were asked for and whose probe answers the pinned version; otherwise they make it afresh: remove it, ``python -m
venv``, ``pip install`` offline, probe it, and only then write the record (atomically: a venv half made by an
interrupted run has no matching record, so the next run makes it again).

Standard library only: shipped to the host by Ansible with every module that imports it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_deploy_files as files


class VenvError(Exception):
    """One line saying which step failed and how (the module prefixes its name)."""


def run(cmd):
    """(exit status, stdout stripped, the last 4 non-empty lines of stderr and stdout joined by ' | ')."""
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    return proc.returncode, proc.stdout.strip(), " | ".join(lines[-4:])


def python_of(venv):
    return os.path.join(venv, "bin", "python")


def is_current(venv, record_path, record, probe, want):
    """The venv is there, its record is ``record`` and ``probe`` (arguments to its python) prints ``want``."""
    try:
        with open(record_path, encoding="utf-8") as fh:
            current = json.load(fh)
    except (OSError, ValueError):
        return False
    vpy = python_of(venv)
    return current == record and os.access(vpy, os.X_OK) and run([vpy, *probe])[1] == want


def make(python, venv, pip_args, pip_what, record_path, record, probe, want, probe_what):
    """Make ``venv`` afresh with ``python``, ``pip install`` ``pip_args`` into it, check that ``probe`` prints
    ``want`` (else VenvError: "the venv does not <probe_what>: ..."), then write ``record`` to ``record_path``."""
    os.umask(0o022)  # the service's user must be able to read the venv
    if os.path.isdir(venv):
        shutil.rmtree(venv)
    os.makedirs(os.path.dirname(venv), mode=0o755, exist_ok=True)
    vpy = python_of(venv)
    for cmd, what in (([python, "-m", "venv", venv], "python -m venv"),
                      ([vpy, "-m", "pip", "install", "--no-index", "--no-deps", "--no-cache-dir",
                        "--disable-pip-version-check", *pip_args], pip_what)):
        rc, _, tail = run(cmd)
        if rc != 0:
            raise VenvError(f"{what} failed (exit {rc}): {tail}")
    rc, out, tail = run([vpy, *probe])
    if rc != 0 or out != want:
        raise VenvError(f"the venv does not {probe_what}: {out or tail}")
    files.write_json(record_path, record)
