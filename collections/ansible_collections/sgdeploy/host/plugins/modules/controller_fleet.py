#!/usr/bin/python
"""Documentation of the action plugin sgdeploy.host.controller_fleet (plugins/action/controller_fleet.py),
which runs on the controller inside ansible-playbook; this file holds no code that runs on a host."""

from __future__ import annotations

DOCUMENTATION = r"""
module: controller_fleet
short_description: Plan the fleet router of a config on the controller, in-process
description:
  - Runs inside ansible-playbook on the controller (an action plugin; it never connects to a host) and asks the
    project's Python package sgdeploy (C(sgdeploy.fleet.plan)) for the fleet of a config (docs/router.md, section
    The fleet router), that is the engine URL of each GPU host, the fleet router's address and ports, and the
    batch size.
  - Fails with one line, before any host is touched, on a fleet the router could not reach or that does not fit
    (an engine bound to loopback while the router runs on another host, two engines with one URL, a config with its
    own per-host router, more or less than one router host, a bad O(max_unavailable)).
  - The controller's Python must import sgdeploy (the project's virtualenv, as make deploy runs it).
version_added: 0.1.0
author: sgdeploy contributors (@sgdeploy)
options:
  config:
    description: A config name (under configs/) or the path of a config file (relative to O(chdir)).
    type: str
    required: true
  chdir:
    description: The project's folder; a relative config path is taken from it.
    type: path
    required: true
  engines:
    description:
      - The GPU hosts (inventory names), in the order they roll (the first is the canary). Each one's C(ansible_host)
        and C(sglang_bind_address) are read from its host variables.
    type: list
    elements: str
    required: true
  routers:
    description: The hosts of the inventory group C(routers) (exactly one is supported).
    type: list
    elements: str
    required: true
  max_unavailable:
    description:
      - Engines a batch takes out of the fleet router at once after the canary, N or N% (at least 1, at most one
        fewer than the engines); empty for the default 1.
    type: str
    default: ""
  installed:
    description:
      - The installed fleet routers' unit files (router host name to the text of its unit on the config's port); a
        plan that would change the number of engines on a GPU host that such a router fronts now (a change of
        O(config)'s C(serving.replicas), or between one engine and replicas) fails with one line naming the config,
        both counts and what to do (docs/router.md, The fleet router).
    type: dict
    default: {}
extends_documentation_fragment:
  - sgdeploy.host.attributes
  - sgdeploy.host.attributes.read_only
notes:
  - An action plugin that runs on the controller and reads only; this file holds its documentation.
"""

EXAMPLES = r"""
- name: Plan the fleet
  sgdeploy.host.controller_fleet:
    config: ddtree-b15
    chdir: "{{ playbook_dir | dirname }}"
    engines: "{{ groups['gpu_hosts'] }}"
    routers: "{{ groups['routers'] }}"
    max_unavailable: "25%"
"""

RETURN = r"""
fleet:
  description: The fleet's plan.
  returned: success
  type: dict
  contains:
    engines:
      description: One per GPU host, in rolling order, each with C(host), C(url) and C(name).
      type: list
      elements: dict
    workers:
      description: The engines' URLs, the fleet router's workers.
      type: list
      elements: str
    router:
      description: C(host), C(bind_address), C(port), C(metrics_port), C(unit_name) and C(url) of the fleet router.
      type: dict
    max_unavailable:
      description: Engines a batch takes out at once after the canary.
      type: int
    line:
      description: What the rollout will do, in one line.
      type: str
"""
