"""GPU check of the top-M expansion kernel and of the builder that uses it.

    python pallas_kernels/gpu_check.py

On a GPU: for SmolLM2-135M shapes (H=576, G=256, E=128, V=49152) and Qwen3-4B shapes
(H=2560, G=256, E=256, V=151936), with M=64, k=8:
1. kernel (compiled through Triton, not interpreted) vs the jnp twin on 20 random inputs each:
   identical indices and log-probs within 1e-5 (the max difference is printed);
2. per-call time of both (median of 50 after warm-up): the public ``topm_expand`` form and the
   per-pop form the builder runs (operands gathered/padded once per round);
3. ``build_tree(method="dominotree", K=16, N=16, k=8, M=64, P=1)`` with ``use_pallas=True`` vs
   ``False``: identical trees on 3 rounds, and the per-tree time (median of 50).
Prints a PASS/FAIL table; exits 1 if anything fails.

On a CPU it runs only the interpret-mode check (small shapes), says that the rest needs a GPU,
and exits 0 (or 1 if the interpret check fails).
"""

from __future__ import annotations

import functools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dominotree_jax.tree import build_tree  # noqa: E402
from pallas_kernels.topm_expand import (  # noqa: E402
    expand_padded_pallas, expand_split_jnp, pad_operands, split_projection, topm_expand_jnp,
    topm_expand_pallas,
)

SHAPES = {  # name: (H, G, E, V)
    "SmolLM2-135M": (576, 256, 128, 49152),
    "Qwen3-4B": (2560, 256, 256, 151936),
}
M, TOPK, K, BUDGET, PREFIX = 64, 8, 16, 16, 1
LP_TOL = 1e-5


def kernel_operands(key, H, G, E):
    kz, ks, k1, kb, k2 = jax.random.split(key, 5)
    return (jax.random.normal(kz, (H,)), jnp.tanh(jax.random.normal(ks, (G,))),
            jax.random.normal(k1, (E, H + G)) / np.sqrt(H + G), 3.0 * jax.random.normal(kb, (M,)),
            jax.random.normal(k2, (M, E)) / np.sqrt(E))


def round_inputs(key, H, G, E, V, dtype=jnp.bfloat16):
    ks = jax.random.split(key, 8)
    n = lambda k, shape, scale: (scale * jax.random.normal(k, shape)).astype(dtype)  # noqa: E731
    return dict(base_logits=n(ks[0], (K, V), 3.0), hidden=n(ks[1], (K, H), 1.0),
                root_token=jax.random.randint(ks[2], (), 0, V), embed=n(ks[3], (V, H), 0.05),
                gru_w_ih=n(ks[4], (3 * G, H), 1 / np.sqrt(H)),
                gru_w_hh=n(ks[5], (3 * G, G), 1 / np.sqrt(G)),
                proj_w1=n(ks[6], (E, H + G), 1 / np.sqrt(H + G)),
                proj_w2=n(ks[7], (V, E), 1 / np.sqrt(E)))


def median_us(fn, *args, warmup=5, reps=50):
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times)


def compare_kernel(H, G, E, *, interpret, seeds):
    """Max |Δlp| and whether all indices matched, kernel vs jnp twin."""
    jnp_fn = jax.jit(functools.partial(topm_expand_jnp, k=TOPK))
    pal_fn = jax.jit(functools.partial(topm_expand_pallas, k=TOPK, interpret=interpret))
    same, max_diff = True, 0.0
    for seed in range(seeds):
        ops = kernel_operands(jax.random.key(seed), H, G, E)
        (ij, lj), (ip, lp) = jnp_fn(*ops), pal_fn(*ops)
        same &= bool(np.array_equal(np.asarray(ij), np.asarray(ip)))
        max_diff = max(max_diff, float(np.abs(np.asarray(lj) - np.asarray(lp)).max()))
    return same, max_diff


def time_kernel(H, G, E):
    ops = kernel_operands(jax.random.key(123), H, G, E)
    t_full_j = median_us(jax.jit(functools.partial(topm_expand_jnp, k=TOPK)), *ops)
    t_full_p = median_us(jax.jit(functools.partial(topm_expand_pallas, k=TOPK)), *ops)
    z, s, w1, base, w2 = ops
    a, w1s = split_projection(z, w1)
    a_p, w1s_p, base_p, w2_p = pad_operands(a, w1s, base, w2)
    t_pop_j = median_us(jax.jit(functools.partial(expand_split_jnp, k=TOPK)), a, s, w1s, base, w2)
    t_pop_p = median_us(jax.jit(functools.partial(expand_padded_pallas, k=TOPK)),
                        a_p, s, w1s_p, base_p, w2_p)
    return t_full_j, t_full_p, t_pop_j, t_pop_p


def check_builder(H, G, E, V):
    statics = dict(method="dominotree", budget=BUDGET, node_topk=TOPK, top_m=M, prefix_len=PREFIX)
    fns = {flag: jax.jit(functools.partial(build_tree, **statics, use_pallas=flag))
           for flag in (False, True)}
    same = True
    for seed in range(3):
        case = round_inputs(jax.random.key(1000 + seed), H, G, E, V)
        a, b = fns[False](**case), fns[True](**case)
        for field in ("tokens", "parents", "depths", "num_nodes"):
            same &= bool(np.array_equal(np.asarray(getattr(a, field)),
                                        np.asarray(getattr(b, field))))
        same &= bool(np.allclose(np.asarray(a.scores), np.asarray(b.scores), rtol=1e-5, atol=1e-5))
    times = [median_us(lambda c, f=fns[flag]: f(**c), case) for flag in (False, True)]
    return same, times


def verdict(ok):
    return "PASS" if ok else "FAIL"


def main() -> int:
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, devices {jax.devices()}")
    ok_all = True

    same, diff = compare_kernel(40, 24, 20, interpret=True, seeds=5)
    ok = same and diff <= LP_TOL
    ok_all &= ok
    print(f"interpret check (H=40 G=24 E=20 M={M} k={TOPK}): {verdict(ok)} "
          f"(indices equal: {same}, max |dlp| = {diff:.2e})")
    if jax.default_backend() != "gpu":
        print("The compiled kernel check and the timings need a GPU; skipping them.")
        return 0 if ok_all else 1

    header = (f"{'shapes':<14}{'check':<28}{'result':<8}{'max|dlp|':>10}"
              f"{'jnp us':>10}{'pallas us':>11}")
    lines = [header, "-" * len(header)]
    for name, (H, G, E, V) in SHAPES.items():
        same, diff = compare_kernel(H, G, E, interpret=False, seeds=20)
        ok = same and diff <= LP_TOL
        ok_all &= ok
        t_full_j, t_full_p, t_pop_j, t_pop_p = time_kernel(H, G, E)
        lines.append(f"{name:<14}{'kernel vs jnp (topm_expand)':<28}{verdict(ok):<8}{diff:>10.1e}"
                     f"{t_full_j:>10.1f}{t_full_p:>11.1f}")
        lines.append(f"{'':<14}{'per pop (prepared operands)':<28}{'':<8}{'':>10}"
                     f"{t_pop_j:>10.1f}{t_pop_p:>11.1f}")
        same, (t_j, t_p) = check_builder(H, G, E, V)
        ok_all &= same
        lines.append(f"{'':<14}{'build_tree pallas vs jnp':<28}{verdict(same):<8}{'':>10}"
                     f"{t_j:>10.1f}{t_p:>11.1f}")
    print("\n".join(lines))
    print(f"OVERALL: {verdict(ok_all)}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
