#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_model_hub_install
short_description: Install huggingface_hub from pinned, hash-checked wheels into the host's hub venv
description:
  - Creates C(<root>/venv) with C(python -m venv) and installs the wheels of O(wheels) listed in
    O(requirements) (every one pinned by version and sha256) with
    C(pip install --no-index --no-deps --require-hashes); nothing comes from an index, a wheel whose
    hash is not in the list is refused. Checks that the venv imports C(huggingface_hub) and writes
    C(<root>/hub.json) (the list's sha256 and the version) last.
  - Idempotent. With the same list recorded and the venv answering, nothing is done.
  - M(sgdeploy.host.sglang_model_fetch) runs its downloads with this venv's Python.
options:
  root: {description: The hub venv's folder., type: path, default: /opt/sglang-deploy/hub}
  wheels: {description: The folder of wheels on the host., type: path, required: true}
  requirements: {description: The pinned list with hashes on the host (pip's --require-hashes format)., type: path,
                 required: true}
  python: {description: Interpreter the venv is made from., type: path, default: /usr/bin/python3}
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports whether an install would happen; installs nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Install huggingface_hub into the hub venv (hashes checked by pip on the host)
  sgdeploy.host.sglang_model_hub_install:
    root: /opt/sglang-deploy/hub
    wheels: /opt/sglang-deploy/hub/wheels
    requirements: /opt/sglang-deploy/hub/hub-requirements.txt
    python: /usr/bin/python3
"""

RETURN = r"""
python: {description: The venv's Python (the fetch's hub_python)., returned: always, type: str}
record: {description: The content of hub.json., returned: always, type: dict}
"""

import hashlib  # noqa: E402
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_venv as venv_utils  # noqa: E402

PROBE = "import huggingface_hub; print(huggingface_hub.__version__)"


def _pinned_version(text):
    for line in text.splitlines():
        name = line.split("==", 1)[0].strip().lower()
        if name in ("huggingface-hub", "huggingface_hub") and "==" in line:
            return line.split("==", 1)[1].split()[0].strip()
    return None


def main():
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "default": "/opt/sglang-deploy/hub"},
            "wheels": {"type": "path", "required": True},
            "requirements": {"type": "path", "required": True},
            "python": {"type": "path", "default": "/usr/bin/python3"},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        with open(p["requirements"], "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        module.fail_json(msg=f"sglang_model_hub_install: requirements {p['requirements']}: {exc.strerror}")
    version = _pinned_version(raw.decode("utf-8", "replace"))
    if not version:
        module.fail_json(msg=f"sglang_model_hub_install: requirements {p['requirements']}: "
                             "no huggingface-hub==VERSION pin")
    if not os.path.isdir(p["wheels"]):
        module.fail_json(msg=f"sglang_model_hub_install: wheels {p['wheels']}: no such folder on the host")
    venv = os.path.join(p["root"], "venv")
    vpy = venv_utils.python_of(venv)
    record_path = os.path.join(p["root"], "hub.json")
    record = {"huggingface_hub": version, "requirements_sha256": hashlib.sha256(raw).hexdigest()}
    probe = ["-I", "-c", PROBE]
    if venv_utils.is_current(venv, record_path, record, probe, version):
        module.exit_json(changed=False, python=vpy, record=record)
    if module.check_mode:
        module.exit_json(changed=True, python=vpy, record=record)
    try:
        venv_utils.make(p["python"], venv, ["--require-hashes", "--find-links", p["wheels"], "-r", p["requirements"]],
                        "pip install of the pinned wheels", record_path, record, probe, version,
                        f"import huggingface_hub {version}")
    except (venv_utils.VenvError, OSError) as exc:
        module.fail_json(msg=f"sglang_model_hub_install: {exc}")
    module.exit_json(changed=True, python=vpy, record=record)


if __name__ == "__main__":
    main()
