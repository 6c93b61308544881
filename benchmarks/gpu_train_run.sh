#!/usr/bin/env bash
# The prepared drafter-training run on a lent GPU (issue 21; benchmarks/README.md), from the
# repository root, as the last of consecutive calls on one warm machine: the earlier calls each
# carried one part of the SmolLM2 GGUF (benchmarks/gpu/carry.py) into /tmp/gguf_parts, this one
# carries the last part and the `gguf` wheel (.gpu_wheels/; the image lacks the package). It
# joins and checks the GGUF, trains a fresh drafter with drafter_v4 §8's recipe in bf16 until
# TRAIN_MIN minutes from now, exports it and writes at most 8 files under $OUT:
#   train_stdout.txt  heldout_curve.jsonl  train_log.csv  heldout_metrics.json  config.json
#   drafter/manifest.json  drafter/model.safetensors.part00  drafter/model.safetensors.part01
# Back here: python -m benchmarks gpu carry join <files_at>/drafter --out runs/v4g/model.safetensors
#
#   OUT=/tmp/gpu_train PY=.venv/bin/python TRAIN_MIN=2 STEPS=20 SHARD_FROM=404 SHARDS=406 \
#       GGUF=<path> bash benchmarks/gpu_train_run.sh          # the CPU rehearsal (tests/)
set -u
OUT=${OUT:-/tmp/gpu_out}
PY=${PY:-python3}
PARTS=${PARTS:-/tmp/gguf_parts}
GGUF=${GGUF:-/tmp/smollm2.gguf}
RUN=${RUN:-/tmp/v4g}
TRAIN_MIN=${TRAIN_MIN:-7}
STEPS=${STEPS:-1700}
BATCH=${BATCH:-32}
SHARD_FROM=${SHARD_FROM:-200}
SHARDS=${SHARDS:-300}
mkdir -p "$RUN"
LOG="$OUT/train_stdout.txt"
source "$(dirname "$0")/gpu_prelude.sh"
DEADLINE=$(date -u -d "+${TRAIN_MIN} min" +%H:%M)
echo "training until $DEADLINE UTC" >> "$LOG"
"$PY" -m dominotree_jax.train --stage train --target "$GGUF" --data data/smollm2 --out "$RUN" \
  --features "$RUN/features" --dtype bfloat16 --feature-precision bfloat16 \
  --shard-from "$SHARD_FROM" --shards "$SHARDS" --layers 2 --layer-init target \
  --anchor-mode all --anchors 24 --lam-hold 0.1 --lam-ramp 0.4 --lam-end 0.2 --lr 6e-4 \
  --warmup 50 --batch "$BATCH" --steps "$STEPS" --eval-every 250 --curve-seqs 32 \
  --ckpt-minutes 3 --deadline "$DEADLINE" >> "$LOG" 2>&1
rc=$?
echo "train exit code $rc" >> "$LOG"
"$PY" -m dominotree_jax.train --stage export --target "$GGUF" --data data/smollm2 --out "$RUN" \
  --features "$RUN/features" --export-dir "$RUN/export" --eval-seqs 32 >> "$LOG" 2>&1
echo "export exit code $?" >> "$LOG"
for f in heldout_curve.jsonl train_log.csv heldout_metrics.json; do
  [ -f "$RUN/$f" ] && cp "$RUN/$f" "$OUT/"
done
if [ -f "$RUN/export/model.safetensors" ]; then
  cp "$RUN/export/config.json" "$OUT/" 2>/dev/null
  "$PY" -m benchmarks gpu carry split "$RUN/export/model.safetensors" --out "$OUT/drafter" \
    --part-mib 15 >> "$LOG" 2>&1
fi
tail -n 30 "$LOG"
exit $rc
