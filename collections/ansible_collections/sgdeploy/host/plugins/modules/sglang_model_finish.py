#!/usr/bin/python
"""Verify a copied controller folder, mark it complete and rename it into place."""

from __future__ import annotations

# Ansible module layout: the documentation strings come before the imports (ansible-test validate-modules).
# ruff: noqa: E402

DOCUMENTATION = r"""
module: sglang_model_finish
short_description: Verify a copied model folder against the controller's digest, mark it, rename it into place
description:
  - Computes the digest of O(stage) (relative paths, sizes, sha256 of every file); when it equals
    O(sha), writes the completion marker, gives the folder to O(owner) and renames it to O(dest).
  - A O(dest) whose marker already names O(sha) is left alone.
options:
  stage:
    description: The staging folder the copy was unpacked into.
    type: path
    required: true
  dest:
    description: The model folder.
    type: path
    required: true
  sha:
    description: The controller folder's digest.
    type: str
    required: true
  name:
    description: The model's name (for the marker and messages).
    type: str
    required: true
  version:
    description: The version given in the config, if any.
    type: str
  owner:
    description: Owner of the folder and its files.
    type: str
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
attributes:
  check_mode:
    support: full
    details:
      - Computes the digest and reports whether the folder would be put in place; writes and renames nothing.
  diff_mode:
    support: full
    details:
      - The model folder's marker before and after.
"""

EXAMPLES = r"""
- name: Verify the copy, mark it complete and rename it into place
  sgdeploy.host.sglang_model_finish:
    stage: /var/lib/sglang/models/draft-b15/3f9c2a7d1e04.incomplete
    dest: /var/lib/sglang/models/draft-b15/3f9c2a7d1e04
    sha: 3f9c2a7d1e04b8a65c1f0e2d9b7a4c3e5f6a7b8c9d0e1f2a3b4c5d6e7f8a9b0c
    name: draft-b15
    version: "2026-12-01"
    owner: sglang
"""

RETURN = r"""
dest:
  description: The model folder.
  returned: success
  type: str
bytes:
  description: Bytes of the folder.
  returned: success
  type: int
"""


from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sgdeploy.host.plugins.module_utils.model_folders import (
    ModelError,
    finish,
    marker_summary,
    os_error_line,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "stage": {"type": "path", "required": True},
            "dest": {"type": "path", "required": True},
            "sha": {"type": "str", "required": True},
            "name": {"type": "str", "required": True},
            "version": {"type": "str"},
            "owner": {"type": "str"},
        },
        supports_check_mode=True,
    )
    p = module.params
    dest = Path(p["dest"])
    before = marker_summary(dest)
    try:
        result = finish(Path(p["stage"]), dest, p["sha"], p["name"], p["owner"], p["version"],
                        check_mode=module.check_mode)
    except ModelError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=os_error_line(f"model {p['name']}", exc))
    if result["changed"]:
        after = marker_summary(dest) if not module.check_mode else f"{dest}: controller {p['name']} {p['sha'][:16]}\n"
        result["diff"] = {"before_header": str(dest), "after_header": str(dest), "before": before, "after": after}
    module.exit_json(**result)


if __name__ == "__main__":
    main()
