#!/usr/bin/python
"""Check every model of a deploy before anything changes on the host (read-only)."""

from __future__ import annotations

# Ansible module layout: the documentation strings come before the imports (ansible-test validate-modules).
# ruff: noqa: E402

DOCUMENTATION = r"""
module: sglang_model_plan
short_description: Check every model of a deploy (hub, host paths, free disk); change nothing
description:
  - For each model of the deploy description, says what it needs (C(fetch), C(copy) or C(none)) and
    how many bytes are still to transfer.
  - Fails with one line per problem (missing host path, unreachable or refusing hub, a controller
    version with other content, a folder outside O(root), too little disk for all transfers together).
options:
  models:
    description: The deploy description's C(models) (C(sgdeploy render --json)).
    type: list
    elements: dict
    required: true
  hf_token:
    description: Hub token for gated or private repositories (never logged).
    type: str
  min_free_gb:
    description: Free space (GB) that must remain after the transfers.
    type: float
    default: 0
  root:
    description: The models root; hf and controller folders must lie under it.
    type: path
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
  - sgdeploy.host.attributes.read_only
  - sgdeploy.host.model_attributes.hub
"""

EXAMPLES = r"""
- name: Check every model before changing anything (hub, host paths, free disk)
  sgdeploy.host.sglang_model_plan:
    models: "{{ deploy.models }}"  # sgdeploy render --json's models
    endpoint: https://huggingface.co
    hf_token: "{{ sglang_models_hf_token }}"
    min_free_gb: 20
    timeout: 60
    root: /var/lib/sglang/models
  register: models_plan
  failed_when: false

- name: Stop when a model is missing, unreachable or does not fit (nothing was changed)
  ansible.builtin.fail:
    msg: "MODELS NOT READY on {{ inventory_hostname }}: {{ models_plan.msg }}"
  when: models_plan.failed
"""

RETURN = r"""
models:
  description: One entry per model, in order (role, source, label, local_dir, bytes, missing_bytes, action, text).
  returned: success
  type: list
  elements: dict
bytes_to_transfer:
  description: Bytes still to transfer for all models together.
  returned: success
  type: int
"""


from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sgdeploy.host.plugins.module_utils.hf_fetch import Hub
from ansible_collections.sgdeploy.host.plugins.module_utils.model_folders import ModelError, os_error_line
from ansible_collections.sgdeploy.host.plugins.module_utils.model_plan import describe, plan


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "models": {"type": "list", "elements": "dict", "required": True},
            "endpoint": {"type": "str", "default": "https://huggingface.co"},
            "hf_token": {"type": "str", "no_log": True},
            "min_free_gb": {"type": "float", "default": 0},
            "timeout": {"type": "float", "default": 60},
            "root": {"type": "path"},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        needs_hub = any(isinstance(m, dict) and m.get("source") == "hf" for m in p["models"])
        hub = Hub(p["endpoint"], p["hf_token"], p["timeout"]) if needs_hub else None
        items = plan(p["models"], hub, int(p["min_free_gb"] * 1e9), p["root"])
    except ModelError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=os_error_line("", exc))
    for item in items:
        item["text"] = describe(item, module.check_mode)
    module.exit_json(changed=False, models=items, bytes_to_transfer=sum(i["missing_bytes"] for i in items))


if __name__ == "__main__":
    main()
