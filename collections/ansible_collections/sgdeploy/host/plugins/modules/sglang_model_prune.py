#!/usr/bin/python
"""Remove model folders that no unit, no previous unit and not this deploy uses."""

from __future__ import annotations

# Ansible module layout: the documentation strings come before the imports (ansible-test validate-modules).
# ruff: noqa: E402

DOCUMENTATION = r"""
module: sglang_model_prune
short_description: Remove model folders under the models root that nothing uses
description:
  - Keeps the folders named by installed C(sglang-*) units, by a switch in progress, by every
    config's C(previous.json) unit text, and O(keep); removes the other C(<root>/<name>/<version>)
    folders (and leftovers of aborted transfers of models no longer wanted).
options:
  root:
    description: The models root.
    type: path
    required: true
  state_dir:
    description: The deploy state folder (C(previous.json) of every config, switch in progress).
    type: path
    default: /var/lib/sglang-deploy
  keep:
    description: Folders to keep besides those in use (this deploy's).
    type: list
    elements: path
    default: []
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports the folders that would be removed (RV(removed)); removes nothing.
  diff_mode:
    support: full
    details:
      - The removed folders, one per line, before; nothing after.
"""

EXAMPLES = r"""
- name: Remove model folders nothing uses (never the current, previous or this deploy's)
  sgdeploy.host.sglang_model_prune:
    root: /var/lib/sglang/models
    state_dir: /var/lib/sglang-deploy
    keep:
      - /var/lib/sglang/models/Qwen--Qwen3.6-27B/main
      - /var/lib/sglang/models/z-lab--Qwen3.6-27B-DFlash/main
"""

RETURN = r"""
removed:
  description: The folders removed (in check mode, that would be removed).
  returned: success
  type: list
  elements: str
kept:
  description: The folders kept because something uses them.
  returned: success
  type: list
  elements: str
"""


from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sgdeploy.host.plugins.module_utils.model_folders import (
    folders_in_use,
    os_error_line,
    prunable,
    prune,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "state_dir": {"type": "path", "default": "/var/lib/sglang-deploy"},
            "keep": {"type": "list", "elements": "path", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    keep = folders_in_use(Path(p["state_dir"])) | set(p["keep"])
    root = Path(p["root"])
    try:
        removed = prunable(root, keep) if module.check_mode else prune(root, keep)
    except OSError as exc:
        module.fail_json(msg=os_error_line(f"prune {root}", exc))
    result = {"changed": bool(removed), "removed": removed, "kept": sorted(keep)}
    if removed:
        result["diff"] = {"before": "".join(f"{r}\n" for r in removed), "after": ""}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
