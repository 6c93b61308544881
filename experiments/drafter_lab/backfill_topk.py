"""Stored top-k target logits for answer shards that were collected without them.

    python -m experiments.drafter_lab backfill-topk --data DIR --out runs/topk_data \
        --shards 4 --k 32

Writes a new data directory (the source one is left as it is) holding the source's first N
answer shards, row for row, with ``topk_ids`` / ``topk_logits`` added: the target's K largest
next-token logits at every position that predicts an answer token, from the same teacher-forced
forward ``collect --store-topk`` runs after each batch (``generate.answer_topk``), so the
values are those a collection with ``--store-topk K`` would have stored. That makes the soft
top-k recipe option (``--soft-topk``) testable on data that already exists. Each manifest
entry keeps the source entry's description, with ``"topk": K`` and ``"topk_backfilled_from"``.
Resumable: shards already in ``--out`` are kept.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dominotree_jax.train.data.generate import PROMPT_BUCKETS, answer_topk, bucket
from dominotree_jax.train.data.shards import ShardStore

# widths of one top-k forward (prompt + answer: up to 1,024 + 512 tokens)
WIDTHS = PROMPT_BUCKETS + (1536, 2048)
_COUNTS = ("file", "kind", "rows", "prompt_tokens", "answer_tokens", "created_utc", "topk")


def backfill(target, src: ShardStore, out: ShardStore, *, shards: int, k: int,
             rows_per_forward: int = 8, log=print) -> int:
    """Copy ``src``'s first ``shards`` answer shards into ``out`` with top-``k`` logits added
    (shards already in ``out`` are skipped; they must be the source's, in order). Returns the
    number of shards written by this call."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    entries = src.entries("answers")
    if shards > len(entries):
        raise ValueError(f"{src.root} has {len(entries)} answer shards, asked for {shards}")
    done = out.entries("answers")
    for have, want in zip(done, entries):
        if have.get("topk_backfilled_from") != want["file"]:
            raise ValueError(f"{out.root} already holds {have['file']}, which is not a backfill "
                             f"of {want['file']}: use an empty or matching --out")
    written = 0
    for entry in entries[len(done):shards]:
        t0 = time.time()
        rows = [(t.tolist(), plen, source) for t, plen, source in src.entry_rows(entry)]
        ids, vals = [], []
        for c in range(0, len(rows), rows_per_forward):
            part = rows[c:c + rows_per_forward]
            i, v = answer_topk(target, part, k, bucket(max(len(t) for t, _, _ in part), WIDTHS))
            ids.append(i)
            vals.append(v)
        info = {key: val for key, val in entry.items() if key not in _COUNTS}
        e = out.append("answers", rows, {**info, "topk_backfilled_from": entry["file"]},
                       topk=(np.concatenate(ids), np.concatenate(vals)))
        written += 1
        log(f"{e['file']}: {e['rows']} rows, {e['answer_tokens']} answer positions, top-{k} "
            f"in {time.time() - t0:.0f}s")
    return written


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.drafter_lab backfill-topk",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="source data directory (read only)")
    p.add_argument("--out", required=True, help="the new data directory")
    p.add_argument("--shards", type=int, required=True, help="the first N answer shards")
    p.add_argument("--k", type=int, default=32)
    p.add_argument("--target", default=None, help="target checkpoint (default: SmolLM2 GGUF)")
    args = p.parse_args(argv)
    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_gguf_path
    target = dj.load_target(args.target or smollm2_gguf_path(), tokenizer=False)
    src = ShardStore(args.data, vocab_size=target.config.vocab_size)
    out = ShardStore(args.out, vocab_size=target.config.vocab_size,
                     tokenizer=src.manifest.get("tokenizer"))
    n = backfill(target, src, out, shards=args.shards, k=args.k)
    print(f"{n} shard(s) written to {args.out}")
    return 0
