#!/usr/bin/python
"""Documentation of the action plugin sgdeploy.host.controller_model_pack (plugins/action/controller_model_pack.py),
which runs on the controller inside ansible-playbook; this file holds no code that runs on a host."""

from __future__ import annotations

DOCUMENTATION = r"""
module: controller_model_pack
short_description: Pack a controller model folder into a tar once, on the controller, in-process
description:
  - Runs inside ansible-playbook on the controller (an action plugin; it never connects to the host) and tars the
    folder of a model whose source is C(controller) with the project's Python package sgdeploy
    (C(sgdeploy.models.pack)), without a subprocess.
  - The tar holds the folder's files (relative paths, owner root, mode 0644) and is written once, under a
    temporary name first; an existing O(out) is kept as it is (its name carries the folder's digest).
  - The role sglang_models then unpacks it on the host with M(ansible.builtin.unarchive) and checks the digest.
  - The controller's Python must import sgdeploy (the project's virtualenv, as make deploy runs it).
version_added: 0.1.0
author: sgdeploy contributors (@sgdeploy)
options:
  src:
    description: The model folder on the controller.
    type: path
    required: true
  out:
    description: The tar to write on the controller (its folder is created).
    type: path
    required: true
extends_documentation_fragment:
  - sgdeploy.host.attributes
attributes:
  check_mode:
    support: full
    details:
      - In check mode it writes nothing and returns O(out) as C(tar).
  diff_mode:
    support: N/A
    details:
      - It changes no host.
notes:
  - Never reports C(changed), as the tar is a cache on the controller, not a change of the host.
"""

EXAMPLES = r"""
- name: Pack the controller folder once
  sgdeploy.host.controller_model_pack:
    src: /srv/models/qwen3-8b-ft
    out: "{{ playbook_dir | dirname }}/build/models/qwen3-8b-ft-0123456789abcdef.tar"
  delegate_to: localhost
"""

RETURN = r"""
tar:
  description: The tar's path on the controller (O(out)).
  returned: always
  type: str
packed:
  description: Whether this call wrote the tar (false when it existed already, and in check mode).
  returned: success
  type: bool
"""
