"""E1 of issue 67, target or data? No training: the shipped v5 drafter, teacher forced.

On held-out sequences of the training distribution (``data/smollm2``'s held-out split: from the
first shards, all greedy, and from shards where answers sampled at T 0.7 are mixed in) and on
the target's greedy answers to the benchmark prompts, every drafted depth of every block is
binned by the target's own top-1 probability at that position. Per bin: the share of
positions, the drafter's (corrected head's) accuracy against the label, its agreement with the
target's argmax, and its conditional chain accuracy (the depth is right given every depth
before it is). Per set: how often a label is not the target's argmax (a sampled label), how
often a drafter miss is the target's second choice (a near-tie), and the chain τ.

If the binned curves of the two distributions coincide, the benchmark sets' lower τ comes from
where their positions fall (a target less sure of itself: hard target, near-ties); if the
benchmark's curve is lower bin for bin, the drafter has not learned those contexts (a prompt
mismatch).

    python -m experiments.drafter_v6.e1_confidence_bins --n 40 --heldout-seqs 64

Writes ``e1_results.json`` here.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
EDGES = (0.0, 0.3, 0.5, 0.7, 0.9, 0.99, 1.0001)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=40, help="prompts per benchmark set")
    p.add_argument("--heldout-seqs", type=int, default=64)
    p.add_argument("--anchors", type=int, default=24, help="blocks per sequence")
    p.add_argument("--data", default="data/smollm2")
    p.add_argument("--heldout-shards", type=int, default=46, help="held-out prompts of the "
                   "first answer shards only (their features are computed whole: ~40 MB and "
                   "~10 s a shard)")
    p.add_argument("--mixed-from", type=int, default=230, help="a second held-out set from "
                   "this answer shard on, where the T 0.7 shards begin (0: none)")
    p.add_argument("--mixed-shards", type=int, default=32)
    p.add_argument("--out", default=os.path.join(HERE, "e1_results.json"))
    return p.parse_args(argv)


@functools.lru_cache(maxsize=None)
def _block_facts_fn(dcfg, tcfg):
    import jax
    import jax.numpy as jnp

    from dominotree_jax.train.loss import block_logits, target_soft_logits

    @jax.jit
    def facts(dparams, tparams, batch):
        blocks = block_logits(dcfg, tcfg, dparams, tparams, batch)
        cols = (dparams["d2t"][...] if dcfg.draft_vocab_size is not None
                else jnp.arange(blocks.corr.shape[-1]))
        p_t = jax.nn.softmax(target_soft_logits(tcfg, tparams, batch).astype(jnp.float32), -1)
        top_p, top_i = jax.lax.top_k(p_t, 2)
        return {"label": blocks.targets, "drafted": cols[jnp.argmax(blocks.corr, -1)],
                "p1": top_p[..., 0], "t1": top_i[..., 0], "t2": top_i[..., 1]}
    return facts


def block_facts(dcfg, dparams, target, ds, seq_ids, anchors: int) -> dict:
    """Host arrays ``[N, J]`` over the blocks of ``seq_ids``: label, drafted token (the
    corrected head's argmax), the target's top-1 probability and its two best tokens."""
    import jax
    import jax.numpy as jnp

    from dominotree_jax.train.dataset import make_batch
    fn = _block_facts_fn(dcfg, target.config)
    rng, parts = np.random.default_rng(0), []
    seq_ids = list(seq_ids)
    for i in range(0, len(seq_ids) - 1, 2):
        b = make_batch(ds, seq_ids[i:i + 2], anchors=anchors, block=dcfg.num_draft_positions,
                       rng=rng, answer_frac=1.0)
        parts.append(jax.device_get(fn(dparams, target.params, jax.tree.map(jnp.asarray, b))))
    return {k: np.concatenate([np.asarray(p[k]) for p in parts]) for k in parts[0]}


def summarize(f: dict) -> dict:
    """The bins and the per-set shares described in the module docstring."""
    label, drafted, p1, t1, t2 = (f[k] for k in ("label", "drafted", "p1", "t1", "t2"))
    valid = label >= 0
    right = (drafted == label) & valid
    reached = np.cumprod(np.concatenate([np.ones_like(right[:, :1]), right[:, :-1]], 1), 1)
    reached = reached.astype(bool) & valid          # every depth before is right
    miss = valid & ~right
    full = valid.all(1)
    lead = np.cumprod(right, 1).sum(1)
    bins = []
    for lo, hi in zip(EDGES[:-1], EDGES[1:]):
        at = valid & (p1 >= lo) & (p1 < hi)
        at0, atc = at[:, 0], at & reached
        bins.append({"p1": f"[{lo:.2f}, {min(hi, 1.0):.2f}]",
                     "share": round(float(at.sum() / max(valid.sum(), 1)), 4),
                     "acc": round(float(right[at].mean()) if at.any() else float("nan"), 4),
                     "argmax_agree": round(float((drafted == t1)[at].mean())
                                           if at.any() else float("nan"), 4),
                     "depth0_acc": round(float(right[at0, 0].mean())
                                         if at0.any() else float("nan"), 4),
                     "chain_acc": round(float(right[atc].mean())
                                        if atc.any() else float("nan"), 4),
                     "positions": int(at.sum())})
    return {"blocks": int(len(label)), "positions": int(valid.sum()),
            "chain_tau": round(float(1 + lead[full].mean()), 4),
            "depth0_acc": round(float(right[valid[:, 0], 0].mean()), 4),
            "mean_p1": round(float(p1[valid].mean()), 4),
            "label_not_argmax": round(float((label != t1)[valid].mean()), 4),
            "miss_is_second_choice": round(float((drafted == t2)[miss].mean()), 4),
            "miss_is_argmax_label_not": round(float(((drafted == t1) & (label != t1))[miss]
                                                    .mean()), 4),
            "bins": bins}


def main(argv=None):
    import dominotree_jax as dj
    from convert.drafter import load_drafter
    from dominotree_jax.assets import smollm2_drafter_path, smollm2_gguf_path
    from dominotree_jax.measure.timing import bf16_units, cpu_model
    from dominotree_jax.train.eval.acceptance import DEFAULT_SETS, benchmark_sets, heldout_set

    args = parse_args(argv)
    target = dj.load_target(smollm2_gguf_path())
    dcfg, dparams = load_drafter(smollm2_drafter_path(), dtype="float32",
                                 target_cfg=target.config)
    taps = dcfg.target_layer_ids
    sets = {}
    ds, held = heldout_set(target, args.data, taps, seqs=args.heldout_seqs, trim_loops=16,
                           shards=args.heldout_shards)
    sets[f"heldout, shards 0-{args.heldout_shards - 1} (greedy)"] = summarize(
        block_facts(dcfg, dparams, target, ds, held, args.anchors))
    print(json.dumps(sets), flush=True)
    if args.mixed_from:
        last = args.mixed_from + args.mixed_shards
        ds, held = heldout_set(target, args.data, taps, seqs=args.heldout_seqs, trim_loops=16,
                               shards=last, shard_from=args.mixed_from)
        name = f"heldout, shards {args.mixed_from}-{last - 1} (greedy and T 0.7)"
        sets[name] = summarize(block_facts(dcfg, dparams, target, ds, held, args.anchors))
        print(name, json.dumps(sets[name]), flush=True)
    for name in DEFAULT_SETS:
        ds = benchmark_sets(target, [name], n=args.n, taps=taps)[name]
        sets[name] = summarize(block_facts(dcfg, dparams, target, ds, range(len(ds)),
                                           args.anchors))
        print(name, json.dumps(sets[name]), flush=True)
    out = {"command": "python -m experiments.drafter_v6.e1_confidence_bins "
                      f"--n {args.n} --heldout-seqs {args.heldout_seqs} --anchors {args.anchors} "
                      f"--heldout-shards {args.heldout_shards} --mixed-from {args.mixed_from} "
                      f"--mixed-shards {args.mixed_shards}",
           "machine": f"{cpu_model()} ({bf16_units()}), 2 cores",
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "drafter": "shipped v5 (corrected head, teacher forced, float32 features)",
           "note": "p1: the target's top-1 probability at the position; acc: drafted == label; "
                   "argmax_agree: drafted == the target's argmax; chain_acc: acc where every "
                   "earlier depth of the block is right; held-out answers end at their "
                   "repetition loop (trim 16, as v5 trained)",
           "sets": sets}
    with open(args.out, "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
