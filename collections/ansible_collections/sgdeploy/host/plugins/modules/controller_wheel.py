#!/usr/bin/python
"""Documentation of the action plugin sgdeploy.host.controller_wheel (plugins/action/controller_wheel.py),
which runs on the controller inside ansible-playbook; this file holds no code that runs on a host."""

from __future__ import annotations

DOCUMENTATION = r"""
module: controller_wheel
short_description: Build (or find) the patched SGLang wheel of a config on the controller, in-process
description:
  - Runs inside ansible-playbook on the controller (an action plugin; it never connects to the host) and asks the
    project's Python package sgdeploy for the SGLang wheel of a config's patch set, without a subprocess or JSON
    on stdout.
  - Reads the config's patch features (a config error fails the task with its one-line problems); any feature
    builds the patched series (label = the series hash), none the pristine wheel (label C(stock)).
  - A wheel already in C(build/wheels/) is reused when it still has the sha256 recorded at its build; one changed
    after its build fails the task, naming both digests. Otherwise the pinned upstream wheel is fetched
    (sha256-checked), patched and written with its digest next to it (docs/build.md).
  - Returns what C(sgdeploy wheel --config CONFIG --python X.Y --json) prints (the CLI calls the same function,
    C(sgdeploy.wheel.build_for)).
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
  python:
    description: The Python version (X.Y) of the host's release interpreter; the wheel is built for it.
    type: str
    required: true
  index_url:
    description: The package index of the pinned upstream wheel; empty means pip's own configuration.
    type: str
    default: ""
extends_documentation_fragment:
  - sgdeploy.host.attributes
attributes:
  check_mode:
    support: full
    details:
      - Builds in check mode too, as it writes only C(build/wheels/) and C(build/downloads/) on the controller, and
        a plan needs the wheel's label and recorded digest. It never changes a host.
  diff_mode:
    support: N/A
    details:
      - It changes no host.
notes:
  - Reports C(changed) when this call built the wheel, not when it found it already built.
"""

EXAMPLES = r"""
- name: Build the patched wheel of the config for the host's Python
  sgdeploy.host.controller_wheel:
    config: ddtree-b15
    chdir: "{{ playbook_dir | dirname }}"
    python: "3.11"
  delegate_to: localhost
  register: build

- name: Use its release label
  ansible.builtin.debug:
    msg: "release {{ build.label }}: {{ build.wheel }} (sha256 {{ build.sha256 }})"
"""

RETURN = r"""
wheel:
  description: The wheel's path on the controller.
  returned: success
  type: str
  sample: /srv/sgdeploy/build/wheels/sglang-0.5.23+59d01d1e39ee-cp311-cp311-manylinux_2_34_x86_64.whl
label:
  description: The release label (the series hash, or C(stock) for the pristine wheel).
  returned: success
  type: str
  sample: 59d01d1e39ee
version:
  description: The wheel's version, C(<upstream version>+<label>).
  returned: success
  type: str
  sample: 0.5.23+59d01d1e39ee
python:
  description: The Python version the wheel is for.
  returned: success
  type: str
  sample: "3.11"
features:
  description: The config's patch features.
  returned: success
  type: list
  elements: str
  sample: [ddtree, fork, topk]
patches:
  description: The file names of the diffs applied, in series order (empty for C(stock)).
  returned: success
  type: list
  elements: str
sha256:
  description: The wheel's sha256, as recorded at its build.
  returned: success
  type: str
built:
  description: Whether this call built the wheel (false when it was already built).
  returned: success
  type: bool
log:
  description: The build's progress lines (download, patches applied, the wheel written); empty when the wheel
    was already built.
  returned: success, and failure in the build
  type: list
  elements: str
"""
