#!/usr/bin/python
"""Fetch a Hugging Face repository at a revision into a model folder on the host."""

from __future__ import annotations

# Ansible module layout: the documentation strings come before the imports (ansible-test validate-modules).
# ruff: noqa: E402

DOCUMENTATION = r"""
module: sglang_model_fetch
short_description: Fetch a Hugging Face repository at a revision into a model folder (resumable, verified)
description:
  - Asks the hub's API for the commit the revision points at and the files to fetch (sizes, checksums),
    then transfers them with C(huggingface_hub) run by O(hub_python) (the hub venv the sglang_models role
    installs from pinned, hash-checked wheels) and the role's O(hub_script) at that commit
    (C(get_hf_file_metadata), C(http_get)); every selected file goes to C(<dest>.incomplete/<file>.part),
    resuming with an HTTP Range request from what it holds, so a later run continues a broken download.
    Each file is then checked against the hub's size and checksum and renamed; then the completion
    marker, the owner and the rename of the staging folder to O(dest).
  - The token goes to the hub venv's process on its standard input, never in its argv or environment;
    that process gets C(HF_ENDPOINT) set to O(endpoint) and C(HF_HUB_OFFLINE=0), nothing of the caller's
    environment.
  - A folder whose marker matches is left alone. In check mode, asks the hub and reports what would
    be fetched. While it runs, C(<dest>.progress.json) says how far it is
    (M(sgdeploy.host.sglang_model_fetch_progress) reads it); run it with C(async) for long fetches.
options:
  repo:
    description: The repository, C(ORG/NAME).
    type: str
    required: true
  revision:
    description: A commit hash (pin one), branch or tag.
    type: str
    required: true
  dest:
    description: The model folder.
    type: path
    required: true
  hf_token_file:
    description:
      - A root-only file holding the hub token (M(sgdeploy.host.sglang_model_token)); empty for none.
      - The file is removed once read (not in check mode).
    type: path
    default: ""
  allow_patterns:
    description: Fetch exactly the files matching these patterns instead of the default selection.
    type: list
    elements: str
    default: []
  owner:
    description: Owner of the folder and its files.
    type: str
  hub_python:
    description: The Python of the hub venv (huggingface_hub installed); not needed in check mode.
    type: path
    default: /opt/sglang-deploy/hub/venv/bin/python
  hub_script:
    description: The transfer script the sglang_models role installs beside the venv (its files/hf_download.py).
    type: path
    default: /opt/sglang-deploy/hub/hf_download.py
  retries:
    description:
      - Resumes of one broken download within this run before failing (huggingface_hub's http_get
        itself also resumes a broken stream a few times first).
    type: int
    default: 3
  min_free_gb:
    description: Free space (GB) that must remain after the transfer.
    type: float
    default: 0
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
  - sgdeploy.host.model_attributes.hub
attributes:
  check_mode:
    support: full
    details:
      - Asks the hub and reports what would be fetched; transfers and writes nothing.
  diff_mode:
    support: full
    details:
      - The model folder's marker before and the files fetched after.
"""

EXAMPLES = r"""
- name: Put the hub token in a root-only file for the fetch
  sgdeploy.host.sglang_model_token:
    hf_token: "{{ sglang_models_hf_token }}"
  register: token

- name: Start the fetch in the background (it reads the token file and removes it)
  sgdeploy.host.sglang_model_fetch:
    repo: Qwen/Qwen3.6-27B
    revision: main
    dest: /var/lib/sglang/models/Qwen--Qwen3.6-27B/main
    endpoint: https://huggingface.co
    hf_token_file: "{{ token.path }}"
    owner: sglang
    hub_python: /opt/sglang-deploy/hub/venv/bin/python
    hub_script: /opt/sglang-deploy/hub/hf_download.py
    retries: 3
    timeout: 60
    min_free_gb: 20
  async: 21600
  poll: 0
  register: fetch_job

- name: Fetch only the config and tokenizer of a draft model, in the foreground
  sgdeploy.host.sglang_model_fetch:
    repo: z-lab/Qwen3.6-27B-DFlash
    revision: main
    dest: /var/lib/sglang/models/z-lab--Qwen3.6-27B-DFlash/main
    allow_patterns: ["*.json", "tokenizer*"]
"""

RETURN = r"""
dest:
  description: The model folder.
  returned: success
  type: str
commit:
  description: The commit the revision points at.
  returned: success
  type: str
bytes:
  description: Bytes of the selected files.
  returned: success
  type: int
files:
  description: Number of selected files.
  returned: success
  type: int
bytes_to_transfer:
  description: Bytes that were (or in check mode would be) transferred.
  returned: success
  type: int
bytes_downloaded:
  description: Bytes downloaded by this run.
  returned: success
  type: int
resumes:
  description: One line per broken transfer that was resumed.
  returned: success
  type: list
  elements: str
"""


from pathlib import Path

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sgdeploy.host.plugins.module_utils.hf_fetch import (
    HUB_PYTHON,
    HUB_SCRIPT,
    Hub,
    HubDownloader,
    check_names,
    fetch,
    read_token_file,
)
from ansible_collections.sgdeploy.host.plugins.module_utils.model_folders import (
    ModelError,
    files_summary,
    marker_summary,
    os_error_line,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "repo": {"type": "str", "required": True},
            "revision": {"type": "str", "required": True},
            "dest": {"type": "path", "required": True},
            "endpoint": {"type": "str", "default": "https://huggingface.co"},
            "hf_token_file": {"type": "path", "default": ""},
            "allow_patterns": {"type": "list", "elements": "str", "default": []},
            "owner": {"type": "str"},
            "hub_python": {"type": "path", "default": HUB_PYTHON},
            "hub_script": {"type": "path", "default": HUB_SCRIPT},
            "retries": {"type": "int", "default": 3},
            "timeout": {"type": "float", "default": 60},
            "min_free_gb": {"type": "float", "default": 0},
        },
        supports_check_mode=True,
    )
    p = module.params
    resumes: list[str] = []
    dest = Path(p["dest"])
    try:
        check_names(p["repo"], p["revision"])
        if p["retries"] < 0:
            raise ModelError(f"retries: {p['retries']}: must be 0 or more")
        before = marker_summary(dest)
        token = read_token_file(p["hf_token_file"], remove=not module.check_mode)
        hub = Hub(p["endpoint"], token, p["timeout"])
        result = fetch(hub, p["repo"], p["revision"], dest, p["allow_patterns"] or None, p["owner"], p["retries"],
                       int(p["min_free_gb"] * 1e9), log=resumes.append, check_mode=module.check_mode,
                       downloader=HubDownloader(hub, p["hub_python"], p["hub_script"]))
    except ModelError as exc:
        module.fail_json(msg=str(exc), resumes=resumes)
    except OSError as exc:
        module.fail_json(msg=os_error_line(f"model {p['repo']}@{p['revision']}", exc), resumes=resumes)
    files = result.pop("file_list")
    if result["changed"]:
        result["diff"] = {"before_header": str(dest), "after_header": str(dest), "before": before,
                          "after": files_summary(dest, f"hf {p['repo']} {p['revision']}", files)}
    module.exit_json(resumes=resumes, **result)


if __name__ == "__main__":
    main()
