"""The tree builder's products: ``Precision.HIGHEST`` (shipped) vs ``DEFAULT``, on this backend.

Builds every DominoTree case of ``tests/test_tree_builder.py`` (its configs x families x two
seeds) with the Domino head's products at ``HIGHEST`` and at ``DEFAULT`` and compares the trees
(tokens, parents, depths, scores, ...) bit for bit; then times one build at the shipped size
(V 49152, H 576, G 256, E 128, 8 depths, budget 16, k 8) with ``top_m`` 0 and 64, both ways.
On a CPU the two are the same float32 program; on a GPU ``DEFAULT`` is TF32 (not float32 tree
scores, which the precision policy requires).

    python -m benchmarks round tree_precision [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import dominotree_jax.domino_head as dh
from dominotree_jax.tree import build_tree

PRECISIONS = {"HIGHEST": jax.lax.Precision.HIGHEST, "DEFAULT": jax.lax.Precision.DEFAULT}


def trees(cases, prec):
    dh._HIGHEST = prec   # the products' precision, read at trace time
    out = {}
    for key, (cfg, case) in cases.items():
        fn = jax.jit(lambda c, cfg=cfg: build_tree(**c, **cfg.statics(), use_pallas=False))
        out[key] = jax.device_get(fn(case))
    return out


def shipped_case(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    V, H, G, E, K = 49152, 576, 256, 128, 8
    f = lambda *s, scale=0.05: jnp.asarray(rng.standard_normal(s) * scale, jnp.float32)  # noqa
    return dict(base_logits=f(K, V, scale=3.0), hidden=f(K, H, scale=1.0),
                root_token=jnp.int32(5), embed=f(V, H), gru_w_ih=f(3 * G, H),
                gru_w_hh=f(3 * G, G), proj_w1=f(E, H + G), proj_w2=f(V, E))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    from tests import test_tree_builder as T   # from the repo root: tests/ is a namespace pkg

    cases = {(n, fam, s): (cfg, T.make_case(cfg, s, fam)) for n, cfg in T.CONFIGS.items()
             if cfg.method == "dominotree" for fam in T.FAMILIES for s in (17, 1017)}
    got = {p: trees(cases, prec) for p, prec in PRECISIONS.items()}
    same = sum(all(np.array_equal(np.asarray(a), np.asarray(b))
                   for a, b in zip(got["HIGHEST"][k], got["DEFAULT"][k])) for k in cases)
    print(f"DEFAULT vs HIGHEST: {same}/{len(cases)} DominoTree cases bit-identical")
    case = shipped_case()
    for m in (0, 64):
        ms, outs = {}, {}
        for p, prec in PRECISIONS.items():
            dh._HIGHEST = prec
            fn = jax.jit(lambda c, m=m: build_tree(**c, method="dominotree", budget=16,
                                                   node_topk=8, top_m=m, prefix_len=1,
                                                   use_pallas=False))
            outs[p] = jax.device_get(fn(case))
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                jax.block_until_ready(fn(case))
                times.append(1e3 * (time.perf_counter() - t0))
            ms[p] = statistics.median(times)
        ident = all(np.array_equal(np.asarray(a), np.asarray(b))
                    for a, b in zip(outs["HIGHEST"], outs["DEFAULT"]))
        print(f"shipped size, top_m={m}: build ms HIGHEST {ms['HIGHEST']:.2f}, DEFAULT "
              f"{ms['DEFAULT']:.2f}; trees identical: {ident}")
    dh._HIGHEST = jax.lax.Precision.HIGHEST
