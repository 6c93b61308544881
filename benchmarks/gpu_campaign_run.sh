#!/usr/bin/env bash
# The drafter campaign on a lent GPU (issue 42, item 6; benchmarks/README.md): continue
# experiments/smollm2_campaign/v5 from its committed state for TRAIN_MIN minutes, then hand back everything the
# next window needs. Run from the repository root as the last of consecutive calls on one warm
# machine, exactly as gpu_train_run.sh: the earlier calls each carried one part of the SmolLM2
# GGUF (benchmarks/gpu/carry.py stage) into /tmp/gguf_parts; this one carries the last part and
# the `gguf` wheel (.gpu_wheels/). Writes under $OUT (at most 8 files, each under 16 MiB):
#   campaign_stdout.txt  state.json  train_log.csv  heldout_curve.jsonl  windows.jsonl
#   state/manifest.json  state/state.tar.partNN ...   (state.tar: state_params.npz, state_moments.npz)
# Back here: python -m benchmarks gpu carry join <files_at>/state --out /tmp/state.tar, then
# tar xf /tmp/state.tar -C experiments/smollm2_campaign/v5 and copy the four text files there; commit.
#
#   OUT=/tmp/gpu_camp PY=.venv/bin/python TRAIN_MIN=2 STEPS=2 EVAL=0 CAMPAIGN=/tmp/copy \
#       GGUF=<path> bash benchmarks/gpu_campaign_run.sh          # a CPU rehearsal
set -u
OUT=${OUT:-/tmp/gpu_out}
PY=${PY:-python3}
PARTS=${PARTS:-/tmp/gguf_parts}
GGUF=${GGUF:-/tmp/smollm2.gguf}
CAMPAIGN=${CAMPAIGN:-experiments/smollm2_campaign/v5}
TRAIN_MIN=${TRAIN_MIN:-7}
STEPS=${STEPS:-}
EVAL=${EVAL:-0}   # the benchmark sets are evaluated back on the CPU (their packages)
LOG="$OUT/campaign_stdout.txt"
source "$(dirname "$0")/gpu_prelude.sh"
# the committed state travels in parts too (the tree would pass the call's 64 MiB with it)
for d in .gpu_carry_state/p*; do [ -d "$d" ] && mkdir -p /tmp/state_parts && cp "$d"/* /tmp/state_parts/; done
if [ ! -f "$CAMPAIGN/state_params.npz" ] && [ -f /tmp/state_parts/manifest.json ]; then
  "$PY" -m benchmarks gpu carry join /tmp/state_parts --out /tmp/state_in.tar >> "$LOG" 2>&1 || exit 4
  tar xf /tmp/state_in.tar -C "$CAMPAIGN" || exit 4
fi
DEADLINE=$(date -u -d "+${TRAIN_MIN} min" +%H:%M)
echo "campaign until $DEADLINE UTC" >> "$LOG"
ARGS=(--dir "$CAMPAIGN" --target "$GGUF" --until "$DEADLINE" --ckpt-minutes 2)
[ -n "$STEPS" ] && ARGS+=(--steps "$STEPS")
[ "$EVAL" = "0" ] && ARGS+=(--no-eval)
"$PY" -m experiments.smollm2_campaign.campaign continue "${ARGS[@]}" >> "$LOG" 2>&1
rc=$?
echo "campaign exit code $rc" >> "$LOG"
for f in state.json train_log.csv heldout_curve.jsonl windows.jsonl; do
  [ -f "$CAMPAIGN/$f" ] && cp "$CAMPAIGN/$f" "$OUT/"
done
if [ -f "$CAMPAIGN/state_params.npz" ]; then
  tar cf /tmp/state_out.tar -C "$CAMPAIGN" state_params.npz state_moments.npz
  "$PY" -m benchmarks gpu carry split /tmp/state_out.tar --out "$OUT/state" \
    --part-mib 15 >> "$LOG" 2>&1
fi
tail -n 20 "$LOG"
exit $rc
