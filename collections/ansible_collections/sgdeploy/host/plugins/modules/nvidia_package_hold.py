#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
"""Hold (dpkg --set-selections) every installed package whose name matches the patterns."""

from __future__ import annotations

# Ansible module layout: the documentation strings come before the imports (ansible-test validate-modules).
# ruff: noqa: E402

DOCUMENTATION = r"""
module: nvidia_package_hold
short_description: Put installed packages matching regular expressions on hold
description:
  - Lists installed packages with dpkg-query and sets every one whose name matches one of
    O(patterns) and none of O(exclude) to C(hold) with dpkg --set-selections. Supports check mode.
options:
  patterns:
    description: Regular expressions (re.search) a package name must match to be held.
    type: list
    elements: str
    required: true
  exclude:
    description: Regular expressions of names never held.
    type: list
    elements: str
    default: []
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports the packages it would put on hold (RV(newly_held)); changes nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Hold the installed NVIDIA driver and CUDA packages
  sgdeploy.host.nvidia_package_hold:
    patterns: ["^nvidia-", "^libnvidia-", "^cuda-"]
    exclude: ["^cuda-keyring$", "^nvidia-container-"]
  register: held
"""

RETURN = r"""
held: {description: installed packages that match (all on hold afterwards), type: list, returned: always}
newly_held: {description: the ones this run put on hold, type: list, returned: always}
"""


import re

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(
        argument_spec={
            "patterns": {"type": "list", "elements": "str", "required": True},
            "exclude": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    try:
        patterns = [re.compile(p) for p in module.params["patterns"]]
        exclude = [re.compile(p) for p in module.params["exclude"]]
    except re.error as exc:
        module.fail_json(msg=f"bad regular expression in patterns/exclude: {exc}")
    rc, out, err = module.run_command(["dpkg-query", "-W", "-f", "${Package}\t${Status}\n"])
    if rc != 0:
        module.fail_json(msg=f"dpkg-query failed (rc {rc}): {err.strip()}")
    held, todo = [], []
    for line in out.splitlines():
        name, _tab, status = line.partition("\t")
        words = status.split()
        if len(words) != 3 or words[2] not in ("installed", "half-configured", "unpacked"):
            continue
        if not any(p.search(name) for p in patterns) or any(p.search(name) for p in exclude):
            continue
        held.append(name)
        if words[0] != "hold":
            todo.append(name)
    if todo and not module.check_mode:
        data = "".join(f"{name} hold\n" for name in todo)
        rc, _out, err = module.run_command(["dpkg", "--set-selections"], data=data)
        if rc != 0:
            module.fail_json(msg=f"dpkg --set-selections failed (rc {rc}): {err.strip()}", newly_held=[])
    module.exit_json(changed=bool(todo), held=sorted(held), newly_held=sorted(todo))


if __name__ == "__main__":
    main()
