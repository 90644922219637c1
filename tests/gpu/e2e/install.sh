# Sourced by tests/gpu/e2e/run.sh and tests/gpu/fullsize/run.sh (GPU machine, repository root): installs the
# releases, sglang-kernel 0.4.6, the wheels and the flashinfer stand-in from the bundle $B into $R once
# ($R/site/.complete), and sets CUDA_HOME. Needs B, R and the function el.
for h in /usr/local/cuda /usr/local/cuda-*; do
  if [ -x "$h/bin/nvcc" ]; then export CUDA_HOME=$h; break; fi
done
el "CUDA_HOME=${CUDA_HOME:-unset}"
if [ ! -f "$R/site/.complete" ]; then
  el "install: releases, sglang-kernel 0.4.6, wheels, flashinfer stand-in"
  python3 tests/gpu/e2e/releases.py "$B" "$R/releases" || exit 1
  mkdir -p "$R/site" "$R/fi-standin"
  tar -C "$R/site" -xJf "$B/sgl_kernel_046_sm90.tar.xz" || exit 1
  tar -C "$R/fi-standin" -xJf "$B/flashinfer_standin.tar.xz" || exit 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$R/site" \
      "$B"/wheels/*.whl 2>&1 | grep -v -i warning
  touch "$R/site/.complete"
fi
