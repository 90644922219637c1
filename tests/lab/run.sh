#!/usr/bin/env bash
# Run the lab integration tests on three labs at once (they mostly wait on SSH, systemd and the
# simulated engine, so the streams finish in about a third of the time on a 2-core machine):
#   lab A (LAB_NET, default 127.0.1): deploy, engine-in-a-unit, verify, release, the lab itself, router,
#                                     signals during the gates and the port wait, bad config strings via make,
#                                     faults during a replica rollout
#   lab B (127.0.2):                  provisioning (reboots hosts), models, sweep, the fault matrix
#   lab C (127.0.3):                  monitoring, the budget schedule, multi-node engines, replica-count changes
#                                     (it frees its GPUs at the end: LabHandle.remove_configs), the fleet router
# With WITH_SLOW=1 (make test), the slow CPU tests (tests/unit -m slow: they build CPU virtualenvs and run
# Triton's interpreter) run first in the third stream, then lab C: the CPU-heavy part is over before lab C's
# deploys start. The logs of B, C and the slow tests are printed at the end; every exit status counts.
# Every lab is taken down at the end, also when tests fail. Exit status: the worst of them.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
A_FILES="tests/lab/test_deploy.py tests/lab/test_exactness.py tests/lab/test_engine_unit.py tests/lab/test_verify.py tests/lab/test_release.py tests/lab/test_lab.py tests/lab/test_cli.py tests/lab/test_nondefault.py tests/lab/test_router.py tests/lab/test_interrupts.py tests/lab/test_bad_input.py tests/lab/test_plan_summary.py tests/lab/test_engine_key.py tests/lab/test_replica_faults.py"
# Run after both labs are done, on lab A: these change what both labs share on the controller (build/wheels).
SERIAL_FILES="tests/lab/test_wheel_tamper.py"
B_FILES="tests/lab/test_provision.py tests/lab/test_models.py tests/lab/test_sweep.py tests/lab/test_faults.py tests/lab/test_drift.py tests/lab/test_conflicts.py tests/lab/test_found_rows.py"
# Lab C runs in the third stream, after the slow CPU tests (WITH_SLOW=1) or beside the others (without): the
# monitoring stack, the budget schedule, engines over two hosts, replica-count changes (moved from B: the
# third stream ended earliest), and last the fleet router (test_fleet.py brings
# its lab to 4 hosts; `down` removes them).
C_FILES="tests/lab/test_monitoring.py tests/lab/test_schedule.py tests/lab/test_multinode.py tests/lab/test_replica_changes.py tests/lab/test_fleet.py"
# Every test file must be in one of the groups.
for f in tests/lab/test_*.py; do
  case " $A_FILES $B_FILES $C_FILES $SERIAL_FILES " in *" $f "*) ;; *) echo "tests/lab/run.sh: $f is in no group" >&2; exit 2;; esac
done
export LAB_B_NET=${LAB_B_NET:-127.0.2} LAB_C_NET=${LAB_C_NET:-127.0.3}
b_env=(LAB_NET="$LAB_B_NET" LAB_DIR=build/lab-b LAB_INVENTORY=build/lab-b/inventory.yml)
c_env=(LAB_NET="$LAB_C_NET" LAB_DIR=build/lab-c LAB_INVENTORY=build/lab-c/inventory.yml)

down() {
  "$PY" tests/lab/lab.py down || true
  env "${b_env[@]}" "$PY" tests/lab/lab.py down || true
  env "${c_env[@]}" "$PY" tests/lab/lab.py down || true
}
trap down EXIT

"$PY" tests/lab/lab.py up || exit 1
env "${b_env[@]}" "$PY" tests/lab/lab.py up || exit 1

mkdir -p build
# The third stream: the slow CPU tests (WITH_SLOW=1), then lab C (its own exit status in build/lab-c.rc).
third() {
  local slow_rc=0 c_rc
  if [ "${WITH_SLOW:-0}" = 1 ]; then
    "$PY" -m pytest -p no:cacheprovider -q --durations=10 -m slow tests/unit > build/slow-tests.log 2>&1
    slow_rc=$?
  fi
  echo "$slow_rc" > build/slow-tests.rc
  if env "${c_env[@]}" "$PY" tests/lab/lab.py up > build/lab-c-tests.log 2>&1; then
    env "${c_env[@]}" "$PY" -m pytest -p no:cacheprovider -q --durations=30 $C_FILES >> build/lab-c-tests.log 2>&1
    c_rc=$?
  else
    c_rc=1
  fi
  echo "$c_rc" > build/lab-c.rc
}
rm -f build/slow-tests.rc build/lab-c.rc
third &
third_pid=$!
env "${b_env[@]}" "$PY" -m pytest -p no:cacheprovider -q --durations=30 $B_FILES > build/lab-b-tests.log 2>&1 &
b_pid=$!
"$PY" -m pytest -p no:cacheprovider -q --durations=30 $A_FILES
a_rc=$?
wait "$b_pid"
b_rc=$?
echo "---- lab B (${LAB_B_NET}.x): ${B_FILES}"
cat build/lab-b-tests.log
wait "$third_pid"
c_rc=$(cat build/lab-c.rc 2>/dev/null || echo 1)
slow_rc=$(cat build/slow-tests.rc 2>/dev/null || echo 1)
echo "---- lab C (${LAB_C_NET}.x): ${C_FILES}"
cat build/lab-c-tests.log
echo "---- serial, on lab A after the three: ${SERIAL_FILES}"
"$PY" -m pytest -p no:cacheprovider -q $SERIAL_FILES
s_rc=$?
if [ "${WITH_SLOW:-0}" = 1 ]; then
  echo "---- slow CPU tests (tests/unit -m slow), run before lab C in the third stream"
  cat build/slow-tests.log
fi
echo "---- lab A: exit ${a_rc}; lab B: exit ${b_rc}; lab C: exit ${c_rc}; serial: exit ${s_rc}${WITH_SLOW:+; slow CPU tests: exit ${slow_rc}}"
[ "$a_rc" -eq 0 ] && [ "$b_rc" -eq 0 ] && [ "$c_rc" -eq 0 ] && [ "$s_rc" -eq 0 ] && [ "$slow_rc" -eq 0 ]
