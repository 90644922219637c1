#!/usr/bin/python
"""Documentation of the action plugin sgdeploy.host.controller_records (plugins/action/controller_records.py),
which runs on the controller inside ansible-playbook; this file holds no code that runs on a host."""

from __future__ import annotations

DOCUMENTATION = r"""
module: controller_records
short_description: Make the status table of the deploy records on the controller, in-process
description:
  - Runs inside ansible-playbook on the controller (an action plugin; it never connects to the host) and asks the
    project's Python package sgdeploy for the table that C(make status) prints, without a subprocess.
  - Reads the deploy records under O(records_dir) (each host's, as the deploy role's entry point status fetches
    them) and, with O(now_dir), what runs on each host (C(<host>.json)); returns the table's lines, the text
    C(python -m sgdeploy.records status) prints.
  - A file under O(records_dir) that is not a deploy record is left out of the table, with a warning.
  - The controller's Python must import sgdeploy (the project's virtualenv, as make status runs it).
version_added: 0.1.0
author: sgdeploy contributors (@sgdeploy)
options:
  records_dir:
    description: The folder of the deploy records on the controller (read recursively); it must exist.
    type: path
    required: true
  now_dir:
    description:
      - The folder of what runs on each host (C(<host>.json)); the table then starts with what serves now.
      - Left out, the table is the history only.
    type: path
  hosts:
    description:
      - The hosts asked; one without a C(<host>.json) in O(now_dir) did not answer (UNREACHABLE in the table).
      - Left out, every C(<host>.json) found.
    type: list
    elements: str
  all:
    description: The history with every record, oldest first, instead of the newest of each config on each host.
    type: bool
    default: false
extends_documentation_fragment:
  - sgdeploy.host.attributes
  - sgdeploy.host.attributes.read_only
"""

EXAMPLES = r"""
- name: Make the status table (controller, in-process)
  sgdeploy.host.controller_records:
    records_dir: "{{ playbook_dir | dirname }}/build/status/records"
    now_dir: "{{ playbook_dir | dirname }}/build/status/now"
    hosts: "{{ groups['gpu_hosts'] }}"
  register: table

- name: Print it
  ansible.builtin.debug:
    msg: "{{ table.lines }}"
"""

RETURN = r"""
lines:
  description: The status table, one line each (what serves now with O(now_dir), then the history).
  returned: success
  type: list
  elements: str
  sample:
    - "history (the newest record of each config on each host):"
unanswered:
  description: The hosts of O(hosts) without a C(<host>.json) in O(now_dir) (what runs there is unknown).
  returned: success
  type: list
  elements: str
  sample: [gpu2]
"""
