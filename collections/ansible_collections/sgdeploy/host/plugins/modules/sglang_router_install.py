#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_router_install
short_description: Install the pinned sglang-router wheel, hash checked, into <root>/<version>/venv
description:
  - Checks the wheel's sha256 against O(sha256) before anything else (a mismatch changes nothing),
    creates C(<root>/<version>/venv) with C(python -m venv), installs the wheel with
    C(pip --no-index --no-deps) (the Rust router needs none of the wheel's Python dependencies,
    which only its debugging MiniLB imports), checks that the venv reports O(version) and imports
    the Rust router, and writes C(<root>/<version>/router.json) last.
  - Idempotent. With the same version and sha256 recorded and the venv answering, nothing is done.
  - Supports check mode (reports whether an install would happen).
options:
  root: {description: Where router versions are installed., type: path, default: /opt/sglang-router}
  wheel: {description: The wheel file on the host., type: path, required: true}
  version: {description: The pinned sglang-router version., type: str, required: true}
  sha256: {description: The wheel's pinned sha256 (64 hex digits)., type: str, required: true}
  python: {description: Interpreter the venv is made from., type: path, default: /usr/bin/python3}
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
attributes:
  check_mode:
    support: full
    details:
      - Checks the wheel's sha256 and reports whether an install would happen; installs nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Install the router into its venv (sha256 checked on the host)
  sgdeploy.host.sglang_router_install:
    root: /opt/sglang-router
    wheel: /opt/sglang-router/wheels/sglang_router-0.3.2-cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
    version: 0.3.2
    sha256: ba5a24951e5e0357fe390782fcd1abd861448a87216832dbf2e501a1dd1548eb
    python: /usr/bin/python3
  register: router_installed
"""

RETURN = r"""
venv: {description: The virtualenv's folder., returned: always, type: str}
record: {description: The content of router.json., returned: always, type: dict}
"""

import os  # noqa: E402
import re  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_venv as venv_utils  # noqa: E402

PROBE = ("import importlib.metadata as m; import sglang_router.router as r; "
         "assert r.Router; print(m.version('sglang-router'))")


def main():
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "default": "/opt/sglang-router"},
            "wheel": {"type": "path", "required": True},
            "version": {"type": "str", "required": True},
            "sha256": {"type": "str", "required": True},
            "python": {"type": "path", "default": "/usr/bin/python3"},
        },
        supports_check_mode=True,
    )
    p = module.params
    if not re.fullmatch(r"[0-9a-f]{64}", p["sha256"]):
        module.fail_json(msg=f"sglang_router_install: sha256 {p['sha256']!r} is not 64 lower-case hex digits")
    if not re.fullmatch(r"[0-9A-Za-z.+_-]+", p["version"]):
        module.fail_json(msg=f"sglang_router_install: version {p['version']!r} is not a version")
    if not os.path.isfile(p["wheel"]):
        module.fail_json(msg=f"sglang_router_install: wheel {p['wheel']} not found on the host")
    got = module.sha256(p["wheel"])
    if got != p["sha256"]:
        module.fail_json(msg=f"sglang_router_install: wheel {os.path.basename(p['wheel'])} has sha256 {got}, "
                             f"the pin is {p['sha256']}; nothing installed")
    base = os.path.join(p["root"], p["version"])
    venv = os.path.join(base, "venv")
    record_path = os.path.join(base, "router.json")
    record = {"version": p["version"], "wheel": os.path.basename(p["wheel"]), "wheel_sha256": got}
    probe = ["-c", PROBE]
    if venv_utils.is_current(venv, record_path, record, probe, p["version"]):
        module.exit_json(changed=False, venv=venv, record=record)
    if module.check_mode:
        module.exit_json(changed=True, venv=venv, record=record)
    try:
        venv_utils.make(p["python"], venv, [p["wheel"]], "pip install of the wheel", record_path, record, probe,
                        p["version"], f"run the router {p['version']}")
    except (venv_utils.VenvError, OSError) as exc:
        module.fail_json(msg=f"sglang_router_install: {exc}")
    module.exit_json(changed=True, venv=venv, record=record)


if __name__ == "__main__":
    main()
