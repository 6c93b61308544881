"""Lookup drafting's acceptance table: P(depth d accepted | depths < d accepted) by matched
n-gram length, measured on the target's own greedy answers (the held-out prompts of a data
directory), as ``decode`` would meet them: at every answer position the best lookup path
(``lookup.lookup_candidates``, one candidate) is compared with the answer's next tokens.

    python -m benchmarks methods lookup_table --data data/smollm2 --seqs 400 \\
        --json benchmarks/results/lookup/acceptance_table.json

Also reports what one lookup path alone would commit per round (``1 + E[accepted]``).
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def measure(ds, ids, *, length: int = 8, ngram_max: int = 4, window: int = 1024) -> dict:
    import jax
    import jax.numpy as jnp

    from dominotree_jax.decoding.lookup import lookup_candidates
    fn = jax.jit(lambda s, t: lookup_candidates(s, t, num=1, length=length, ngram_min=1,
                                                ngram_max=ngram_max, window=window))
    tries = np.zeros((ngram_max + 1, length), np.int64)
    hits = np.zeros((ngram_max + 1, length), np.int64)
    accepted, rounds = 0, 0
    for j in ids:
        seq, L = ds.row(int(j))
        E = len(seq)
        W = -(-E // 256) * 256
        pos = np.arange(max(L, 1), E)   # the prefix seq[:t] decides the lookup for seq[t:]
        padded = np.zeros((len(pos), W), np.int32)
        padded[:, :E] = seq
        c = jax.device_get(fn(jnp.asarray(padded), jnp.asarray(pos, jnp.int32)))
        for b, t in enumerate(pos):
            n = int(c.ngram_BK[b, 0])
            ok = True
            run = 0
            for d in range(length):
                if not ok or t + d >= E or not c.valid_BKL[b, 0, d]:
                    break
                tries[n, d] += 1
                ok = int(c.tokens_BKL[b, 0, d]) == int(seq[t + d])
                hits[n, d] += ok
                run += ok
            accepted += run
            rounds += 1
    return {"tries": tries.tolist(), "hits": hits.tolist(),
            "accept": np.round(hits / np.maximum(tries, 1), 4).tolist(),
            "positions": rounds, "mean_accepted_one_path": accepted / max(rounds, 1)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="data/smollm2")
    ap.add_argument("--seqs", type=int, default=400, help="held-out sequences")
    ap.add_argument("--heldout-pct", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from dominotree_jax.train.dataset import SequenceDataset
    from dominotree_jax.train.features import TokensOnly
    from dominotree_jax.train.data.shards import ShardStore

    ds = SequenceDataset(ShardStore(args.data), TokensOnly(), seq_len=1 << 20)
    _, held = ds.split(args.heldout_pct)
    out = measure(ds, held[:args.seqs])
    out["settings"] = vars(args)
    print(json.dumps({k: out[k] for k in ("accept", "positions", "mean_accepted_one_path")}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
