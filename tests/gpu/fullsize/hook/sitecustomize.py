"""TEST EQUIPMENT (tests/gpu/fullsize): imported at start-up by every process whose PYTHONPATH holds this
folder (the full-size runner puts it there for its servers only). With SGDEPLOY_E2E_HOOK=1 it installs the
e2e harness's hook (tests/gpu/e2e/e2e_hook.py: the DDTree decode step's profiler range; its path log stays
off), with SGDEPLOY_FULL_HOOK=1 full_hook (one folder up: the ranges of the step's parts). Without the
variables it does nothing."""

import os
import sys

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _flag, _dir, _mod in (("SGDEPLOY_E2E_HOOK", os.path.join(os.path.dirname(_HERE), "e2e"), "e2e_hook"),
                          ("SGDEPLOY_FULL_HOOK", _HERE, "full_hook")):
    if os.environ.get(_flag) == "1":
        sys.path.append(_dir)
        try:
            __import__(_mod).install()
        except Exception as err:  # noqa: BLE001 - a broken hook must not stop the server
            print(f"sgdeploy {_mod}: not installed: {type(err).__name__}: {err}", file=sys.stderr)
