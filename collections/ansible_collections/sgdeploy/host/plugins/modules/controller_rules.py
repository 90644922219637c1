#!/usr/bin/python
"""Documentation of the action plugin sgdeploy.host.controller_rules (plugins/action/controller_rules.py),
which runs on the controller inside ansible-playbook; this file holds no code that runs on a host."""

from __future__ import annotations

DOCUMENTATION = r"""
module: controller_rules
short_description: Make the Prometheus recording and alert rules of the configs on the controller, in-process
description:
  - Runs inside ansible-playbook on the controller (an action plugin; it never connects to the host) and asks the
    project's Python package sgdeploy for the rule file C(sgdeploy rules) writes (docs/monitoring.md, "Alert
    rules"), without a subprocess.
  - The accept-length and throughput alerts take each config's own C(gates.min_accept_length) and
    C(gates.min_tokens_per_s); the others (errors, queue growth, an engine or router down, unit restarts) hold for
    every engine.
  - The controller's Python must import sgdeploy (the project's virtualenv, as make monitoring runs it).
version_added: 0.1.0
author: sgdeploy contributors (@sgdeploy)
options:
  configs:
    description:
      - Config names (under configs/) or paths of config files (relative to O(chdir)).
      - Empty, every config under configs/.
    type: list
    elements: str
    default: []
  deployed:
    description:
      - Names of the configs the GPU hosts run (their exporters' targets); each one not among O(configs) is looked
        up under configs/ by name, and left out with a warning when it is not there.
    type: list
    elements: str
    default: []
  chdir:
    description: The project's folder; relative config paths are taken from it.
    type: path
    required: true
  time_scale:
    description: Divides every window and C(for) duration (1, the default, in production; the lab's tests use more).
    type: int
    default: 1
extends_documentation_fragment:
  - sgdeploy.host.attributes
  - sgdeploy.host.attributes.read_only
"""

EXAMPLES = r"""
- name: Render the alert rules (controller, in-process)
  sgdeploy.host.controller_rules:
    chdir: "{{ playbook_dir | dirname }}"
    deployed: [ddtree-b15]
  register: alert_rules

- name: Install them, checked by promtool
  ansible.builtin.copy:
    content: "{{ alert_rules.rules }}"
    dest: /etc/prometheus/rules/sglang-alerts.yml
    mode: "0644"
    validate: promtool check rules %s
"""

RETURN = r"""
rules:
  description: The Prometheus rule file (YAML text), one group with the recording rules first.
  returned: success
  type: str
configs:
  description: The names of the configs the rules cover.
  returned: success
  type: list
  elements: str
not_found:
  description: Deployed config names left out (not found under configs/).
  returned: success
  type: list
  elements: str
"""
