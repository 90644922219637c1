#!/bin/bash
# The full-size step-cost run on the GPU machine (tests/gpu/fullsize/README.md). From the repository root,
# with the e2e bundle carried as .gpu-e2e (make gpu-server-bundle, then full_plan.py --out
# .gpu-e2e/plan-fullsize.json):
#     bash tests/gpu/fullsize/run.sh OUT [SECONDS] [SERVERS]
# SECONDS (default 540): everything, servers stopped and results written, ends within it.
# SERVERS: comma-separated names of the plan (default: all); they run in the plan's order of importance,
# whatever order they are given in (e.g. ddtree-b32,ddtree-sched,ddtree-b15 runs ddtree-b15, ddtree-sched, ddtree-b32).
set -u
OUT=${1:?usage: run.sh OUT [SECONDS] [SERVERS]}
BUDGET=${2:-540}
ONLY=${3:-}
T0=$(date +%s)
DEADLINE=$((T0 + BUDGET - 10))
B=.gpu-e2e
R=/tmp/gpu-e2e
HERE=tests/gpu/fullsize
mkdir -p "$OUT" "$R"
exec > >(tee -a "$OUT/run.log") 2>&1
el() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
if [ "$BUDGET" -lt 300 ]; then
  echo "run.sh: SECONDS $BUDGET: give at least 300 (install about 40 s, a full-size server start 100-170 s)" >&2
  exit 2
fi
[ -f "$B/plan-fullsize.json" ] || { echo "run.sh: $B/plan-fullsize.json missing: run make gpu-server-bundle and tests/gpu/fullsize/full_plan.py --out $B/plan-fullsize.json, and carry $B" >&2; exit 2; }
el "fullsize, budget ${BUDGET}s; $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv,noheader
python3 -c 'import sys, torch, triton, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)'
source tests/gpu/e2e/install.sh  # releases, kernels, wheels, stand-in; CUDA_HOME
el "full-size model configs"
python3 "$HERE/models.py" "$R/fullsize/models" || exit 1
el "runner"
python3 "$HERE/full_runner.py" --plan "$B/plan-fullsize.json" --out "$OUT" --deadline "$DEADLINE" \
    ${ONLY:+--only "$ONLY"} ${RUNNER_ARGS:-}
el "done"
