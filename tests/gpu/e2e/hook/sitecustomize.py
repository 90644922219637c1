"""TEST EQUIPMENT (tests/gpu/e2e): Python imports this file at start-up in every process whose
PYTHONPATH holds this folder (the harness puts it there for its servers only). With
SGDEPLOY_E2E_HOOK=1 it installs ``e2e_hook`` (one folder up): the accepted-path log and the
profiler ranges of the DDTree decode step. Without the variable it does nothing."""

import os
import sys

if os.environ.get("SGDEPLOY_E2E_HOOK") == "1":
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        import e2e_hook

        e2e_hook.install()
    except Exception as err:  # noqa: BLE001 - a broken hook must not stop the server
        print(f"sgdeploy e2e hook: not installed: {type(err).__name__}: {err}", file=sys.stderr)
