"""SIGINT and SIGTERM to ansible-playbook during the gates and during the wait for free ports (issue 20).

The rest of the fault matrix is tests/lab/test_faults.py (lab B); these cases run on lab A, the shorter
stream of `make test-lab`, with the same baseline and the same checks: after each, the next deploy
takes the lock over with a message, rolls the interrupted switch back, serves the baseline again, and
the record and `make status` say what happened.
"""

from __future__ import annotations

import signal

import pytest
from test_faults import B15, a_signal_is_rolled_back_by_the_next_deploy, baseline  # noqa: F401 (baseline: fixture)

pytestmark = pytest.mark.lab

# A request of 4 000 tokens takes the simulated engine about 18 s: the old engine drains it after
# SIGTERM, so the switch sits in its wait for the stopped unit and the free port.
LONG_REQUEST = ("setsid curl -s -o /dev/null -X POST http://ADDRESS:30000/generate "
                "-H 'Content-Type: application/json' "
                "-d '{\"text\": \"Hello\", \"sampling_params\": {\"max_new_tokens\": 4000}}' "
                "</dev/null >/dev/null 2>&1 &")
STEPS = {
    # The gates of ddtree-b32 (replacing the baseline on its port) run for several seconds in the lab.
    "gates": dict(step="gating", config="ddtree-b32"),
    # The old engine drains a long request: the unit is deactivating and port 30000 still taken.
    "port-wait": dict(step="stopping", config="ddtree-b32", meanwhile=LONG_REQUEST,
                      during=f"test \"$(systemctl is-active {B15})\" = deactivating"),
}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("where", STEPS)
def test_a_signal_during_the_gates_or_the_port_wait_is_rolled_back_by_the_next_deploy(lab, where, sig):
    case = {k: v.replace("ADDRESS", lab.address("lab1")) for k, v in STEPS[where].items()}
    a_signal_is_rolled_back_by_the_next_deploy(lab, sig, **case)
