#!/usr/bin/env bash
# Today's targets on a lent GPU (issue 63), one 10-minute call, run from the repository root:
# the suite's rounds for Qwen3.5-4B (Gated DeltaNet hybrid) and Qwen3-Coder-30B-A3B (128
# experts) with DFlash-b16 drafters, random weights of the real shapes in bf16 (the 30B pair
# needs ~62 GB: an H100 or H200). Writes 5 files under $OUT:
#   versions.txt  gpu_suite.md  gpu_suite.json  suite_stdout.txt  suite_stderr.txt
#
#   device tool: run(command="bash benchmarks/gpu_targets_run.sh", timeout_s=600)
#   elsewhere:   OUT=/tmp/gpu_out bash benchmarks/gpu_targets_run.sh
set -u
OUT=${OUT:-/tmp/gpu_out}
PY=${PY:-python3}
SUITE_SECONDS=${SUITE_SECONDS:-520}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{
  nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1
  "$PY" -c "import jax; print(jax.__version__, jax.devices())"
} > "$OUT/versions.txt" 2>&1
timeout $((SUITE_SECONDS + 50)) "$PY" -m benchmarks gpu suite \
  --deadline "$SUITE_SECONDS" --reserve 60 --compile-cache /tmp/jax_cache --skip-kernel \
  --pairs qwen3.5-4b-dflash,qwen3-coder-30b-a3b-dflash \
  --out "$OUT/gpu_suite.md" > "$OUT/suite_stdout.txt" 2> "$OUT/suite_stderr.txt"
echo "gpu suite exit code $?" >> "$OUT/suite_stdout.txt"
tail -n 40 "$OUT/suite_stdout.txt"
