# Copyright: sgdeploy contributors. Apache-2.0
"""Writing deploy records on the host (docs/gates.md: one file per attempt, never overwritten).

The shape is the one `sgdeploy.records` reads on the controller (`make status`, the baseline).
"""

from __future__ import annotations

import os
import time

from ansible_collections.sgdeploy.host.plugins.module_utils.sglang_deploy_files import write_json

SCHEMA = 1
OUTCOMES = ("deployed", "rolled_back", "failed", "unchanged")


def utc_now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def build(config, host, release, outcome, started, patches=(), features=(), unit_digest=None,
          config_digest=None, report=None, rollback=None, message=""):
    if outcome not in OUTCOMES:
        raise ValueError("outcome {!r} is not one of {}".format(outcome, ", ".join(OUTCOMES)))
    report = report or {}
    return {"schema": SCHEMA, "config": config, "config_digest": config_digest, "host": host,
            "release": release, "patches": list(patches), "features": list(features),
            "unit_digest": unit_digest, "started": started, "finished": utc_now(), "outcome": outcome,
            "gates": list(report.get("gates") or []), "bench": report.get("bench"), "rollback": rollback,
            "message": message,
            "exactness": report.get("exactness")}  # the exactness gate's result (sgdeploy.exactness)


def write(records_dir, record):
    """Write ``record`` as <finished>.json (or -N) in ``records_dir``; returns the path."""
    os.makedirs(records_dir, exist_ok=True)
    stamp = record["finished"].replace("-", "").replace(":", "")
    path, n = os.path.join(records_dir, stamp + ".json"), 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(records_dir, f"{stamp}-{n}.json")
    write_json(path, record)
    return path
