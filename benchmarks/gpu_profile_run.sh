#!/usr/bin/env bash
# The GPU issue's profile (issue 47 item 3), one ~7-minute call on a lent GPU, after the suite's
# call (gpu_device_run.sh) or on its own; the image's own python3 / jax, nothing carried.
# Writes 5 files under $OUT:
#   versions.txt  ar_profile.md  ar_profile_log.txt  round_profile.md  round_profile_log.txt
# (1) the 4B AR step kernel by kernel against the bandwidth roof; (2) the 4B pair's ar,
# dominotree and ddtree rounds stage by stage inside the one compiled round (device time per
# stage, idle, wall: stage timings that add up). Each has its own time limit; the round
# profile rewrites its report after every method.
#
#   device tool: run(command="bash benchmarks/gpu_profile_run.sh", timeout_s=450)
#   elsewhere:   OUT=/tmp/gpu_out bash benchmarks/gpu_profile_run.sh
set -u
OUT=${OUT:-/tmp/gpu_out}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# kernels run from a command buffer (a CUDA graph, XLA's default) are profiled under the buffer's
# name, not their instruction's: off for both profiles (each report prints its XLA_FLAGS and the
# share of kernel time it matched)
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer="
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -3
  "$PY" -c "import jax; d = jax.devices()[0]; print('jax', jax.__version__, jax.devices(), d.device_kind)"
} > "$OUT/versions.txt" 2>&1
timeout 150 "$PY" -m benchmarks gpu ar_profile --pair qwen3-4b-domino \
  --out "$OUT/ar_profile.md" > "$OUT/ar_profile_log.txt" 2>&1
echo "ar_profile exit code $?" >> "$OUT/versions.txt"
timeout 250 "$PY" -m benchmarks gpu round_profile --pair qwen3-4b-domino \
  --methods ar dominotree ddtree --out "$OUT/round_profile.md" \
  > "$OUT/round_profile_log.txt" 2>&1
rc=$?
echo "round_profile exit code $rc" >> "$OUT/versions.txt"
cat "$OUT/versions.txt"
tail -n 12 "$OUT/round_profile.md" 2>/dev/null
exit $rc
