#!/usr/bin/python
# Copyright: sgdeploy contributors. Apache-2.0
"""Ansible module: remove old SGLang releases, keeping the newest and every one a config still uses."""

from __future__ import annotations

# Ansible module layout: documentation strings come before the imports (E402); the host may run
# Python 3.10 (Ubuntu 22.04), which has no datetime.UTC (UP017).
# ruff: noqa: E402, UP017

DOCUMENTATION = r"""
---
module: sglang_release_prune
short_description: Keep the N most recent SGLang releases and every current or previous one
description:
  - Lists the release directories under O(root), newest first (by C(created) in their
    C(release.json), else by modification time), keeps the first O(keep) of them, every label in
    O(protect), and every label named by the C(release) key of
    C(<state_dir>/<config>/current.json) or C(previous.json) (and C(previous/current.json)), and
    removes the rest.
  - A state file that cannot be read fails the task, so nothing a config may roll back to is removed.
  - Supports check mode (reports what would be removed).
options:
  root: {type: path, default: /opt/sglang/releases, description: Where the releases are.}
  keep: {type: int, default: 3, description: How many of the newest releases to keep (at least 1).}
  state_dir: {type: path, default: /var/lib/sglang-deploy, description: Deploy state per config.}
  protect: {type: list, elements: str, default: [], description: Labels never to remove.}
author: sgdeploy contributors (@sgdeploy)
extends_documentation_fragment:
  - sgdeploy.host.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports the labels it would remove (RV(removed)); removes nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Prune old releases (never a config's current or previous one)
  sgdeploy.host.sglang_release_prune:
    root: /opt/sglang/releases
    keep: 3
    state_dir: /var/lib/sglang-deploy
    protect: [59d01d1e39ee]
  register: pruned
"""

RETURN = r"""
removed: {description: Labels removed (or that would be)., type: list, returned: always}
kept: {description: "Labels kept, newest first.", type: list, returned: always}
in_use: {description: Labels named by current/previous deploy state., type: list, returned: always}
"""

import datetime
import json
import os
import shutil

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_records import read_json

STATE_FILES = ("current.json", "previous.json", os.path.join("previous", "current.json"))


def created(path):
    try:
        with open(os.path.join(path, "release.json"), encoding="utf-8") as fh:
            stamp = json.load(fh)["created"]
        return datetime.datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()
    except (OSError, ValueError, KeyError, TypeError):
        return os.stat(path).st_mtime


def in_use(module, state_dir):
    labels = set()
    if not os.path.isdir(state_dir):
        return labels
    for config in sorted(os.listdir(state_dir)):
        for name in STATE_FILES:
            path = os.path.join(state_dir, config, name)
            if not os.path.isfile(path):
                continue
            try:
                doc = read_json(path, f"deploy state {path}")
            except ValueError as exc:
                module.fail_json(msg=f"{exc}; not pruning releases")
            release = doc.get("release") if isinstance(doc, dict) else None
            if isinstance(release, dict):
                release = release.get("label")
            if not isinstance(release, str) or not release:
                module.fail_json(msg=f"deploy state {path} has no 'release' label; not pruning releases")
            labels.add(os.path.basename(release.rstrip("/")))
    return labels


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default="/opt/sglang/releases"),
            keep=dict(type="int", default=3),
            state_dir=dict(type="path", default="/var/lib/sglang-deploy"),
            protect=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    root, keep = module.params["root"], module.params["keep"]
    if keep < 1:
        module.fail_json(msg=f"sglang_releases_keep: {keep} is not allowed (at least 1)")
    if not os.path.isdir(root):
        module.exit_json(changed=False, removed=[], kept=[], in_use=[])
    used = in_use(module, module.params["state_dir"])
    releases = [
        e
        for e in os.listdir(root)
        if not e.startswith(".") and os.path.isdir(os.path.join(root, e)) and not os.path.islink(os.path.join(root, e))
    ]
    releases.sort(key=lambda e: (created(os.path.join(root, e)), e), reverse=True)
    protected = used | set(module.params["protect"])
    kept = [e for i, e in enumerate(releases) if i < keep or e in protected]
    removed = [e for e in releases if e not in kept]
    if not module.check_mode:
        for label in removed:
            shutil.rmtree(os.path.join(root, label))
    module.exit_json(changed=bool(removed), removed=removed, kept=kept, in_use=sorted(used))


if __name__ == "__main__":
    main()
