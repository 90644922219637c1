#!/bin/bash
# The end-to-end harness on the GPU machine (tests/gpu/e2e/README.md). From the repository root, with the
# bundle (make gpu-server-bundle) carried as .gpu-e2e:
#     bash tests/gpu/e2e/run.sh OUT [SET: a name of plan.py's SETS, e.g. core, treeconv] [SECONDS]
# SECONDS (default 540): everything, servers stopped and results written, ends within it.
set -u
#     bash tests/gpu/e2e/run.sh OUT train [SECONDS]      (install, then train the learned pair: tests/gpu/learned)
OUT=${1:?usage: run.sh OUT [core|extra|all|train|...] [SECONDS]}
SET=${2:-core}
BUDGET=${3:-540}
T0=$(date +%s)
DEADLINE=$((T0 + BUDGET - 15))
B=.gpu-e2e
R=/tmp/gpu-e2e
HERE=tests/gpu/e2e
mkdir -p "$OUT" "$R"
exec > >(tee -a "$OUT/run.log") 2>&1
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
if [ "$SET" != train ] && [ "$BUDGET" -lt 420 ]; then
  # 2026-12-01 call 2 (set recheck, 330 s): every DDTree server was still starting when the runner's wait ended.
  echo "run.sh: SECONDS $BUDGET: give at least 420 (install about 40 s, DDTree server starts 180-220 s," \
       "then the runner keeps 120 s for the experiments)" >&2
  exit 2
fi
[ "$SET" = train ] || [ -f "$B/plan-$SET.json" ] || { echo "run.sh: $B/plan-$SET.json missing: run make gpu-server-bundle and carry $B" >&2; exit 2; }
el "set $SET, budget ${BUDGET}s; $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
python3 -c 'import sys, torch, triton, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'
source tests/gpu/e2e/install.sh  # releases, kernels, wheels, stand-in; CUDA_HOME
learned=0
if [ "$SET" = train ] || python3 -c "import json, sys; sys.exit(0 if json.load(open('$B/plan-$SET.json')).get('learned') else 1)"; then
  learned=1
fi
if [ "$learned" = 1 ]; then
  # The trained pair (tests/gpu/learned/README.md): kept under $R/learned while the machine stays warm; a fresh
  # machine trains it again (about 7 minutes: a call of its own).
  LEFT=$((DEADLINE - $(date +%s)))
  if [ ! -f "$R/learned/done.json" ] || [ "$SET" = train ]; then
    el "learned pair: train (or keep) within $((LEFT - 20)) s"
    python3 tests/gpu/learned/train_pair.py --models "$R/learned" --out "$OUT/learned" \
        --seconds "${TRAIN_SECONDS:-$(( (LEFT - 20) * 100 / 125 ))}" || exit 1
  fi
  if [ "$SET" = train ]; then
    # With time left: start AR, DFLASH 16 and DDTREE 64 on the pair (a first look at acceptance, and the JIT and
    # Triton caches warm for the next call on this machine).
    if [ $((DEADLINE - $(date +%s))) -ge 200 ] && [ -f "$B/plan-budget.json" ]; then
      el "first look: ar, dflash, ddtree-b64-k16"
      python3 "$HERE/runner.py" --plan "$B/plan-budget.json" --out "$OUT/check" --deadline "$DEADLINE" \
          --only ar,dflash,ddtree-b64-k16 --serve-margin 45
    fi
    el "done"; exit 0
  fi
  [ -f "$R/learned/done.json" ] || { echo "run.sh: no trained pair in $R/learned" >&2; exit 1; }
elif [ ! -f "$R/models/drafter/config.json" ]; then
  el "tiny models"
  python3 "$HERE/tiny_models.py" "$R/models" 2>&1 | tail -n 1
fi
el "runner"
python3 "$HERE/runner.py" --plan "$B/plan-$SET.json" --out "$OUT" --deadline "$DEADLINE" ${RUNNER_ARGS:-}
el "done"
