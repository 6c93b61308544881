#!/usr/bin/env bash
# v4d: a fresh run of §8's recipe on 40 loop-stopped v4 shards (300-339), bf16 on an AMX Xeon.
cd "$(git rev-parse --show-toplevel)"   # run from anywhere inside the repository
exec nice -n 19 .venv/bin/python -m dominotree_jax.train --stage train --data data/smollm2 --out runs/v4d \
  --dtype bfloat16 --feature-precision bfloat16 --shard-from 300 --shards 340 --layers 2 --layer-init target \
  --anchor-mode all --anchors 24 --lam-hold 0.1 --lam-ramp 0.4 --lam-end 0.2 --lr 6e-4 --warmup 50 \
  --steps 1600 --eval-every 250 --curve-seqs 32 --keep-best shipped --ckpt-minutes 5 --deadline "$1"
