"""Teacher-forced acceptance of draft *trees* versus chains on held-out greedy answers.

    python -m experiments.drafter_lab tree --drafter shipped --data data/smollm2 \
        --shards 6 --seqs 16 --anchors 16 --json OUT.json

At T = 0 the target's continuation of a stored greedy answer is the answer itself, so the
tokens a round accepts can be computed without a verify forward. For a block anchored at ``a``,
the labels are ``x_{a+1} … x_{a+J}``. A chain accepts its leading correct depths. A tree
accepts the longest path from the root whose tokens are those labels (the walk of
docs/algorithm.md §5). The drafter's outputs are exactly the ones decoding computes after
committing ``x_0 … x_{a-1}`` (``loss.block_logits``' path). The trees come from the real
builder (``build_tree_from_head``).

For each configuration we report:

- τ (accepted + 1);
- the histogram of accepted depths;
- how many nodes the tree puts at each depth (width versus depth);
- how often the labels' path is still inside the tree at each depth ("reach").

The configurations cover the chain, ``ddtree``, ``condstatic`` and ``dominotree``, at budget 8
(the chain's node count) and 16, for several ``node_topk`` values.
"""

from __future__ import annotations

import argparse
import json
import os

DEFAULT_CONFIGS = ("domino", "dflash", "ddtree:8:8", "condstatic:8:8", "dominotree:8:8",
                   "dominotree:8:4", "dominotree:8:2", "dominotree:8:1", "ddtree:16:8",
                   "condstatic:16:8", "dominotree:16:8", "dominotree:16:4", "dominotree:16:2")


def parse_config(spec: str) -> tuple[str, int, int]:
    """``method`` (chains) or ``method:budget:node_topk`` (trees)."""
    parts = spec.split(":")
    if parts[0] in ("domino", "dflash") and len(parts) == 1:
        return parts[0], 0, 0
    if len(parts) != 3 or parts[0] not in ("ddtree", "condstatic", "dominotree"):
        raise ValueError(f"bad configuration {spec!r}: 'domino', 'dflash' or "
                         "'ddtree|condstatic|dominotree:BUDGET:NODE_TOPK'")
    return parts[0], int(parts[1]), int(parts[2])


def tree_accepted(tokens_AN, parents_AN, valid_AN, labels_AJ):
    """Accepted nodes per block: the walk from the root along nodes whose token is the next
    label (lowest index first among duplicates), stopping at the first miss or a missing label
    (NumPy, host side)."""
    import numpy as np
    A, J = labels_AJ.shape
    out = np.zeros(A, np.int64)
    for b in range(A):
        cur = -1
        for d in range(J):
            lab = labels_AJ[b, d]
            if lab < 0:
                break
            hit = np.flatnonzero(valid_AN[b] & (parents_AN[b] == cur) & (tokens_AN[b] == lab))
            if not len(hit):
                break
            cur = int(hit[0])
            out[b] += 1
    return out


def block_outputs(dcfg, tcfg, dparams, tparams, batch):
    """``(z [B·A, J, H], base [B·A, J, V], t0 [B·A], labels [B·A, J])`` of every block of
    ``batch`` (the drafter's outputs at inference for each anchor; see ``loss.block_logits``)."""
    from dominotree_jax.model.drafter import bind_drafter
    from dominotree_jax.model.target import bind_target
    from dominotree_jax.train.loss import anchored_blocks
    drafter, target = bind_drafter(dcfg, dparams), bind_target(tcfg, tparams)
    ctx_A, t0, anchor_A, lab = anchored_blocks(drafter, dcfg, batch)
    z, base = drafter.draft(target, ctx_A, t0, anchor_A)
    return z, base, t0, lab[:, 1:dcfg.num_draft_positions + 1]


def measure(dcfg, dparams, tcfg, tparams, ds, seq_ids, configs, *, anchors: int, seed: int,
            top_m: int = 64) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from dominotree_jax.domino_head import dflash_chain, domino_chain
    from dominotree_jax.model.drafter import bind_drafter
    from dominotree_jax.model.target import bind_target
    from dominotree_jax.train.dataset import make_batch
    from dominotree_jax.tree import build_tree_from_head

    J = dcfg.num_draft_positions
    prefix_len = dcfg.pure_draft_prefix_len
    drafter = bind_drafter(dcfg, dparams)
    head = drafter.head_weights(bind_target(tcfg, tparams))
    out_fn = jax.jit(block_outputs, static_argnames=("dcfg", "tcfg"))
    rng = np.random.default_rng(seed)
    acc: dict[str, list] = {c: [] for c in configs}
    node_depths: dict[str, list] = {c: [] for c in configs}
    for i in range(0, len(seq_ids) - 1, 2):
        b = make_batch(ds, seq_ids[i:i + 2], anchors=anchors, block=J, rng=rng, answer_frac=1.0)
        z, base, t0, lab = out_fn(dcfg, tcfg, dparams, tparams, jax.tree.map(jnp.asarray, b))
        lab_np = np.asarray(lab)
        full = np.all(lab_np >= 0, axis=1)
        for c in configs:
            method, budget, k = parse_config(c)
            if method == "dflash":
                toks, _ = dflash_chain(base)
            elif method == "domino":
                toks, _ = domino_chain(head, z, base, t0, prefix_len)
            if method in ("dflash", "domino"):
                ok = np.asarray(drafter.to_target(toks)) == lab_np
                a = np.cumprod(ok, axis=1).sum(axis=1)
                depths = np.tile(np.arange(J), (len(a), 1))
            else:
                tree = jax.vmap(lambda bs, zz, t: build_tree_from_head(
                    bs, zz, t, head if method != "ddtree" else None, method=method,
                    budget=budget, node_topk=k, top_m=top_m, prefix_len=prefix_len,
                    use_pallas=False))(base, z, t0)
                tk, par, dep = (np.asarray(x) for x in (drafter.to_target(tree.tokens),
                                                        tree.parents, tree.depths))
                a = tree_accepted(tk, par, dep >= 0, lab_np)
                depths = dep
            acc[c] += a[full].tolist()
            node_depths[c] += [np.bincount(d[d >= 0], minlength=J).tolist() for d in
                               depths[full]]
    res = {}
    for c in configs:
        a = np.asarray(acc[c])
        hist = np.bincount(a, minlength=J + 1)
        res[c] = {"tau": round(float(1 + a.mean()), 4), "blocks": int(len(a)),
                  "accepted_hist": hist.tolist(),
                  "reach_d": [round(float(np.mean(a > d)), 4) for d in range(J)],
                  "nodes_per_depth": np.round(np.mean(node_depths[c], axis=0), 3).tolist()}
    return res


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m experiments.drafter_lab tree",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--drafter", default="shipped")
    p.add_argument("--data", required=True, help="data directory (manifest + shards)")
    p.add_argument("--features", default="runs/features")
    p.add_argument("--shards", type=int, default=6)
    p.add_argument("--seqs", type=int, default=16, help="held-out sequences")
    p.add_argument("--anchors", type=int, default=16)
    p.add_argument("--top-m", type=int, default=64)
    p.add_argument("--configs", default=",".join(DEFAULT_CONFIGS))
    p.add_argument("--seed", type=int, default=17)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    import dominotree_jax as dj
    from convert.drafter import load_drafter
    from dominotree_jax.assets import smollm2_gguf_path
    from dominotree_jax.train.eval.acceptance import heldout_set
    from dominotree_jax.train.run import drafter_path

    target = dj.load_target(smollm2_gguf_path())
    dcfg, dparams = load_drafter(drafter_path(args.drafter), target_cfg=target.config)
    ds, held = heldout_set(target, args.data, dcfg.target_layer_ids, features=args.features,
                           seqs=args.seqs, shards=args.shards, log=print)
    configs = tuple(args.configs.split(","))
    for c in configs:
        parse_config(c)
    res = measure(dcfg, dparams, target.config, target.params, ds, held, configs,
                  anchors=args.anchors, seed=args.seed, top_m=args.top_m)
    for c, r in res.items():
        print(f"{c:18s} tau {r['tau']:.3f}  accepted {r['accepted_hist']}  nodes/depth "
              f"{r['nodes_per_depth']}", flush=True)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": res}, f, indent=1)
    return 0
