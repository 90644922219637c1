#!/usr/bin/python
"""Documentation of the action plugin sgdeploy.host.controller_config (plugins/action/controller_config.py),
which runs on the controller inside ansible-playbook; this file holds no code that runs on a host."""

from __future__ import annotations

DOCUMENTATION = r"""
module: controller_config
short_description: Load, validate and render a config on the controller, in-process
description:
  - Runs inside ansible-playbook on the controller (an action plugin; it never connects to the host) and asks the
    project's Python package sgdeploy what a play needs of a config, without a subprocess or JSON on stdout.
  - Loads the config (a name in configs/ or the path of a .yml file), merges its extends chain and validates it;
    a config error fails the task with one line per problem (file, field, value, what is allowed).
  - With O(render), renders the unit and the non-secret env file for one host into O(render.out) and returns
    the description that C(sgdeploy render --json) prints (units, ports, GPUs, URL, gates, replicas, router).
  - The controller's Python must import sgdeploy (the project's virtualenv, as make deploy runs it).
version_added: 0.1.0
author: sgdeploy contributors (@sgdeploy)
options:
  config:
    description: A config name (configs/NAME.yml) or the path of a config's .yml file (relative to O(chdir)).
    type: str
    required: true
  chdir:
    description: The project's checkout on the controller; a relative config path is taken from here.
    type: path
    required: true
  render:
    description: Render the config for one host; left out, the task only loads and validates it.
    type: dict
    suboptions:
      release:
        description: The release label the unit runs (stock, or the patched wheel's label).
        type: str
        required: true
      bind_address:
        description: The host's bind address (sglang_bind_address); empty means the config's serving.host.
        type: str
        default: ""
      launcher:
        description: What the release's python runs; empty means the default launcher.
        type: str
        default: ""
      release_root:
        description: The folder of the releases on the host; left out, the renderer's default.
        type: str
      service_user:
        description: The service account (User= and Group=); left out, the renderer's default.
        type: str
      env_dir:
        description: The folder of the env file on the host; left out, the renderer's default.
        type: str
      models_root:
        description: The folder of the models on the host (absolute, without C(..)); left out, the default.
        type: str
      out:
        description: The folder on the controller that receives the unit and env file.
        type: path
        required: true
      replica:
        description: Only this replica (from 0) of a config behind the router; it is described as its own deploy.
        type: int
      verify:
        description: Check the unit with systemd-analyze verify.
        type: bool
        default: false
      node_rank:
        description:
          - With C(serving.nnodes) above 1, this host's rank among the engine's hosts (docs/multinode.md).
          - Ignored for an engine on one host.
        type: int
      dist_init_address:
        description: With C(serving.nnodes) above 1, the address of rank 0 that every rank joins.
        type: str
extends_documentation_fragment:
  - sgdeploy.host.attributes
  - sgdeploy.host.attributes.read_only
notes:
  - Writes only under O(render.out) on the controller, in check mode too (the plan of C(make plan) needs it).
"""

EXAMPLES = r"""
- name: Describe the config's replicas and router for this host
  sgdeploy.host.controller_config:
    config: ddtree-b15
    chdir: "{{ playbook_dir | dirname }}"
    render:
      release: stock
      bind_address: "{{ sglang_bind_address | default('') }}"
      out: "{{ playbook_dir | dirname }}/build/render/layout/{{ inventory_hostname }}"
  register: layout

- name: Read one setting of the merged config
  sgdeploy.host.controller_config:
    config: configs/ddtree-b15.yml
    chdir: /srv/sgdeploy
  register: merged
"""

RETURN = r"""
name:
  description: The config's name (the file's stem).
  returned: success
  type: str
  sample: ddtree-b15
config:
  description: The fully merged config, as C(sgdeploy config) prints it.
  returned: success
  type: dict
rendered:
  description: What C(sgdeploy render --json) prints for the host (unit, env, ports, URL, replicas, router, ...).
  returned: success and O(render) given
  type: dict
problems:
  description: The config's problems, one line each.
  returned: failure on an invalid config
  type: list
  elements: str
"""
