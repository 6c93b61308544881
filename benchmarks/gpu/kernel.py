"""The kernel check: the Pallas top-M expansion (``pallas_kernels/topm_expand.py``; both
kernels, ``KERNELS``: the default grid of E blocks and the single program) against its jnp twin
(``domino_head.expand_split_jnp``) at a drafter's Domino-head shapes (indices equal, log-probs
within ``LP_TOL``, time per pop), ``build_tree`` with vs without the default kernel, and the pop
time of each Triton launch variant of it; and which tree expansion the rounds then use."""

from __future__ import annotations

import dataclasses
import functools
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.domino_head import expand_split_jnp, split_projection
from dominotree_jax.measure.timing import interleaved_medians
from dominotree_jax.tree import build_tree
from pallas_kernels.topm_expand import KERNELS, expand_padded_pallas, pad_operands

from benchmarks.gpu.configs import BUDGET, NODE_TOPK, TOP_M, PairSpec
from benchmarks.gpu.control import calling, error_line

LP_TOL = 1e-5       # kernel vs jnp twin, max |delta log-prob|
KERNEL_VARIANTS = ((4, 1), (2, 1), (8, 1), (4, 2), (4, 3))  # (num_warps, num_stages)


def kernel_operands(key, H, G, E, M=TOP_M):
    kz, ks, k1, kb, k2 = jax.random.split(key, 5)
    return (jax.random.normal(kz, (H,)), jnp.tanh(jax.random.normal(ks, (G,))),
            jax.random.normal(k1, (E, H + G)) / np.sqrt(H + G), 3.0 * jax.random.normal(kb, (M,)),
            jax.random.normal(k2, (M, E)) / np.sqrt(E))


def builder_inputs(key, J, H, G, E, V, dtype=jnp.bfloat16):
    ks = jax.random.split(key, 8)

    def normal(k, shape, scale):
        return (scale * jax.random.normal(k, shape)).astype(dtype)

    return dict(base_logits=normal(ks[0], (J, V), 3.0), hidden=normal(ks[1], (J, H), 1.0),
                root_token=jax.random.randint(ks[2], (), 0, V),
                embed=normal(ks[3], (V, H), 0.05),
                gru_w_ih=normal(ks[4], (3 * G, H), 1 / np.sqrt(H)),
                gru_w_hh=normal(ks[5], (3 * G, G), 1 / np.sqrt(G)),
                proj_w1=normal(ks[6], (E, H + G), 1 / np.sqrt(H + G)),
                proj_w2=normal(ks[7], (V, E), 1 / np.sqrt(E)))


@dataclasses.dataclass(frozen=True)
class KernelShapes:
    """The Domino-head shapes one kernel check runs at."""
    H: int  # drafter hidden
    G: int  # GRU state
    E: int  # projection width
    V: int  # vocabulary
    J: int  # draft depths per block

    def __str__(self):
        return (f"H={self.H} G={self.G} E={self.E} M={TOP_M} k={NODE_TOPK} J={self.J} "
                f"V={self.V}")


def kernel_shapes(spec: PairSpec) -> KernelShapes:
    d = spec.drafter
    G, E = (d.gru_hidden_dim, d.emb_dim) if d.is_domino else spec.kernel_head
    return KernelShapes(d.hidden_size, G, E, d.vocab_size, d.num_draft_positions)


# the shipped SmolLM2-135M Domino drafter (dominotree_jax/assets/smollm2-domino)
SMOLLM2_KERNEL = KernelShapes(H=576, G=256, E=128, V=49152, J=8)


def check_kernel(shapes: KernelShapes, *, interpret: bool, seeds: int, repeats: int,
                 inner: int = 1, variants=()) -> dict:
    """Each kernel (``KERNELS``; the first is the default the builder runs) vs the jnp twin
    (results and per-pop time), ``build_tree`` with vs without the default kernel, and its pop
    time with each Triton launch variant ``(num_warps, num_stages)`` in ``variants``."""
    H, G, E, V, J = shapes.H, shapes.G, shapes.E, shapes.V, shapes.J
    # one pop as the builder runs it: split projection, operands padded once per round
    pop_jnp = jax.jit(functools.partial(expand_split_jnp, k=NODE_TOPK))
    pops_pal = {name: jax.jit(functools.partial(expand_padded_pallas, k=NODE_TOPK,
                                                interpret=interpret, kernel=name))
                for name in KERNELS}

    def pop_operands(seed):
        z, s, w1, base, w2 = kernel_operands(jax.random.key(seed), H, G, E)
        a, w1s = split_projection(z, w1)
        a_p, w1s_p, base_p, w2_p = pad_operands(a, w1s, base, w2)
        return (a, s, w1s, base, w2), (a_p, s, w1s_p, base_p, w2_p)

    same_idx, max_diff = True, 0.0
    for seed in range(seeds):
        plain, padded = pop_operands(seed)
        ij, lj = pop_jnp(*plain)
        for pop_pal in pops_pal.values():
            ip, lp = pop_pal(*padded)
            same_idx &= bool(np.array_equal(np.asarray(ij), np.asarray(ip)))
            max_diff = max(max_diff, float(np.abs(np.asarray(lj) - np.asarray(lp)).max()))
    plain, padded = pop_operands(123)
    pop = interleaved_medians({"jnp": calling(pop_jnp, *plain),
                               **{name: calling(fn, *padded) for name, fn in pops_pal.items()}},
                              repeats, inner)

    statics = dict(method="dominotree", budget=BUDGET, node_topk=NODE_TOPK, top_m=TOP_M,
                   prefix_len=1)
    builders = {flag: jax.jit(functools.partial(build_tree, **statics, use_pallas=flag))
                for flag in (False, "interpret" if interpret else True)}
    same_tree = True
    for seed in range(3):
        case = builder_inputs(jax.random.key(1000 + seed), J, H, G, E, V)
        ref, got = (fn(**case) for fn in builders.values())
        for field in ("tokens", "parents", "depths", "num_nodes"):
            same_tree &= bool(np.array_equal(np.asarray(getattr(ref, field)),
                                             np.asarray(getattr(got, field))))
        same_tree &= bool(np.allclose(np.asarray(ref.scores), np.asarray(got.scores),
                                      rtol=1e-5, atol=1e-5))
    build = interleaved_medians({str(flag): calling(fn, **case)
                                 for flag, fn in builders.items()}, repeats, inner)
    build_jnp, build_pal = build.values()
    return dict(variants=time_kernel_variants(padded, variants, interpret=interpret,
                                              repeats=repeats, inner=inner),
                shapes=str(shapes),
                mode="interpret" if interpret else "compiled", seeds=seeds,
                indices_equal=same_idx, max_abs_dlp=max_diff,
                kernel_ok=same_idx and max_diff <= LP_TOL, pop_jnp_us=1e3 * pop["jnp"],
                pop_kernels_us={name: 1e3 * pop[name] for name in KERNELS}, trees_equal=same_tree,
                build_jnp_ms=build_jnp, build_pallas_ms=build_pal)


def time_kernel_variants(padded, variants, *, interpret: bool, repeats: int,
                         inner: int) -> dict:
    """Per-pop microseconds of the kernel compiled with each ``(num_warps, num_stages)``; a
    variant that does not compile gets its error instead."""
    pops, out = {}, {}
    for warps, stages in variants:
        name = f"{warps}x{stages}"
        fn = jax.jit(functools.partial(expand_padded_pallas, k=NODE_TOPK, interpret=interpret,
                                       num_warps=warps, num_stages=stages))
        try:
            jax.block_until_ready(fn(*padded))
        except Exception as err:  # noqa: BLE001  (one variant failing must not hide the rest)
            out[name] = {"error": error_line(err)}
            continue
        pops[name] = calling(fn, *padded)
    if pops:
        for name, ms in interleaved_medians(pops, repeats, inner).items():
            out[name] = {"pop_us": 1e3 * ms}
    return {f"{w}x{s}": out[f"{w}x{s}"] for w, s in variants}


def failed_kernel_row(shapes: KernelShapes, interpret: bool, err: Exception) -> dict:
    """A kernel-table row for a check that raised (e.g. the kernel does not compile)."""
    nan = float("nan")
    return dict(shapes=str(shapes), mode="interpret" if interpret else "compiled", seeds=0,
                indices_equal=False, max_abs_dlp=nan, kernel_ok=False, pop_jnp_us=nan,
                pop_kernels_us={name: nan for name in KERNELS},
                trees_equal=False, build_jnp_ms=nan, build_pallas_ms=nan,
                error=error_line(err), traceback=traceback.format_exc(), variants={})


def kernel_checks(pairs: dict, names: list[str], *, tiny: bool) -> list[tuple]:
    """``(shapes, drafters)`` of each distinct Domino-head shape of the pairs in order (the
    first pair's first), then the shipped SmolLM2 drafter's at real size."""
    checks = {}
    for name in names:
        checks.setdefault(kernel_shapes(pairs[name]), []).append(name)
    if not tiny:
        checks.setdefault(SMOLLM2_KERNEL, []).append("smollm2-135m-domino")
    return [(shapes, ", ".join(drafters)) for shapes, drafters in checks.items()]


def tree_kernel_choice(mode: str, *, on_gpu: bool, kernel_broken: bool):
    """``(use_pallas for DecodeConfig, what the report says)`` for ``--tree-kernel``."""
    if mode == "jnp":
        return False, "jnp twin (--tree-kernel jnp)"
    if mode == "pallas":
        return (True, "Pallas (forced)") if on_gpu else ("interpret", "Pallas, interpret mode")
    if kernel_broken:  # a kernel that does not build must not hide the rest
        return False, "jnp twin (the kernel check failed)"
    return "auto", "jnp twin (auto)"
