"""The attributes of the sgdeploy.host modules: what check mode and diff mode do (extends_documentation_fragment).

Modelled on community.docker's ``plugins/doc_fragments/attributes.py``. A module lists
``sgdeploy.host.attributes`` (the descriptions) and either ``sgdeploy.host.attributes.read_only`` (a module
that changes nothing) or its own ``attributes:`` entries with ``support`` (full, partial, none) and ``details``;
a module of the action group ``deploy`` (meta/runtime.yml) also lists ``sgdeploy.host.attributes.actiongroup_deploy``.
Ansible merges the entries, so each attribute ends with a description and a support level.
"""

from __future__ import annotations


class ModuleDocFragment:
    # The descriptions; every module lists this one.
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in C(check_mode) and return changed status prediction without modifying target.
  diff_mode:
    description:
      Will return details on what has changed (or possibly needs changing in C(check_mode)), when in diff mode.
"""

    # A module that changes nothing on the host: the same in check mode, nothing to diff.
    READ_ONLY = r"""
options: {}
attributes:
  check_mode:
    support: full
    details:
      - This action does not modify state; it runs the same in check mode.
  diff_mode:
    support: N/A
    details:
      - This action does not modify state.
"""

    # A module of the action group sgdeploy.host.deploy (meta/runtime.yml): it takes state_dir and run_id.
    ACTIONGROUP_DEPLOY = r"""
options: {}
attributes:
  action_group:
    description:
      - Use C(group/sgdeploy.host.deploy) in C(module_defaults) to set O(state_dir) and O(run_id) of every step of one
        run once (docs/design.md, "The collection").
    support: full
    membership:
      - sgdeploy.host.deploy
"""
