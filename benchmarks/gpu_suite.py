"""GPU suite: is the Pallas kernel right on this GPU, and how long does a round take at real size?

One-shot: built to get every number it can out of a single ~10-minute call on a lent GPU.

    python -m benchmarks.gpu_suite --deadline 500     # on a GPU: real sizes, bf16, random weights
    python -m benchmarks.gpu_suite --tiny              # anywhere (CPU: Pallas in interpret mode)

The prepared command for one 10-minute call on a lent H200 is ``bash
benchmarks/gpu_device_run.sh`` (``benchmarks/README.md``): the image's own python3 and jax, no
wheels to carry, 6 files under ``$OUT`` (nvidia-smi, versions, this report's .md and .json, the
suite's stdout and stderr), the Qwen3-4B + Domino pair first. Its suite call is:

    python3 -m benchmarks.gpu_suite --deadline 500 --reserve 60 --compile-cache /tmp/jax_cache \\
        --pairs qwen3-4b-domino,qwen3-8b-domino --kernel-variants 4x1,8x1,4x2 \\
        --out $OUT/gpu_suite.md

What it measures, in this order (the report, markdown at ``--out`` and JSON beside it, is
rewritten after every method, so a run cut short keeps what it measured):

1. Environment: jax / jaxlib / flax versions, device kind, compute capability, platform version,
   ``XLA_FLAGS`` and the ``JAX_*`` / ``XLA_*`` environment, the switches below.
2. Kernel check (``--skip-kernel`` to leave out): the Pallas top-M expansion
   (``pallas_kernels/topm_expand.py``) against its jnp twin (``domino_head.expand_split_jnp``)
   at each pair's Domino-head shapes: identical indices and log-probs within 1e-5, the time of
   one pop with each, ``build_tree`` with vs without the kernel (identical trees, time per
   tree), and on a GPU the pop time of each Triton launch variant (``--kernel-variants``,
   ``num_warps x num_stages``). On a CPU the kernel runs in interpret mode. The first pair's
   head shapes are checked before any pair (``--tree-kernel auto`` takes the kernel only if
   that check passed); the other shapes (other pairs, the SmolLM2-135M drafter) after the pairs.
3. Per pair (``--pairs``, default Qwen3-4B + Domino-b16 first, then Qwen3-8B + Domino-b16;
   Qwen3-4B + DFlash-b16 on request), random bf16 weights drawn on the device, batch 1,
   ``--context`` committed tokens:
   a. every method's whole round (one jitted function) timed side by side with the AR step
      (the ``ar`` round: a one-row verify, argmax, commit), one method at a time;
   b. then (``--stages all``, the default) every method's stages: draft (drafter block forward,
      LM head included), build (chain or tree and its verify mask), verify (target forward over
      the draft rows), accept/commit (argmax, acceptance walk, cache compaction, drafter-context
      extend, output write).
   The table puts next to each method: our round / AR step, the paper-implied round / AR step
   (published tau / published speedup; Qwen3-4B only: 1.52 / 1.62 / 1.56 / 1.66 for DFlash /
   Domino / DDTree / DominoTree), the speedup our round would give at the published tau, the
   build share of the round (paper: 3.67 of 26.54 ms, 14%), the compiled round programs (at
   most 1) and the AR step's achieved bandwidth (weights + live cache read per step) as a share
   of the device's peak (``--peak-gbps`` or a table of known devices: H200 4.8 TB/s).

One-shot safety:
- each method (and each kernel check) runs isolated: an exception is recorded with its
  traceback in the report and the next method runs;
- ``--deadline`` (seconds from the start, or a UTC time ``HH:MM[:SS]`` / ISO) stops compiling
  new programs ``--reserve`` seconds before it: what is not started is marked "skipped
  (deadline)", and the report holds everything measured;
- ``--tree-kernel {auto,pallas,jnp}`` (auto: the Pallas kernel where it compiles, CUDA compute
  capability >= 8.0, and only if the kernel check passed) and ``--attention
  {auto,bucket,dense}`` (``TargetConfig.attention_impl``; auto = one dense masked pass over the
  cache on a GPU, buckets on a CPU) choose the paths;
- ``--merge`` keeps the methods of an existing report (same device) that this run does not
  redo; ``--compile-cache DIR`` lets a rerun on the same machine skip compiles.

Random weights do not change any stage's cost: every shape is static (the tree always pops
``budget`` nodes, the acceptance walk always takes ``max_depth`` steps), so a round costs the
same whatever the weights draft. Caches are zero-filled with ``--context`` committed slots
(a prefill would add nothing but a compile). Each time is the median of ``--repeats`` samples
after warm-up, interleaved round-robin; a sample is ``--inner`` calls dispatched back to back and
one wait, per call (Python dispatch overlaps with the GPU, as in the jitted decode loop).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import functools
import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.timing import interleaved_medians
from dominotree_jax.config import DrafterConfig, TargetConfig, check_pair
from dominotree_jax.decoding.accept import accept_walk
from dominotree_jax.decoding.commit import commit, keep_rows
from dominotree_jax.decoding.config import CHAIN_METHODS, TREE_METHODS, DecodeConfig
from dominotree_jax.decoding.draft import (
    bind_drafter_for, chain_draft, tap_layers_for, tree_draft,
)
from dominotree_jax.decoding.round import RoundInput, commit_rows, fixed_round
from dominotree_jax.decoding.verify import verify_rows
from dominotree_jax.domino_head import expand_split_jnp, split_projection
from dominotree_jax.model.cache import KVCache
from dominotree_jax.model.drafter import DrafterContext, drafter_graphdef
from dominotree_jax.model.target import bind_target, target_graphdef
from dominotree_jax.sampling import sample_tokens
from dominotree_jax.tree import build_tree
from pallas_kernels.topm_expand import (
    default_device_compiles_kernel, device_platform, expand_padded_pallas, pad_operands,
)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "benchmarks" / "results" / "gpu_suite.md"
DEFAULT_TINY_OUT = REPO / "benchmarks" / "results" / "gpu_suite_tiny.md"

METHODS = ("dflash", "domino", "ddtree", "dominotree")


@dataclasses.dataclass(frozen=True)
class Published:
    """One method's published figures for one target (temperature 0, one GPU)."""
    tau: float            # mean acceptance length over eight benchmarks
    round_per_ar: float   # the paper-implied round cost in AR steps: tau / speedup

    @property
    def speedup(self) -> float:
        return self.tau / self.round_per_ar


# Published reference per target (docs/algorithm.md §7; the implied round / AR step of issue 24:
# tau / speedup). Only Qwen3-4B figures are known to this repository: other targets show "–".
PUBLISHED = {
    "Qwen3-4B": {"dflash": Published(6.25, 1.52), "domino": Published(7.17, 1.62),
                 "ddtree": Published(7.03, 1.56), "dominotree": Published(7.98, 1.66)},
}
PAPER_ROUND = {"build": 3.67, "round": 26.54, "speedup": 4.81}  # DominoTree, Qwen3-4B, ms

# Peak memory bandwidth (bytes/s) by device kind (first matching substring): the AR step's
# achieved share. Vendor figures; ``--peak-gbps`` overrides.
PEAK_BANDWIDTH = (("H200", 4.8e12), ("H100 NVL", 3.9e12), ("H100 PCIe", 2.0e12),
                  ("H100", 3.35e12), ("GH200", 4.0e12), ("A100-SXM4-80GB", 2.039e12),
                  ("A100 80GB PCIe", 1.935e12), ("A100", 1.555e12), ("L40S", 0.864e12),
                  ("L4", 0.3e12), ("A10G", 0.6e12), ("T4", 0.32e12))

LP_TOL = 1e-5       # kernel vs jnp twin, max |delta log-prob|
TOP_M, NODE_TOPK, BUDGET = 64, 8, 16
KERNEL_VARIANTS = ((4, 1), (2, 1), (8, 1), (4, 2), (4, 3))  # (num_warps, num_stages)
TREE_KERNEL_MODES = ("auto", "pallas", "jnp")
ATTENTION_MODES = ("auto", "bucket", "dense")


# ----------------------------------------------------------------------------- configurations

def qwen3_target(hidden, layers, heads, kv_heads, head_dim, intermediate, vocab, tied):
    return TargetConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=head_dim, rms_norm_eps=1e-6, rope_theta=1_000_000.0, tie_word_embeddings=tied,
        qk_norm=True, attention_bias=False, max_position_embeddings=40960,
        architecture="Qwen3ForCausalLM")


def dflash_drafter(target: TargetConfig, *, layers, block, taps, mask_id, domino=False,
                   gru_hidden=1024, emb_dim=256):
    """A DFlash drafter for ``target`` (its hidden/head sizes); ``domino`` adds the Domino head."""
    extra = (dict(projector_type="domino", gru_hidden_dim=gru_hidden, emb_dim=emb_dim,
                  pure_draft_prefix_len=1) if domino else {})
    return DrafterConfig(
        vocab_size=target.vocab_size, hidden_size=target.hidden_size,
        intermediate_size=target.intermediate_size, num_hidden_layers=layers,
        num_attention_heads=target.num_attention_heads,
        num_key_value_heads=target.num_key_value_heads, head_dim=target.head_dim,
        block_size=block, mask_token_id=mask_id, num_target_layers=target.num_hidden_layers,
        target_layer_ids=tuple(taps), rms_norm_eps=1e-6, rope_theta=1_000_000.0, **extra)


@dataclasses.dataclass(frozen=True)
class PairSpec:
    name: str            # table title
    target: TargetConfig
    drafter: DrafterConfig
    methods: tuple[str, ...]
    kernel_head: tuple[int, int] = (1024, 256)  # (G, E) of the kernel check without a Domino head
    published: str | None = None  # key into PUBLISHED: the target's own published figures


ALL_DOMINO = ("dflash", "domino", "ddtree", "dominotree")


def real_pairs() -> dict[str, PairSpec]:
    qwen3_4b = qwen3_target(2560, 36, 32, 8, 128, 9728, 151936, tied=True)
    qwen3_8b = qwen3_target(4096, 36, 32, 8, 128, 12288, 151936, tied=False)
    b16 = dict(layers=5, block=16, taps=(1, 9, 17, 25, 33), mask_id=151669)
    return {
        "qwen3-4b-domino": PairSpec("Qwen3-4B + Domino-b16", qwen3_4b,
                                    dflash_drafter(qwen3_4b, **b16, domino=True), ALL_DOMINO,
                                    published="Qwen3-4B"),
        "qwen3-8b-domino": PairSpec("Qwen3-8B + Domino-b16", qwen3_8b,
                                    dflash_drafter(qwen3_8b, **b16, domino=True), ALL_DOMINO),
        "qwen3-4b-dflash": PairSpec("Qwen3-4B + DFlash-b16", qwen3_4b,
                                    dflash_drafter(qwen3_4b, **b16), ("dflash", "ddtree"),
                                    published="Qwen3-4B"),
    }


def tiny_pairs() -> dict[str, PairSpec]:
    """The same pairs, shrunk (every structural feature kept: tied/untied head, 5 taps, block
    16, a Domino head) so that the suite runs on a CPU in a minute or two."""
    tiny_4b = qwen3_target(64, 5, 4, 2, 16, 128, 512, tied=True)
    tiny_8b = qwen3_target(64, 5, 4, 2, 16, 192, 512, tied=False)
    b16 = dict(layers=1, block=16, taps=(0, 1, 2, 3, 4), mask_id=511)
    head = dict(domino=True, gru_hidden=32, emb_dim=24)
    return {
        "qwen3-4b-domino": PairSpec("tiny Qwen3-4B-like + Domino-b16", tiny_4b,
                                    dflash_drafter(tiny_4b, **b16, **head), ALL_DOMINO,
                                    published="Qwen3-4B"),
        "qwen3-8b-domino": PairSpec("tiny Qwen3-8B-like + Domino-b16", tiny_8b,
                                    dflash_drafter(tiny_8b, **b16, **head), ALL_DOMINO),
        "qwen3-4b-dflash": PairSpec("tiny Qwen3-4B-like + DFlash-b16", tiny_4b,
                                    dflash_drafter(tiny_4b, **b16), ("dflash", "ddtree"),
                                    kernel_head=(32, 24), published="Qwen3-4B"),
    }


DEFAULT_PAIRS = "qwen3-4b-domino,qwen3-8b-domino"


# ----------------------------------------------------------------------------- random weights

_DRAW_ELEMS = 1 << 28  # elements per random draw: well inside 32-bit indexing on any backend


@functools.partial(jax.jit, static_argnames=("shapes", "dtype"))
def _random_leaves(key, shapes: tuple[tuple[int, ...], ...], dtype):
    """One program for all leaves: leaves of one shape are drawn together (stacked, at most
    ``_DRAW_ELEMS`` elements per draw unless one leaf is larger) and sliced out, so the compile
    count and time do not grow with the number of layers."""
    draws = []  # (shape, leaves in this draw)
    for shape in sorted(set(shapes)):
        per_draw = max(1, _DRAW_ELEMS // math.prod(shape))
        count = shapes.count(shape)
        draws += [(shape, min(per_draw, count - i)) for i in range(0, count, per_draw)]
    pools = collections.defaultdict(list)  # shape -> leaves, in draw order
    for sub, (shape, count) in zip(jax.random.split(key, len(draws)), draws):
        if len(shape) < 2:  # norm scales (and any bias): ones
            pool = jnp.ones((count,) + shape, dtype)
        else:               # matrices: variance 1/fan_in, drawn directly in ``dtype``
            bound = math.sqrt(3.0 / shape[-1])
            pool = jax.random.uniform(sub, (count,) + shape, dtype, -bound, bound)
        pools[shape] += [pool[i] for i in range(count)]
    used = collections.Counter()
    out = []
    for shape in shapes:
        out.append(pools[shape][used[shape]])
        used[shape] += 1
    return out


def random_params(abstract_state, seed: int, dtype=jnp.bfloat16):
    """Random parameters for an abstract (``nnx.eval_shape``) state, made on the default device
    by one jitted program: matrices ~ U(+-sqrt(3/fan_in)) (variance 1/fan_in), vectors (norm
    scales) = 1."""
    leaves, treedef = jax.tree.flatten(abstract_state)
    shapes = tuple(tuple(int(n) for n in leaf.shape) for leaf in leaves)
    key = jax.random.key(seed, impl="rbg")  # XLA's RngBitGenerator: quick to compile and run
    return jax.tree.unflatten(treedef, _random_leaves(key, shapes, jnp.dtype(dtype)))


def pair_params(spec: PairSpec, seed: int = 0, dtype=jnp.bfloat16) -> dict:
    """``{"target": ..., "drafter": ...}`` random parameter pytrees for ``spec`` in ``dtype``."""
    check_pair(spec.target, spec.drafter)
    name = jnp.dtype(dtype).name
    _, target_abs = target_graphdef(spec.target, name)
    _, drafter_abs = drafter_graphdef(spec.drafter, name)
    params = {"target": random_params(target_abs, seed, dtype),
              "drafter": random_params(drafter_abs, seed + 1, dtype)}
    jax.block_until_ready(params)
    return params


def num_params(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))



def calling(fn, *args, **kwargs):
    return lambda: fn(*args, **kwargs)


# ----------------------------------------------------------------------------- kernel check

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
    """Kernel vs jnp twin (results and per-pop time), ``build_tree`` with vs without it, and
    the pop time of each Triton launch variant ``(num_warps, num_stages)`` in ``variants``."""
    H, G, E, V, J = shapes.H, shapes.G, shapes.E, shapes.V, shapes.J
    # one pop as the builder runs it: split projection, operands padded once per round
    pop_jnp = jax.jit(functools.partial(expand_split_jnp, k=NODE_TOPK))
    pop_pal = jax.jit(functools.partial(expand_padded_pallas, k=NODE_TOPK, interpret=interpret))

    def pop_operands(seed):
        z, s, w1, base, w2 = kernel_operands(jax.random.key(seed), H, G, E)
        a, w1s = split_projection(z, w1)
        a_p, w1s_p, base_p, w2_p = pad_operands(a, w1s, base, w2)
        return (a, s, w1s, base, w2), (a_p, s, w1s_p, base_p, w2_p)

    same_idx, max_diff = True, 0.0
    for seed in range(seeds):
        plain, padded = pop_operands(seed)
        (ij, lj), (ip, lp) = pop_jnp(*plain), pop_pal(*padded)
        same_idx &= bool(np.array_equal(np.asarray(ij), np.asarray(ip)))
        max_diff = max(max_diff, float(np.abs(np.asarray(lj) - np.asarray(lp)).max()))
    plain, padded = pop_operands(123)
    pop = interleaved_medians({"jnp": calling(pop_jnp, *plain),
                               "pallas": calling(pop_pal, *padded)}, repeats, inner)

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
                pop_pallas_us=1e3 * pop["pallas"], trees_equal=same_tree,
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


def error_line(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}"


def failed_kernel_row(shapes: KernelShapes, interpret: bool, err: Exception) -> dict:
    """A kernel-table row for a check that raised (e.g. the kernel does not compile)."""
    nan = float("nan")
    return dict(shapes=str(shapes), mode="interpret" if interpret else "compiled", seeds=0,
                indices_equal=False, max_abs_dlp=nan, kernel_ok=False, pop_jnp_us=nan,
                pop_pallas_us=nan, trees_equal=False, build_jnp_ms=nan, build_pallas_ms=nan,
                error=error_line(err), traceback=traceback.format_exc(), variants={})


def kernel_table(rows: dict[str, dict]) -> list[str]:
    out = ["| drafter | shapes | mode | kernel vs jnp | max abs dlp | pop jnp us | pop Pallas us "
           "| build_tree same | build jnp ms | build Pallas ms |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        out.append(f"| {name} | {r['shapes']} | {r['mode']} | {verdict(r['kernel_ok'])} "
                   f"({r['seeds']} inputs) | {r['max_abs_dlp']:.1e} | {r['pop_jnp_us']:.1f} "
                   f"| {r['pop_pallas_us']:.1f} | {verdict(r['trees_equal'])} "
                   f"| {r['build_jnp_ms']:.3f} | {r['build_pallas_ms']:.3f} |")
    variant_rows = [(name, r["variants"]) for name, r in rows.items() if r.get("variants")]
    if variant_rows:
        names = list(variant_rows[0][1])
        out += ["", "| drafter | " + " | ".join(f"pop us, {v} (warps x stages)" for v in names)
                + " |", "|---|" + "---|" * len(names)]
        for name, variants in variant_rows:
            out.append(f"| {name} | " + " | ".join(
                f"{variants[v]['pop_us']:.1f}" if "pop_us" in variants.get(v, {})
                else f"FAILED {variants.get(v, {}).get('error', '')}" for v in names) + " |")
    return out


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# ----------------------------------------------------------------------------- round stages

def _bound(config: DecodeConfig, params):
    return (bind_target(config.target, params["target"]),
            bind_drafter_for(config, params["drafter"]))


def _draft_stage(params, ctx, t0_B, start_B, *, config):
    target, drafter = _bound(config, params)
    return drafter.draft(target, ctx, t0_B, start_B)


def _build_stage(params, z_BJH, base_BJV, t0_B, *, config):
    target, drafter = _bound(config, params)
    build = chain_draft if config.method in CHAIN_METHODS else tree_draft
    return build(config, target, drafter, z_BJH, base_BJV, t0_B)


def _verify_stage(params, cache, t0_B, start_B, draft, *, config):
    """The verify forward (the cache is only read; the rows' K/V come back)."""
    target, _ = _bound(config, params)
    return verify_rows(target, cache, t0_B, start_B, draft.tokens_BN, draft.depths_BN,
                       draft.ancestor_BRR, tap_layers_for(config))


def _accept_commit_stage(params, cache, ctx, out_BO, logits_BRV, taps_BRF, kv, draft, t0_B,
                         start_B, n_B, *, config):
    """Greedy acceptance (temperature 0) and the commit, as the decode loop runs them."""
    _, drafter = _bound(config, params)
    post_BR = sample_tokens(jax.random.key(0), logits_BRV, 0.0)
    acc = accept_walk(draft.tokens_BN, draft.parents_BN, draft.valid_BN, post_BR,
                      config.max_depth)
    kept = keep_rows(draft, acc, kv, taps_BRF, None, config.max_depth + 1, drafter, start_B)
    c = commit(cache, ctx, drafter, out_BO, jnp.zeros(out_BO.shape, jnp.float32), kept,
               start_B=start_B, n_B=n_B, done_B=jnp.zeros(t0_B.shape, bool))
    return c.cache, c.ctx, c.out_BO, c.tau_B


def _round(params, cache, ctx, out_BO, t0_B, start_B, n_B, *, config):
    """One whole round as decode runs it (``decoding.round.fixed_round`` + ``commit_rows``):
    draft (block forward + chain/tree) → verify (rows written in place) → accept → commit."""
    target, drafter = _bound(config, params)
    inp = RoundInput(cache=cache, ctx=ctx, t0_B=t0_B, start_B=start_B, key=jax.random.key(0))
    result = fixed_round(inp, size=config.num_draft_nodes, config=config, target=target,
                         drafter=drafter)
    c = commit_rows(inp, result, out_BO=out_BO, logp_BO=jnp.zeros(out_BO.shape, jnp.float32),
                    n_B=n_B, done_B=jnp.zeros(t0_B.shape, bool), drafter=drafter)
    return c.cache, c.ctx, c.out_BO, c.tau_B


# jitted once here: equal static settings and shapes share a compiled program across methods
# (one verify program per row count, one draft program per pair); caches are donated, as in
# the decode loop
draft_stage = jax.jit(_draft_stage, static_argnames="config")
build_stage = jax.jit(_build_stage, static_argnames="config")
verify_stage = jax.jit(_verify_stage, static_argnames="config")
accept_commit_stage = jax.jit(_accept_commit_stage, static_argnames="config",
                              donate_argnums=(1, 2, 3))
round_stage = jax.jit(_round, static_argnames="config", donate_argnums=(1, 2, 3))


def _shared(config: DecodeConfig, **fields) -> DecodeConfig:
    """``config`` with the fields a stage does not depend on made equal across methods, so that
    stages with equal shapes hit the same compiled program."""
    return config.replace(**fields)


def decode_configs(spec: PairSpec, *, max_new_tokens: int, use_pallas) -> dict:
    """``DecodeConfig`` of ``ar`` and of every method of ``spec`` (budget 16, k 8, M 64)."""
    return {m: DecodeConfig(target=spec.target, drafter=spec.drafter, method=m,
                            max_new_tokens=max_new_tokens, budget=BUDGET, node_topk=NODE_TOPK,
                            top_m=TOP_M, use_pallas=use_pallas)
            for m in ("ar",) + spec.methods}


def round_buffers(spec: PairSpec, configs: dict, *, context: int, max_new_tokens: int,
                  dtype) -> dict:
    """Buffers a donating call consumes: the target cache with ``context`` committed slots
    (zeros: values do not change the cost), the drafter context of the same length, and the
    output buffer; sized as ``decode`` sizes them for ``max_new_tokens``."""
    tcfg = spec.target
    rows = max(c.num_draft_nodes for c in configs.values()) + 1
    S = context + max_new_tokens + rows
    O = max_new_tokens + max(c.max_depth for c in configs.values()) + 1
    cache = KVCache.zeros(tcfg.num_hidden_layers, 1, S, tcfg.num_key_value_heads,
                          tcfg.head_dim, dtype)
    ctx = DrafterContext.zeros(spec.drafter, 1, S, dtype)._replace(
        length=jnp.full((1,), context, jnp.int32))
    return {"cache": cache, "ctx": ctx, "out": jnp.zeros((1, O), jnp.int32)}


def abstract_round_args(spec: PairSpec, config: DecodeConfig, *, context: int,
                        max_new_tokens: int, dtype=jnp.bfloat16) -> tuple:
    """``round_stage``'s positional arguments as shapes only (no memory): for tracing and
    lowering a real-size round on any host, e.g. for ``cuda``."""
    name = jnp.dtype(dtype).name
    params = {"target": target_graphdef(spec.target, name)[1],
              "drafter": drafter_graphdef(spec.drafter, name)[1]}
    configs = decode_configs(spec, max_new_tokens=max_new_tokens, use_pallas=config.use_pallas)
    bufs = jax.eval_shape(functools.partial(round_buffers, spec, configs, context=context,
                                            max_new_tokens=max_new_tokens, dtype=dtype))
    B1 = jax.ShapeDtypeStruct((1,), jnp.int32)
    ctx = bufs["ctx"] if config.method != "ar" else None
    return params, bufs["cache"], ctx, bufs["out"], B1, B1, B1


# ----------------------------------------------------------------------------- one-shot control

def now() -> float:
    """Wall clock (UNIX seconds) the deadline is read against (tests replace it)."""
    return time.time()


def parse_deadline(text: str, start: float) -> float:
    """``--deadline``: seconds after ``start`` (``"540"``), a UTC time of day (``"10:30"``,
    ``"10:30:15"``) or an ISO date-time (``"2026-12-01T10:30:00Z"``) → UNIX seconds."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if seconds < 0:
            raise ValueError(f"--deadline {text!r}: seconds must be >= 0")
        return start + seconds
    utc = datetime.timezone.utc
    try:
        if "T" in text or "-" in text:
            when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
            when = when if when.tzinfo else when.replace(tzinfo=utc)
        else:
            clock = datetime.time.fromisoformat(text)
            today = datetime.datetime.fromtimestamp(start, utc).date()
            when = datetime.datetime.combine(today, clock, tzinfo=utc)
    except ValueError:
        raise ValueError(f"--deadline {text!r}: give seconds, HH:MM[:SS] (UTC) or an ISO "
                         "date-time") from None
    if when.timestamp() <= start:
        raise ValueError(f"--deadline {text!r} ({when.isoformat()}) is not in the future")
    return when.timestamp()


@dataclasses.dataclass
class Deadline:
    """Stop starting new compiles ``reserve`` seconds before ``at`` (None: no deadline)."""
    at: float | None
    reserve: float = 0.0

    def left(self) -> float:
        return math.inf if self.at is None else self.at - now()

    def allows_new_work(self) -> bool:
        return self.left() > self.reserve


SKIPPED = {"skipped": "deadline"}


def run_isolated(entry: dict, part: str, fn, deadline: Deadline, log, what: str) -> str:
    """``entry[part] = fn()`` unless the deadline is near (``SKIPPED``; an older result, e.g.
    merged, is kept) or ``fn`` raises (its error and traceback instead). Returns ``"ok"``,
    ``"error"`` or ``"skipped"``."""
    if not deadline.allows_new_work():
        if entry.get(part) is None or entry[part].get("skipped"):
            entry[part] = dict(SKIPPED)
        log(f"  {what}: skipped (deadline, {deadline.left():.0f} s left)")
        return "skipped"
    t = time.perf_counter()
    try:
        result = fn()
    except Exception as err:  # noqa: BLE001  (record it; the next method runs)
        entry[part] = {"error": error_line(err), "traceback": traceback.format_exc()}
        log(f"  {what}: FAILED {error_line(err)}")
        return "error"
    result["wall_s"] = time.perf_counter() - t
    entry[part] = result
    log(f"  {what}: done ({result['wall_s']:.1f} s)")
    return "ok"


# ----------------------------------------------------------------------------- measuring a pair

@dataclasses.dataclass
class PairRun:
    """Everything the per-method measurements of one pair share."""
    spec: PairSpec
    params: dict
    configs: dict          # method -> DecodeConfig ("ar" included)
    context: int
    max_new_tokens: int
    repeats: int
    inner: int
    t0_B: jax.Array
    start_B: jax.Array
    n_B: jax.Array
    ar: object = None      # the compiled AR step, a zero-argument callable
    ar_error: BaseException | None = None  # why the AR step did not compile (not retried)

    def fresh(self) -> dict:
        return round_buffers(self.spec, self.configs, context=self.context,
                             max_new_tokens=self.max_new_tokens,
                             dtype=jax.tree.leaves(self.params["target"])[0].dtype)


def prepare_pair(spec: PairSpec, *, context: int, max_new_tokens: int, repeats: int, inner: int,
                 use_pallas, log=print) -> PairRun:
    """Random bf16 weights on the device and the decode configs of ``spec``."""
    t = time.perf_counter()
    params = pair_params(spec)
    log(f"{spec.name}: {num_params(params['target']) / 1e6:.1f} M target + "
        f"{num_params(params['drafter']) / 1e6:.1f} M drafter parameters "
        f"({time.perf_counter() - t:.1f} s)")
    configs = decode_configs(spec, max_new_tokens=max_new_tokens, use_pallas=use_pallas)
    return PairRun(spec, params, configs, context, max_new_tokens, repeats, inner,
                   t0_B=jnp.full((1,), 7, jnp.int32), start_B=jnp.full((1,), context, jnp.int32),
                   n_B=jnp.ones((1,), jnp.int32))


def _round_caller(run: PairRun, config: DecodeConfig):
    """A zero-argument call of ``config``'s whole round on its own donated buffers."""
    state = run.fresh()

    def call():
        state["cache"], state["ctx"], state["out"], tau = round_stage(
            run.params, state["cache"], state["ctx"] if config.method != "ar" else None,
            state["out"], run.t0_B, run.start_B, run.n_B, config=config)
        return tau

    return call


def compiled_rounds() -> int | None:
    """Programs ``round_stage`` has compiled so far (None where jax does not say)."""
    size = getattr(round_stage, "_cache_size", None)
    return size() if callable(size) else None


def ar_step(run: PairRun):
    """The pair's AR step, compiled on first use (a failure is raised again, not retried)."""
    if run.ar_error is not None:
        raise RuntimeError(f"the AR step failed: {error_line(run.ar_error)}") from run.ar_error
    if run.ar is None:
        try:
            call = _round_caller(run, run.configs["ar"])
            jax.block_until_ready(call())
        except Exception as err:
            run.ar_error = err
            raise
        run.ar = call
    return run.ar


def measure_round(run: PairRun, method: str) -> dict:
    """The method's whole round (one jitted function) timed side by side with the AR step;
    ``round_programs``: round programs compiled while measuring it: 1 (or 0 where this process
    already had it); more means a round recompiles, which is recorded as a failure."""
    config = run.configs[method]
    ar = ar_step(run)
    before = compiled_rounds()
    t = time.perf_counter()
    call = _round_caller(run, config)
    jax.block_until_ready(call())
    compile_s = time.perf_counter() - t
    jax.block_until_ready(call())  # a second call (new start values) must not recompile
    programs = None if before is None else compiled_rounds() - before
    med = interleaved_medians({"ar": ar, "round": call}, run.repeats, run.inner)
    return dict(ar_ms=med["ar"], round_ms=med["round"], compile_s=compile_s,
                round_programs=programs, verify_rows=config.num_draft_nodes + 1)


def measure_stages(run: PairRun, method: str) -> dict:
    """Draft, build, verify and accept/commit of one method, timed with its round and the AR
    step side by side."""
    config, params = run.configs[method], run.params
    t0_B, start_B, n_B = run.t0_B, run.start_B, run.n_B
    ctx0 = run.fresh()["ctx"]
    # stage-level programs depend only on what shapes them: share them across methods
    plain = _shared(config, method="dflash", budget=BUDGET)
    z, base = draft_stage(params, ctx0, t0_B, start_B, config=plain)
    draft = build_stage(params, z, base, t0_B, config=config)
    shape_cfg = _shared(config, method="ddtree" if method in TREE_METHODS else "dflash")
    logits, taps, kv = verify_stage(params, run.fresh()["cache"], t0_B, start_B, draft,
                                    config=shape_cfg)
    verify_state, commit_state = run.fresh(), run.fresh()

    def run_verify():
        return verify_stage(params, verify_state["cache"], t0_B, start_B, draft,
                            config=shape_cfg)

    def run_accept_commit(state=commit_state):
        state["cache"], state["ctx"], state["out"], tau = accept_commit_stage(
            params, state["cache"], state["ctx"], state["out"], logits, taps, kv, draft,
            t0_B, start_B, n_B, config=shape_cfg)
        return tau

    fns = {"ar": ar_step(run), "round": _round_caller(run, config),
           "draft": calling(draft_stage, params, ctx0, t0_B, start_B, config=plain),
           "build": calling(build_stage, params, z, base, t0_B, config=config),
           "verify": run_verify, "accept_commit": run_accept_commit}
    med = interleaved_medians(fns, run.repeats, run.inner)
    return {f"{name}_ms": ms for name, ms in med.items()}


def ar_bytes(spec: PairSpec, context: int, itemsize: int = 2) -> int:
    """Bytes one AR step must read: the target's weights (an untied input embedding only by
    its one row) and the K/V of ``context`` committed slots in every layer."""
    t = spec.target
    weights = num_params(target_graphdef(t, "float32")[1])
    if not t.tie_word_embeddings:
        weights -= (t.vocab_size - 1) * t.hidden_size
    kv = 2 * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * context
    return (weights + kv) * itemsize


def peak_bandwidth(device_kind: str) -> float | None:
    """The vendor's peak memory bandwidth (bytes/s) of a known device kind, else None."""
    for name, bandwidth in PEAK_BANDWIDTH:
        if name.lower() in device_kind.lower():
            return bandwidth
    return None


def pair_entry(spec: PairSpec, run_settings: dict) -> dict:
    return dict(title=spec.name, published=spec.published, methods={m: {} for m in spec.methods},
                **run_settings)


def measure_pair(spec: PairSpec, entry: dict, *, deadline: Deadline, stages: str, context: int,
                 max_new_tokens: int, repeats: int, inner: int, use_pallas, write, log) -> dict:
    """Every method of ``spec``, each isolated, the report written after each: first all
    rounds (the headline), then all stages. Returns the count of each outcome."""
    outcomes = collections.Counter()
    holder = {}

    def prepare():
        holder["run"] = prepare_pair(spec, context=context, max_new_tokens=max_new_tokens,
                                     repeats=repeats, inner=inner, use_pallas=use_pallas, log=log)
        return {"target_params": num_params(holder["run"].params["target"]),
                "drafter_params": num_params(holder["run"].params["drafter"])}

    outcome = run_isolated(entry, "setup", prepare, deadline, log, f"{spec.name} weights")
    outcomes[outcome] += 1
    if outcome != "ok":
        for m in spec.methods:
            outcomes[run_isolated(entry["methods"][m], "round", _not_run(outcome), deadline,
                                  log, f"{spec.name} {m}")] += 1
        write()
        return outcomes
    run = holder["run"]
    entry["cache_slots"] = run.fresh()["cache"].max_len
    write()
    parts = [("round", measure_round)] + ([("stages", measure_stages)] if stages == "all" else [])
    for part, measure in parts:
        for m in spec.methods:
            if part == "stages" and "error" in (entry["methods"][m].get("round") or {}):
                entry["methods"][m][part] = {"skipped": "the round failed"}
                continue  # its stages would compile the same failing pieces again
            outcome = run_isolated(entry["methods"][m], part, functools.partial(measure, run, m),
                                   deadline, log, f"{spec.name} {m} {part}")
            programs = entry["methods"][m][part].get("round_programs")
            if outcome == "ok" and programs not in (None, 0, 1):  # a round that recompiles
                log(f"  {spec.name} {m}: {programs} round programs compiled, not 1")
                outcome = "error"
            outcomes[outcome] += 1
            write()
    del holder["run"], run
    return outcomes


def _not_run(reason: str):
    def fail():
        raise RuntimeError(f"not run: the pair's setup {reason}")
    return fail


# ----------------------------------------------------------------------------- report

def environment(args_summary: dict) -> dict:
    """Versions, device and flags: what a number measured here depends on."""
    import flax
    import jaxlib
    dev = jax.devices()[0]
    env = {k: v for k, v in sorted(os.environ.items())
           if k.startswith(("XLA_", "JAX_", "TF_CPP", "CUDA_VISIBLE", "NVIDIA_"))}
    kind = getattr(dev, "device_kind", "") or dev.platform
    return dict(
        python=platform.python_version(), jax=jax.__version__,
        jaxlib=getattr(jaxlib, "__version__", None) or jax.lib.__version__,
        flax=flax.__version__, backend=jax.default_backend(), platform=device_platform(dev),
        device_kind=kind, device_count=jax.device_count(),
        compute_capability=getattr(dev, "compute_capability", None),
        platform_version=str(getattr(dev.client, "platform_version", "")),
        pallas_kernel_compiles=default_device_compiles_kernel(),
        xla_flags=os.environ.get("XLA_FLAGS", ""), env=env,
        jax_config={name: getattr(jax.config, name, None) for name in (
            "jax_default_matmul_precision", "jax_enable_x64", "jax_compilation_cache_dir")},
        host=platform.node(), cpu=platform.processor() or platform.machine(),
        started_utc=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **args_summary)


def device_line(env: dict) -> str:
    return (f"jax {env['jax']} (jaxlib {env['jaxlib']}, flax {env['flax']}), backend "
            f"{env['backend']}, {env['device_count']} x {env['device_kind']}"
            + (f" (compute capability {env['compute_capability']})"
               if env.get("compute_capability") else ""))


def _cell(part: dict | None, key: str, fmt: str = "{:.3f}") -> str:
    if not part:
        return "–"
    if part.get("skipped"):
        return "skipped"
    if "error" in part:
        return "FAILED"
    return fmt.format(part[key]) if key in part else "–"


def pair_table(entry: dict, env: dict) -> list[str]:
    """One markdown table: rows of figures × methods, ours next to the paper's."""
    methods = list(entry["methods"])
    published = PUBLISHED.get(entry.get("published") or "", {})
    rounds = {m: entry["methods"][m].get("round") or {} for m in methods}
    stages = {m: entry["methods"][m].get("stages") or {} for m in methods}

    def ok(part):
        return bool(part) and "error" not in part and not part.get("skipped")

    def row(label, cells):
        return f"| {label} | " + " | ".join(cells) + " |"

    out = [row("ms (batch 1)", methods), "|---|" + "---|" * len(methods)]
    out.append(row("AR step (timed beside the round)", [_cell(rounds[m], "ar_ms")
                                                        for m in methods]))
    out.append(row("round (one jitted function)", [_cell(rounds[m], "round_ms")
                                                   for m in methods]))
    for stage, label in (("draft", "draft"), ("build", "build"), ("verify", "verify"),
                         ("accept_commit", "accept/commit")):
        out.append(row(label, [_cell(stages[m], f"{stage}_ms") for m in methods]))
    out.append(row("**round / AR step (ours)**", [
        f"**{rounds[m]['round_ms'] / rounds[m]['ar_ms']:.2f}**" if ok(rounds[m]) else "–"
        for m in methods]))
    out.append(row("paper round / AR step (tau / speedup)", [
        f"{published[m].round_per_ar:.2f}" if m in published else "–" for m in methods]))
    out.append(row("published tau", [f"{published[m].tau:.2f}" if m in published else "–"
                                     for m in methods]))
    out.append(row("published speedup", [f"{published[m].speedup:.2f}x" if m in published
                                         else "–" for m in methods]))
    out.append(row("our speedup at the published tau (tau x AR / round)", [
        f"{published[m].tau * rounds[m]['ar_ms'] / rounds[m]['round_ms']:.2f}x"
        if m in published and ok(rounds[m]) else "–" for m in methods]))
    out.append(row("build share of the round (paper, DominoTree: "
                   f"{100 * PAPER_ROUND['build'] / PAPER_ROUND['round']:.0f}%)", [
        f"{100 * stages[m]['build_ms'] / stages[m]['round_ms']:.1f}%" if ok(stages[m]) else "–"
        for m in methods]))
    out.append(row("round programs compiled (at most 1)", [
        str(rounds[m]["round_programs"]) if ok(rounds[m]) and rounds[m]["round_programs"]
        is not None else "–" for m in methods]))
    out.append(row("compile s (round)", [_cell(rounds[m], "compile_s", "{:.1f}")
                                         for m in methods]))
    return out


def bandwidth_line(entry: dict, env: dict) -> str:
    ars = [p["ar_ms"] for p in (entry["methods"][m].get("round") or {} for m in entry["methods"])
           if "ar_ms" in p]
    if not ars or not entry.get("ar_bytes"):
        return "AR step bandwidth: not measured."
    ar_ms = statistics.median(ars)
    achieved = entry["ar_bytes"] / (ar_ms * 1e-3)
    peak = env.get("peak_bandwidth")
    share = f", {100 * achieved / peak:.0f}% of the device's {peak / 1e12:.2f} TB/s" if peak \
        else " (device peak unknown: pass --peak-gbps)"
    return (f"AR step {ar_ms:.3f} ms (median over the methods' side-by-side runs) reads "
            f"{entry['ar_bytes'] / 1e9:.2f} GB (weights + {entry['context']} cached slots): "
            f"{achieved / 1e9:.0f} GB/s achieved{share}.")


def failures(report: dict) -> list[str]:
    """``"where: error"`` of every failed part, and its traceback, for the report's end."""
    out = []
    for name, r in report.get("kernel", {}).items():
        if r.get("error"):
            out.append((f"kernel check {name}", r["error"], r.get("traceback", "")))
    for pname, entry in report.get("pairs", {}).items():
        if (entry.get("setup") or {}).get("error"):
            out.append((f"{pname} setup", entry["setup"]["error"],
                        entry["setup"].get("traceback", "")))
        for m, parts in entry["methods"].items():
            for part, r in parts.items():
                if isinstance(r, dict) and r.get("error"):
                    out.append((f"{pname} {m} {part}", r["error"], r.get("traceback", "")))
                elif isinstance(r, dict) and r.get("round_programs") not in (None, 0, 1):
                    out.append((f"{pname} {m} {part}", f"{r['round_programs']} round programs "
                                "compiled for one round shape (at most 1)", ""))
    return out


def write_report(report: dict, out: Path) -> None:
    env = report["environment"]
    lines = ["# GPU suite: Pallas kernel check and round stages", "",
             f"`{report['command']}`", "", f"Device: {device_line(env)}.", "",
             f"Switches: tree kernel `{env['tree_kernel']}`, attention `{env['attention']}`; "
             f"XLA_FLAGS `{env['xla_flags'] or '(none)'}`. Random weights in bfloat16, batch 1; "
             f"each time is the median over {env['repeats']} interleaved samples of "
             f"{env['inner']} calls dispatched back to back (per call).", ""]
    if report.get("kernel"):
        lines += ["## Pallas top-M kernel vs its jnp twin", ""] + kernel_table(report["kernel"])
        lines += [""]
    for entry in report.get("pairs", {}).values():
        rows = ", ".join(f"{m} {p['round']['verify_rows']}" for m, p in entry["methods"].items()
                         if "verify_rows" in (p.get("round") or {}))
        lines += [f"## {entry['title']}", "",
                  f"Context {entry['context']} committed tokens, "
                  f"{entry.get('cache_slots', '?')} cache slots; verify rows: {rows or '–'}; "
                  f"tree expansions: {entry.get('tree_kernel', '?')}; attention "
                  f"`{entry.get('attention', '?')}`.", "", bandwidth_line(entry, env), ""]
        if not entry.get("published"):
            lines += ["No published figures for this target in this repository "
                      "(docs/algorithm.md §7 has Qwen3-4B's only).", ""]
        lines += pair_table(entry, env) + [""]
    failed = failures(report)
    if failed:
        lines += ["## Failures", ""]
        for where, error, tb in failed:
            lines += [f"FAILED {where}: `{error}`", ""]
            lines += ["```", tb.rstrip(), "```", ""] if tb else []
    lines += ["Paper-implied round / AR step = published tau / published speedup (Qwen3-4B, "
              "temperature 0, one GPU). Our speedup at the published tau = tau x AR step / "
              "round: what our measured round would give at the paper's acceptance lengths.", ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_md, tmp_json = out.with_suffix(".md.tmp"), out.with_suffix(".json.tmp")
    tmp_md.write_text("\n".join(lines))
    tmp_json.write_text(json.dumps(report, indent=1, default=str))
    tmp_md.replace(out)
    tmp_json.replace(out.with_suffix(".json"))


def merge_into(report: dict, old: dict) -> None:
    """Start ``report`` from an older one of the same device: its kernel rows and its pairs'
    methods stay unless this run measures them again (``run_isolated`` keeps an old result
    where this run only skips)."""
    report["kernel"].update(old.get("kernel", {}))
    for name, entry in old.get("pairs", {}).items():
        report["pairs"][name] = entry
    report["command"] = old.get("command", "") + "; " + report["command"]


def overall(outcomes: collections.Counter, kernel_ok: bool) -> str:
    if outcomes["error"] or not kernel_ok:
        return "FAIL"
    return "PARTIAL (deadline)" if outcomes["skipped"] else "PASS"


def parse_variants(text: str) -> tuple[tuple[int, int], ...]:
    try:
        out = tuple(tuple(int(n) for n in v.split("x")) for v in text.split(",") if v)
    except ValueError:
        out = ((),)
    if not out or any(len(v) != 2 or min(v) < 1 for v in out):
        raise ValueError(f"--kernel-variants {text!r}: give WARPSxSTAGES,... e.g. 4x1,8x2")
    return out


def main(argv=None) -> int:
    start = now()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU tests)")
    ap.add_argument("--out", type=Path, default=None,
                    help=f"markdown table (and .json beside it); default {DEFAULT_OUT} "
                    f"({DEFAULT_TINY_OUT} with --tiny)")
    ap.add_argument("--pairs", default=DEFAULT_PAIRS,
                    help="comma-separated, run in this order: qwen3-4b-domino, "
                    f"qwen3-8b-domino, qwen3-4b-dflash (default {DEFAULT_PAIRS})")
    ap.add_argument("--methods", default=None, help="comma-separated subset of each pair's "
                    "methods (default: all it supports)")
    ap.add_argument("--stages", choices=("all", "round"), default="all",
                    help="round: only each method's whole round and the AR step")
    ap.add_argument("--deadline", default=None, help="stop compiling new programs --reserve "
                    "seconds before this: seconds from the start, HH:MM[:SS] UTC or ISO")
    ap.add_argument("--reserve", type=float, default=None, help="seconds kept free before "
                    "--deadline (default 60; 0 with --tiny)")
    ap.add_argument("--tree-kernel", choices=TREE_KERNEL_MODES, default="auto",
                    help="top-M expansions: auto (Pallas where it compiles and the kernel "
                    "check passed), pallas (forced; interpret mode off a GPU), jnp")
    ap.add_argument("--attention", choices=ATTENTION_MODES, default="auto",
                    help="decode/verify attention over the cache: auto (dense on a GPU, "
                    "buckets elsewhere), bucket, dense")
    ap.add_argument("--kernel-variants", default=None, help="WARPSxSTAGES,... timed in the "
                    "kernel check (default on a GPU: " + ",".join(
                        f"{w}x{s}" for w, s in KERNEL_VARIANTS) + "; none elsewhere)")
    ap.add_argument("--peak-gbps", type=float, default=None, help="device memory bandwidth "
                    "for the AR step's share (default: known device kinds, H200 4800)")
    ap.add_argument("--repeats", type=int, default=None, help="timed calls per stage "
                    "(default 30; 5 with --tiny)")
    ap.add_argument("--inner", type=int, default=None, help="calls dispatched back to back per "
                    "timed sample (default 10; 1 with --tiny)")
    ap.add_argument("--context", type=int, default=None,
                    help="committed tokens in the caches (default 512; 32 with --tiny)")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="sizes the cache like a decode of this many tokens (default 512; 32 "
                    "with --tiny)")
    ap.add_argument("--merge", action="store_true", help="keep the methods of an existing "
                    "--out report (same device) that this run does not redo")
    ap.add_argument("--compile-cache", type=Path, default=None, help="persistent XLA "
                    "compilation cache directory: a rerun on the same machine skips compiles")
    ap.add_argument("--skip-kernel", action="store_true", help="no kernel check")
    ap.add_argument("--skip-stages", action="store_true", help="kernel check only")
    args = ap.parse_args(argv)
    pairs = tiny_pairs() if args.tiny else real_pairs()
    names = [n for n in args.pairs.split(",") if n]
    unknown = [n for n in names if n not in pairs]
    if unknown or not names:
        ap.error(f"unknown --pairs {unknown or names}; choose from {sorted(pairs)}")
    if args.methods:
        wanted = tuple(m for m in args.methods.split(",") if m)
        bad = [m for m in wanted if m not in METHODS]
        if bad or not wanted:
            ap.error(f"unknown --methods {bad or wanted}; choose from {sorted(METHODS)}")
        pairs = {n: dataclasses.replace(p, methods=tuple(m for m in p.methods if m in wanted))
                 for n, p in pairs.items()}
        empty = [n for n in names if not pairs[n].methods]
        if empty:
            ap.error(f"--methods {args.methods} leaves nothing to run for {empty}")
    repeats = args.repeats or (5 if args.tiny else 30)
    inner = args.inner or (1 if args.tiny else 10)
    context = args.context or (32 if args.tiny else 512)
    max_new = args.max_new_tokens or (32 if args.tiny else 512)
    if min(repeats, inner, context, max_new) < 1:
        ap.error("--repeats, --inner, --context and --max-new-tokens must be >= 1")
    try:
        deadline = Deadline(None if args.deadline is None else parse_deadline(args.deadline,
                                                                              start),
                            args.reserve if args.reserve is not None
                            else (0.0 if args.tiny else 60.0))
        on_gpu = jax.default_backend() == "gpu"
        variants = (parse_variants(args.kernel_variants) if args.kernel_variants
                    else (KERNEL_VARIANTS if on_gpu else ()))
    except ValueError as err:
        ap.error(str(err))
    if not (args.tiny or on_gpu):
        ap.error(f"real sizes need a GPU (backend is {jax.default_backend()!r}); use --tiny")
    out = args.out or (DEFAULT_TINY_OUT if args.tiny else DEFAULT_OUT)
    if args.compile_cache:  # before the first compile
        jax.config.update("jax_compilation_cache_dir", str(args.compile_cache))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    pairs = {n: dataclasses.replace(p, target=dataclasses.replace(
        p.target, attention_impl=args.attention)) for n, p in pairs.items()}

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    env = environment(dict(tree_kernel=args.tree_kernel, attention=args.attention,
                           repeats=repeats, inner=inner, context=context,
                           max_new_tokens=max_new, stages=args.stages,
                           deadline_utc=None if deadline.at is None else
                           datetime.datetime.fromtimestamp(deadline.at, datetime.timezone.utc)
                           .isoformat(timespec="seconds"), reserve_s=deadline.reserve))
    env["peak_bandwidth"] = (args.peak_gbps * 1e9 if args.peak_gbps
                             else peak_bandwidth(env["device_kind"]))
    report = dict(command="python -m benchmarks.gpu_suite " + " ".join(
        sys.argv[1:] if argv is None else argv), environment=env, kernel={}, pairs={})
    log(device_line(env))
    previous = out.with_suffix(".json")
    if args.merge and previous.exists():
        old = json.loads(previous.read_text())
        if device_line(old.get("environment", {}) or env) != device_line(env):
            ap.error(f"--merge: {previous} was measured on "
                     f"{device_line(old['environment'])!r}, not here")
        merge_into(report, old)
    write = functools.partial(write_report, report, out)
    write()
    outcomes = collections.Counter()
    checks = [] if args.skip_kernel else kernel_checks(pairs, names, tiny=args.tiny)
    kernel = dict(ok=True, broken=False)

    def run_kernel_checks(batch):
        """The kernel checks in ``batch``, each isolated; the first pair's runs before any
        pair (``auto`` takes the kernel only if it passed), the rest after the pairs."""
        for shapes, name in batch:
            if not deadline.allows_new_work():
                outcomes["skipped"] += 1
                log(f"kernel check {name}: skipped (deadline)")
                continue
            t = time.perf_counter()
            try:
                r = check_kernel(shapes, interpret=not on_gpu, seeds=3 if args.tiny else 20,
                                 repeats=repeats, inner=inner, variants=variants)
            except Exception as err:  # noqa: BLE001  (report it and go on to the timings)
                r = failed_kernel_row(shapes, not on_gpu, err)
                kernel["broken"] = True
            report["kernel"][name] = r
            kernel["ok"] &= r["kernel_ok"] and r["trees_equal"]
            log(f"kernel check {name}: {verdict(r['kernel_ok'] and r['trees_equal'])} "
                f"({time.perf_counter() - t:.1f} s){' ' + r['error'] if r.get('error') else ''}")
            write()
        if batch:
            print("\n".join(kernel_table(report["kernel"])) + "\n", flush=True)

    run_kernel_checks(checks[:1])
    if not args.skip_stages:
        use_pallas, tree_kernel = tree_kernel_choice(
            args.tree_kernel, on_gpu=on_gpu, kernel_broken=kernel["broken"] or not kernel["ok"])
        for name in names:
            spec = pairs[name]
            settings = dict(context=context, tree_kernel=tree_kernel, attention=args.attention,
                            ar_bytes=ar_bytes(spec, context))
            entry = report["pairs"].get(name)
            if entry is None or entry.get("title") != spec.name:
                entry = report["pairs"][name] = pair_entry(spec, settings)
            entry.update(settings)
            for m in spec.methods:
                entry["methods"].setdefault(m, {})
            outcomes += measure_pair(spec, entry, deadline=deadline, stages=args.stages,
                                     context=context, max_new_tokens=max_new, repeats=repeats,
                                     inner=inner, use_pallas=use_pallas, write=write, log=log)
            print(f"{entry['title']} (context {context}, {device_line(env)})")
            print(bandwidth_line(entry, env))
            print("\n".join(pair_table(entry, env)) + "\n", flush=True)
    run_kernel_checks(checks[1:])
    write()
    log(f"wrote {out} and {out.with_suffix('.json')}")
    verdict_text = overall(outcomes, kernel["ok"])
    print(f"OVERALL: {verdict_text}")
    return 1 if verdict_text == "FAIL" else 0


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


if __name__ == "__main__":
    sys.exit(main())
