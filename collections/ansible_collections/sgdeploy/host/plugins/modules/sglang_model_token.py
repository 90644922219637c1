#!/usr/bin/python
"""Hold the hub token in a root-only file on the host for the length of a fetch."""

from __future__ import annotations

# Ansible module layout: the documentation strings come before the imports (ansible-test validate-modules).
# ruff: noqa: E402

DOCUMENTATION = r"""
module: sglang_model_token
short_description: Put the hub token in a root-only file on the host, or remove that file
description:
  - With O(state=present), writes O(hf_token) to a new file (mode 0600, in a 0700 folder under /run)
    and returns its path, so a background (async) fetch reads the token from there instead of from
    its arguments (Ansible copies an async module's arguments through a file on the controller).
  - With O(state=absent), removes O(path). Use it in an C(always) section.
  - Reports no change, since the file lives only as long as one fetch.
  - Pass the token to this module only over a pipelined connection (the project's ansible.cfg).
options:
  hf_token:
    description: The token (never logged). Empty writes nothing and returns an empty path.
    type: str
    default: ""
  state:
    description: Whether the file should exist.
    type: str
    choices: [present, absent]
    default: present
  path:
    description: The file to remove (O(state=absent)).
    type: path
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
attributes:
  check_mode:
    support: full
    details:
      - Writes and removes nothing; RV(path) is empty (a fetch in check mode reads no token).
  diff_mode:
    support: none
    details:
      - The file holds a secret and lives only as long as one fetch.
"""

EXAMPLES = r"""
- name: Hand the hub token to a background fetch through a root-only file
  block:
    - name: Put the hub token in a root-only file for the fetch
      sgdeploy.host.sglang_model_token:
        hf_token: "{{ sglang_models_hf_token }}"
      register: token

    - name: Start the fetch in the background (it reads the token file and removes it)
      sgdeploy.host.sglang_model_fetch:
        repo: Qwen/Qwen3.6-27B
        revision: main
        dest: /var/lib/sglang/models/Qwen--Qwen3.6-27B/main
        hf_token_file: "{{ token.path }}"
      async: 21600
      poll: 0
      register: fetch_job
  always:
    - name: Remove the token file (when the fetch did not)
      sgdeploy.host.sglang_model_token:
        state: absent
        path: "{{ token.path | default('') }}"
"""

RETURN = r"""
path:
  description: The token file (empty when there is no token or in check mode).
  returned: always
  type: str
removed:
  description: Whether O(state=absent) removed a file.
  returned: state is absent
  type: bool
"""


import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sgdeploy.host.plugins.module_utils.hf_fetch import TOKEN_DIR, write_token_file


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "hf_token": {"type": "str", "no_log": True, "default": ""},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "path": {"type": "path"},
        },
        supports_check_mode=True,
    )
    p = module.params
    if p["state"] == "absent":
        path = p["path"] or ""
        if path and not os.path.realpath(path).startswith(TOKEN_DIR + "/"):
            module.fail_json(msg=f"path {path}: not a token file of {TOKEN_DIR}")
        present = bool(path) and os.path.exists(path)
        if present and not module.check_mode:
            os.unlink(path)
        module.exit_json(changed=False, path="", removed=present)
    # The file lives only as long as one fetch (in /run, removed after it): not a change of the host.
    if not p["hf_token"] or module.check_mode:
        module.exit_json(changed=False, path="")
    module.exit_json(changed=False, path=write_token_file(p["hf_token"]))


if __name__ == "__main__":
    main()
