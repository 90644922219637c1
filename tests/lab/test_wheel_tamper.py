"""Issue 34 item 5: a wheel changed on the controller after its build is refused before anything changes.

Apart from tests/lab/test_drift.py because it changes the controller's shared `build/wheels/` for a moment:
`tests/lab/run.sh` runs it after both labs are done (a deploy of the other lab in that moment would be
refused too: the CI run of 2026-12-03 saw exactly that).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from test_deploy import deploy, output_of
from test_faults import (
    B15,
    STATE,
    baseline,  # noqa: F401 (the module's baseline: ddtree-b15 on lab1, autouse)
    main_pid,
)

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]


def test_a_wheel_changed_after_its_build_is_refused_and_nothing_is_touched(lab):
    release = json.loads(lab.ssh("lab1", f"cat {STATE}/ddtree-b15/current.json").stdout)["release"]
    wheel = next((REPO / "build" / "wheels").glob(f"sglang-*+{release}-*.whl"))
    good = wheel.read_bytes()
    pid = main_pid(lab, B15)
    try:
        with wheel.open("ab") as f:
            f.write(b"\0")
        tampered = hashlib.sha256(wheel.read_bytes()).hexdigest()
        proc = deploy(lab, "ddtree-b15")
        out = output_of(proc)
        assert proc.returncode != 0, out[-3000:]
        assert (f"wheel {wheel}: sha256 {tampered} is not {hashlib.sha256(good).hexdigest()}, the digest recorded at "
                "its build" in out), out[-3000:]
        assert "Traceback" not in out
    finally:
        wheel.write_bytes(good)
    assert main_pid(lab, B15) == pid  # the service was not touched
    assert lab.ssh("lab1", "test -e /run/sglang-deploy.lock", check=False).returncode != 0
