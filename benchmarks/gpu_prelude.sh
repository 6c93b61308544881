# Sourced by gpu_train_run.sh and gpu_campaign_run.sh (needs OUT, PY, PARTS, GGUF, LOG): the
# machine and versions into $LOG, the carried `gguf` wheel (.gpu_wheels/) installed, and the
# SmolLM2 GGUF joined from its carried parts (benchmarks/gpu/carry.py; sizes and SHA-256
# checked). Exits 2 (wheel) or 3 (GGUF) on failure.
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | head -3
  "$PY" -c "import jax; print('jax', jax.__version__, jax.devices())"
} > "$LOG" 2>&1
if [ -d .gpu_wheels ] && ls .gpu_wheels/*.whl > /dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu_wheels/*.whl \
    >> "$LOG" 2>&1 || { echo "wheel install failed" >> "$LOG"; exit 2; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
for d in .gpu_carry/p*; do [ -d "$d" ] && mkdir -p "$PARTS" && cp "$d"/* "$PARTS"/; done
if [ ! -f "$GGUF" ]; then
  "$PY" -m benchmarks gpu carry join "$PARTS" --out "$GGUF" >> "$LOG" 2>&1 || exit 3
fi
