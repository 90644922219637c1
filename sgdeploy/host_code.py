"""Where the host-side code lives: the ``sgdeploy.host`` collection's module_utils.

The gates, the benchmark, the exactness comparison, deploy records and the model-folder helpers run
on hosts inside Ansible modules (``collections/ansible_collections/sgdeploy/host/plugins/``), which
Ansible ships with each module call; nothing of this package goes to a host. The controller's
commands (``sgdeploy gate``, ``bench``, ``records``, ``exactness``) use the very same code: importing
this module puts the repository's ``collections/`` folder on ``sys.path``, so that
``ansible_collections.sgdeploy.host.plugins.module_utils.X`` imports as it does inside a module
(docs/gates.md, "One implementation").
"""

from __future__ import annotations

import sys
from pathlib import Path

COLLECTIONS = Path(__file__).resolve().parents[1] / "collections"
if str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))
