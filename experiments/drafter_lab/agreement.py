"""How often a stored greedy answer token is the target's own argmax, teacher-forced.

The drafter learns the target's greedy continuations, so the data should be what the target
writes. Answers collected in bf16 (``collect --precision bfloat16``) part from float32 greedy
decoding where two tokens' logits are within bf16 rounding of each other (docs/precision.md),
and a row's tokens after such a parting are still the target's argmax given what came before.
This tool measures it: every greedy answer shard's rows go through the target in ``--precision``
(one causal forward over prompt + answer), and each answer token is compared with the argmax at
the position before it.

    python -m experiments.drafter_lab agreement --data data/smollm2 --shard-from 362 --shards 368

Prints one line per shard (its generation dtype, answer tokens, the share equal to the argmax,
rows equal throughout) and the totals per generation dtype. Sampled shards (temperature > 0)
are skipped: their tokens are draws, not argmaxes.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.config import TargetConfig
from dominotree_jax.model.target import bind_target
from dominotree_jax.train.features import padded_batches, teacher_forced


@functools.partial(jax.jit, static_argnames=("cfg",))
def next_token_argmax(tparams, tokens_BT, *, cfg: TargetConfig):
    """int32 ``[B, T]``: the target's argmax after positions ``0..T-1`` of a causal forward
    (the features stage's teacher-forced forward, then the LM head)."""
    _, hidden = teacher_forced(tparams, tokens_BT, cfg=cfg, taps=())
    return jnp.argmax(bind_target(cfg, tparams).logits(hidden), axis=-1).astype(jnp.int32)


def answer_agreement(tcfg: TargetConfig, tparams, rows, batch: int = 8) -> dict:
    """Over ``rows`` (``(token ids, prompt length)``): answer tokens, how many equal the
    target's argmax after the tokens before them, and rows whose every answer token does."""
    for ids, p in rows:
        if not 0 < p < len(ids):
            raise ValueError(f"a row of {len(ids)} tokens with prompt length {p}: no answer to "
                             "compare")
    tokens = agree = rows_same = 0
    for idx, toks in padded_batches([ids for ids, _ in rows], batch):
        pred = np.asarray(next_token_argmax(tparams, jnp.asarray(toks), cfg=tcfg))
        for r, i in enumerate(idx):
            ids, p = rows[i]
            same = pred[r, p - 1:len(ids) - 1] == ids[p:]
            tokens += same.size
            agree += int(same.sum())
            rows_same += bool(same.all())
    return {"rows": len(rows), "tokens": tokens, "agree": agree, "rows_same": rows_same}


def main(argv=None):
    from dominotree_jax.precision import add_precision_argument
    p = argparse.ArgumentParser(prog="python -m experiments.drafter_lab agreement",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="data directory (manifest + shards)")
    p.add_argument("--target", default=None, help="target checkpoint (default: SmolLM2 GGUF)")
    add_precision_argument(p, pairs=False, help="the precision of the teacher-forced target")
    p.add_argument("--shard-from", type=int, default=0, help="first answer shard (index)")
    p.add_argument("--shards", type=int, default=None, help="answer shards before this index")
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args(argv)

    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_gguf_path
    from dominotree_jax.measure.timing import cpu_model
    from dominotree_jax.train.data.shards import ShardStore

    target = dj.load_target(args.target or smollm2_gguf_path(), precision=args.precision)
    store = ShardStore(args.data, vocab_size=target.config.vocab_size)
    entries = store.entries("answers")
    stop = len(entries) if args.shards is None else args.shards
    if not 0 <= args.shard_from < stop <= len(entries):
        raise SystemExit(f"--shard-from {args.shard_from} --shards {stop}: the data has "
                         f"{len(entries)} answer shards")
    print(f"teacher-forced {args.precision} target on {cpu_model()}; greedy answer shards "
          f"{args.shard_from}..{stop - 1} of {args.data}")
    totals: dict[str, dict] = {}
    for entry in entries[args.shard_from:stop]:
        if entry.get("temperature", 0.0) > 0:
            continue
        rows = [(ids, plen) for ids, plen, _ in store.entry_rows(entry)]
        got = answer_agreement(target.config, target.params, rows, args.batch)
        gen = entry.get("dtype", "float32")
        t = totals.setdefault(gen, {"shards": 0, "rows": 0, "tokens": 0, "agree": 0,
                                    "rows_same": 0})
        t["shards"] += 1
        for k in ("rows", "tokens", "agree", "rows_same"):
            t[k] += got[k]
        print(f"{entry['file']} (generated {gen}): {got['tokens']} answer tokens, "
              f"{got['agree'] / got['tokens']:.4%} the argmax; rows equal throughout "
              f"{got['rows_same']}/{got['rows']}", flush=True)
    if not totals:
        raise SystemExit("no greedy answer shard in that range")
    for gen, t in totals.items():
        print(f"generated {gen}: {t['shards']} shards, {t['tokens']} answer tokens, "
              f"{t['agree'] / t['tokens']:.4%} the {args.precision} argmax; rows equal throughout "
              f"{t['rows_same']}/{t['rows']} ({t['rows_same'] / t['rows']:.1%})")
    return totals
