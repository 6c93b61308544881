#!/usr/bin/env bash
# The prepared one-shot GPU run (benchmarks/README.md), run from the repository root: fits one
# 10-minute call on a lent H200 with the image's own python3 / jax (no wheels to carry) and
# writes 6 files under $OUT, and 2 more when the AR step's profile has time left after the suite:
#   nvidia_smi.txt  versions.txt  gpu_suite.md  gpu_suite.json  suite_stdout.txt  suite_stderr.txt
#   ar_profile.md  ar_profile_log.txt
# The suite runs the Qwen3-4B + Domino pair first, stops compiling at --deadline minus
# --reserve, and rewrites gpu_suite.md/.json after every method, so even a kill keeps what it had.
#
#   device tool: run(command="bash benchmarks/gpu_device_run.sh", timeout_s=600)
#   elsewhere:   OUT=/tmp/gpu_out bash benchmarks/gpu_device_run.sh
set -u
OUT=${OUT:-/tmp/gpu_out}
PY=${PY:-python3}
SUITE_SECONDS=${SUITE_SECONDS:-500}   # the suite's deadline; the call's limit is 600 s
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi > "$OUT/nvidia_smi.txt" 2>&1
{
  "$PY" --version
  "$PY" -m pip list 2>/dev/null | grep -i -E "^(jax|jaxlib|jax-cuda|flax|numpy|ml.dtypes|triton) "
  "$PY" -c "import jax; d = jax.devices()[0]; print(jax.devices(), d.device_kind, getattr(d, 'compute_capability', None))"
  echo "XLA_FLAGS=${XLA_FLAGS:-}"
} > "$OUT/versions.txt" 2>&1
timeout $((SUITE_SECONDS + 50)) "$PY" -m benchmarks gpu suite \
  --deadline "$SUITE_SECONDS" --reserve 60 --compile-cache /tmp/jax_cache \
  --pairs qwen3-4b-domino,qwen3-8b-domino --kernel-variants 4x1,8x1,4x2 \
  --out "$OUT/gpu_suite.md" > "$OUT/suite_stdout.txt" 2> "$OUT/suite_stderr.txt"
rc=$?
echo "gpu suite exit code $rc" >> "$OUT/suite_stdout.txt"
# the AR step kernel by kernel (issue 47), in what is left of the call's 600 s
left=$((590 - SECONDS))
if [ "$left" -gt 90 ]; then
  # command buffers off: a kernel run from a CUDA graph is profiled under the graph's name
  XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=" \
  timeout "$left" "$PY" -m benchmarks gpu ar_profile --pair qwen3-4b-domino \
    --out "$OUT/ar_profile.md" > "$OUT/ar_profile_log.txt" 2>&1
  echo "ar_profile exit code $? ($left s left for it)" >> "$OUT/suite_stdout.txt"
fi
tail -n 40 "$OUT/suite_stdout.txt"
exit $rc
