#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_router_env
short_description: The router's keys in its environment file on the host (never on the controller)
description:
  - Makes sure of C(/etc/sglang/router-<port>.env) (0640 root:O(group)), read by systemd for the
    router's unit (EnvironmentFile) and by the modules that call the router's worker API as root.
  - C(SGLANG_ROUTER_CONTROL_KEY), the router's control-plane admin key, is made here on the host
    from the operating system's random source the first time and kept after that; it never leaves
    the host (it is not returned).
  - C(SGLANG_ROUTER_API_KEY) is O(api_key) (the engines' API key, from the inventory's
    sglang_secret_env), or absent when O(api_key) is empty.
  - Changed when the file's content or mode changed (the role then restarts the router).
options:
  port: {description: "The router's port (serving.port).", type: int, required: true}
  env_dir: {description: Folder of the environment files., type: path, default: /etc/sglang}
  group: {description: Group that may read the file (the router's user)., type: str, default: sglang-router}
  api_key: {description: "The engines' API key; empty for none. Never logged.", type: str, default: ""}
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports whether the file would change (content, mode or owner); writes nothing.
  diff_mode:
    support: none
    details:
      - The file holds the router's keys; no diff is returned.
"""

EXAMPLES = r"""
- name: Make sure of the router's keys on the host (control-plane key made there once; never leaves it)
  sgdeploy.host.sglang_router_env:
    port: 30000
    env_dir: /etc/sglang
    group: sglang-router
    api_key: "{{ sglang_secret_env.SGLANG_API_KEY | default('') }}"
  register: router_env
  no_log: true
"""

RETURN = r"""
path: {description: The environment file., returned: always, type: str}
made_control_key: {description: Whether the control key was made in this run., returned: always, type: bool}
"""

import grp  # noqa: E402
import os  # noqa: E402
import secrets  # noqa: E402
import tempfile  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.sgdeploy.host.plugins.module_utils import sglang_router_api as api  # noqa: E402


def quote(value):
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")
    return f'"{escaped}"'


def content(values):
    lines = ["# The sglang-router's keys: written by the role sglang_router on this host. 0640 root:sglang-router."]
    lines += [f"{name}={quote(value)}" for name, value in values.items()]
    return "\n".join(lines) + "\n"


def main():
    module = AnsibleModule(
        argument_spec={
            "port": {"type": "int", "required": True},
            "env_dir": {"type": "path", "default": api.ENV_DIR},
            "group": {"type": "str", "default": "sglang-router"},
            "api_key": {"type": "str", "default": "", "no_log": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    if any(c in p["api_key"] for c in "\n\r\0"):
        module.fail_json(msg="sglang_router_env: the engines' API key holds a line break or NUL; use one line")
    path = api.env_file(p["port"], p["env_dir"])
    current = api.read_env(path)
    made = not current.get(api.CONTROL_KEY_VAR)
    values = {api.CONTROL_KEY_VAR: current.get(api.CONTROL_KEY_VAR) or secrets.token_urlsafe(32)}
    if p["api_key"]:
        values[api.API_KEY_VAR] = p["api_key"]
    text = content(values)
    try:
        gid = grp.getgrnam(p["group"]).gr_gid
    except KeyError:
        module.fail_json(msg=f"sglang_router_env: no group {p['group']!r} on the host (the role makes it first)")
    try:
        with open(path, encoding="utf-8") as fh:
            old = fh.read()
        st = os.stat(path)
        same = old == text and (st.st_mode & 0o777, st.st_uid, st.st_gid) == (0o640, 0, gid)
    except FileNotFoundError:
        same = False
    if same or module.check_mode:
        module.exit_json(changed=not same, path=path, made_control_key=made and not same)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=p["env_dir"], prefix=".router-env-")
        os.fchmod(fd, 0o640)
        os.fchown(fd, 0, gid)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
        module.fail_json(msg=f"sglang_router_env: cannot write {path}: {exc.strerror}")
    module.exit_json(changed=True, path=path, made_control_key=made)


if __name__ == "__main__":
    main()
