"""GPU suite: is the Pallas kernel right on this GPU, and how long does a round take at real size?

    python benchmarks/gpu_suite.py                  # on a GPU: real sizes, bf16, random weights
    python benchmarks/gpu_suite.py --tiny           # anywhere (CPU: Pallas in interpret mode)
    python benchmarks/gpu_suite.py --pairs qwen3-4b-dflash --repeats 30 --out /tmp/x.md

1. Kernel check: the Pallas top-M expansion (``pallas_kernels/topm_expand.py``) against its jnp
   twin (``dominotree_jax/domino_head.expand_split_jnp``) on random operands at the Domino-head
   shapes of each pair (H = the target's hidden size, G=1024, E=256, M=64, k=8) and of the
   shipped SmolLM2-135M drafter: identical indices and log-probs within 1e-5; the time of one
   pop with each; and ``build_tree`` with the kernel vs without it (identical trees on 3
   rounds, time per tree). On a GPU the kernel is compiled through Triton; elsewhere it runs in
   interpret mode.
2. Round stages for real-size pairs with random bf16 weights (batch 1, ``--context`` committed
   tokens): Qwen3-4B + DFlash-b16 (methods dflash, ddtree) and Qwen3-8B + Domino-b16 (dflash,
   domino, ddtree, dominotree). Per method: the AR step (the ``ar`` round: a one-row verify,
   argmax, commit), draft (drafter block forward, LM head included), build (chain or tree and
   its verify mask), verify (target forward over the draft rows), accept/commit (argmax,
   acceptance walk, cache compaction, drafter-context extend, output write) and the whole round
   as one jitted function; the build share of the round; and the speedup
   estimated at the published acceptance length, ``tau * AR step / round``, next to the paper's
   figures (Qwen3-4B, one GPU: tree build 3.67 ms of a 26.54 ms round).

Random weights do not change any stage's cost: every shape is static (the tree always pops
``budget`` nodes, the acceptance walk always takes ``max_depth`` steps), so a round costs the
same whatever the weights draft. Caches are zero-filled with ``--context`` committed slots
(a prefill would add nothing but a compile). Each time is the median of ``--repeats`` samples
after warm-up, interleaved round-robin; a sample is ``--inner`` calls dispatched back to back and
one wait, per call (Python dispatch overlaps with the GPU, as in the jitted decode loop).
The tables go to ``--out`` (markdown) and the same path with ``.json``; they are rewritten
after every section, so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dominotree_jax.bench.timing import interleaved_medians  # noqa: E402
from dominotree_jax.config import DrafterConfig, TargetConfig, check_pair  # noqa: E402
from dominotree_jax.decoding.accept import accept_walk  # noqa: E402
from dominotree_jax.decoding.commit import commit, keep_rows  # noqa: E402
from dominotree_jax.decoding.config import CHAIN_METHODS, TREE_METHODS, DecodeConfig  # noqa: E402
from dominotree_jax.decoding.draft import (  # noqa: E402
    bind_drafter_for, chain_draft, tap_layers_for, tree_draft,
)
from dominotree_jax.decoding.round import RoundInput, commit_rows, fixed_round  # noqa: E402
from dominotree_jax.decoding.verify import verify_rows  # noqa: E402
from dominotree_jax.domino_head import expand_split_jnp, split_projection  # noqa: E402
from dominotree_jax.model.cache import KVCache  # noqa: E402
from dominotree_jax.model.drafter import DrafterContext, drafter_graphdef  # noqa: E402
from dominotree_jax.model.target import bind_target, target_graphdef  # noqa: E402
from dominotree_jax.sampling import sample_tokens  # noqa: E402
from dominotree_jax.tree import build_tree  # noqa: E402
from pallas_kernels.topm_expand import expand_padded_pallas, pad_operands  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "benchmarks" / "results" / "gpu_suite.md"
DEFAULT_TINY_OUT = REPO / "benchmarks" / "results" / "gpu_suite_tiny.md"

# Published reference (Qwen3-4B target, temperature 0, one GPU): acceptance length tau per method,
# and the DominoTree round split (tree build 3.67 ms of a 26.54 ms round, 4.81x speedup).
PUBLISHED_TAU = {"dflash": 6.25, "domino": 7.17, "ddtree": 7.03, "dominotree": 7.98}
PAPER = {"build": 3.67, "round": 26.54, "speedup": 4.81}

LP_TOL = 1e-5       # kernel vs jnp twin, max |delta log-prob|
TOP_M, NODE_TOPK, BUDGET = 64, 8, 16


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


def real_pairs() -> dict[str, PairSpec]:
    qwen3_4b = qwen3_target(2560, 36, 32, 8, 128, 9728, 151936, tied=True)
    qwen3_8b = qwen3_target(4096, 36, 32, 8, 128, 12288, 151936, tied=False)
    b16 = dict(layers=5, block=16, taps=(1, 9, 17, 25, 33), mask_id=151669)
    return {
        "qwen3-4b-dflash": PairSpec("Qwen3-4B + DFlash-b16", qwen3_4b,
                                    dflash_drafter(qwen3_4b, **b16), ("dflash", "ddtree")),
        "qwen3-8b-domino": PairSpec("Qwen3-8B + Domino-b16", qwen3_8b,
                                    dflash_drafter(qwen3_8b, **b16, domino=True),
                                    ("dflash", "domino", "ddtree", "dominotree")),
    }


def tiny_pairs() -> dict[str, PairSpec]:
    """The same two pairs, shrunk (every structural feature kept: tied/untied head, 5 taps,
    block 16, a Domino head) so that the whole suite runs on a CPU in about a minute."""
    tiny_4b = qwen3_target(64, 5, 4, 2, 16, 128, 512, tied=True)
    tiny_8b = qwen3_target(64, 5, 4, 2, 16, 192, 512, tied=False)
    b16 = dict(layers=1, block=16, taps=(0, 1, 2, 3, 4), mask_id=511)
    return {
        "qwen3-4b-dflash": PairSpec("tiny Qwen3-4B-like + DFlash-b16", tiny_4b,
                                    dflash_drafter(tiny_4b, **b16), ("dflash", "ddtree"),
                                    kernel_head=(32, 24)),
        "qwen3-8b-domino": PairSpec("tiny Qwen3-8B-like + Domino-b16", tiny_8b,
                                    dflash_drafter(tiny_8b, **b16, domino=True, gru_hidden=32,
                                                   emb_dim=24),
                                    ("dflash", "domino", "ddtree", "dominotree")),
    }


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
                 inner: int = 1) -> dict:
    """Kernel vs jnp twin (results and per-pop time) and ``build_tree`` with vs without it."""
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
    return dict(shapes=str(shapes),
                mode="interpret" if interpret else "compiled", seeds=seeds,
                indices_equal=same_idx, max_abs_dlp=max_diff,
                kernel_ok=same_idx and max_diff <= LP_TOL, pop_jnp_us=1e3 * pop["jnp"],
                pop_pallas_us=1e3 * pop["pallas"], trees_equal=same_tree,
                build_jnp_ms=build_jnp, build_pallas_ms=build_pal)


def failed_kernel_row(shapes: KernelShapes, interpret: bool, err: Exception) -> dict:
    """A kernel-table row for a check that raised (e.g. the kernel does not compile)."""
    nan = float("nan")
    return dict(shapes=str(shapes), mode="interpret" if interpret else "compiled", seeds=0,
                indices_equal=False, max_abs_dlp=nan, kernel_ok=False, pop_jnp_us=nan,
                pop_pallas_us=nan, trees_equal=False, build_jnp_ms=nan, build_pallas_ms=nan,
                error=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")


def kernel_table(rows: dict[str, dict]) -> list[str]:
    out = ["| drafter | shapes | mode | kernel vs jnp | max abs dlp | pop jnp us | pop Pallas us "
           "| build_tree same | build jnp ms | build Pallas ms |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        out.append(f"| {name} | {r['shapes']} | {r['mode']} | {verdict(r['kernel_ok'])} "
                   f"({r['seeds']} inputs) | {r['max_abs_dlp']:.1e} | {r['pop_jnp_us']:.1f} "
                   f"| {r['pop_pallas_us']:.1f} | {verdict(r['trees_equal'])} "
                   f"| {r['build_jnp_ms']:.3f} | {r['build_pallas_ms']:.3f} |")
    return out


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# ----------------------------------------------------------------------------- round stages

STAGES = ("draft", "build", "verify", "accept_commit", "round")
STAGE_LABELS = {"ar": "AR step", "draft": "draft", "build": "build", "verify": "verify",
                "accept_commit": "accept/commit", "round": "round (one jitted function)"}


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


def time_pair(spec: PairSpec, params, *, context: int, max_new_tokens: int, repeats: int,
              inner: int = 1, use_pallas="auto", log=print) -> dict:
    """Median ms of every stage of every method of ``spec`` (batch 1), and of the AR step."""
    configs = decode_configs(spec, max_new_tokens=max_new_tokens, use_pallas=use_pallas)
    dtype = jax.tree.leaves(params["target"])[0].dtype
    t0_B = jnp.full((1,), 7, jnp.int32)
    start_B = jnp.full((1,), context, jnp.int32)
    n_B = jnp.ones((1,), jnp.int32)
    fresh = functools.partial(round_buffers, spec, configs, context=context,
                              max_new_tokens=max_new_tokens, dtype=dtype)
    S = fresh()["cache"].max_len

    fns = {}
    ctx0 = fresh()["ctx"]

    def ar_round(state, config=configs["ar"]):
        state["cache"], _, state["out"], tau = round_stage(params, state["cache"], None,
                                                           state["out"], t0_B, start_B, n_B,
                                                           config=config)
        return tau

    t = time.perf_counter()
    ar_state = fresh()
    jax.block_until_ready(ar_round(ar_state))
    fns["ar"] = functools.partial(ar_round, ar_state)
    log(f"  compiled the AR step ({time.perf_counter() - t:.1f} s)")

    for method in spec.methods:
        t = time.perf_counter()
        config = configs[method]
        # stage-level programs depend only on what shapes them: share them across methods
        plain = _shared(config, method="dflash", budget=BUDGET, use_pallas=use_pallas)
        z, base = draft_stage(params, ctx0, t0_B, start_B, config=plain)
        draft = build_stage(params, z, base, t0_B, config=config)
        shape_cfg = _shared(config, method="ddtree" if method in TREE_METHODS else "dflash")
        logits, taps, kv = verify_stage(params, fresh()["cache"], t0_B, start_B, draft,
                                        config=shape_cfg)
        jax.block_until_ready(accept_commit_stage(params, *fresh().values(), logits, taps, kv,
                                                  draft, t0_B, start_B, n_B, config=shape_cfg))
        verify_state, commit_state, round_state = fresh(), fresh(), fresh()

        def run_verify(state=verify_state, draft=draft, config=shape_cfg):
            return verify_stage(params, state["cache"], t0_B, start_B, draft, config=config)

        def run_accept_commit(state=commit_state, logits=logits, taps=taps, kv=kv, draft=draft,
                              config=shape_cfg):
            state["cache"], state["ctx"], state["out"], tau = accept_commit_stage(
                params, state["cache"], state["ctx"], state["out"], logits, taps, kv, draft,
                t0_B, start_B, n_B, config=config)
            return tau

        def run_round(state=round_state, config=config):
            state["cache"], state["ctx"], state["out"], tau = round_stage(
                params, state["cache"], state["ctx"], state["out"], t0_B, start_B, n_B,
                config=config)
            return tau

        jax.block_until_ready(run_round())
        fns[f"{method}/draft"] = calling(draft_stage, params, ctx0, t0_B, start_B, config=plain)
        fns[f"{method}/build"] = calling(build_stage, params, z, base, t0_B, config=config)
        fns[f"{method}/verify"] = run_verify
        fns[f"{method}/accept_commit"] = run_accept_commit
        fns[f"{method}/round"] = run_round
        log(f"  compiled {method} ({config.num_draft_nodes + 1} verify rows; "
            f"{time.perf_counter() - t:.1f} s)")

    med = interleaved_medians(fns, repeats, inner)
    return dict(title=spec.name, context=context, cache_slots=S, ar_ms=med["ar"],
                methods={m: {s: med[f"{m}/{s}"] for s in STAGES} for m in spec.methods},
                verify_rows={m: configs[m].num_draft_nodes + 1 for m in spec.methods})


def estimated_speedup(tau: float, ar_ms: float, round_ms: float) -> float:
    """Tokens per round over the AR step's token: ``tau * AR step / round``."""
    return tau * ar_ms / round_ms


def pair_table(result: dict) -> list[str]:
    """One markdown table: stages (rows) × methods (columns), then the paper's figures."""
    methods = list(result["methods"])
    ar = result["ar_ms"]
    out = ["| ms (batch 1) | " + " | ".join(methods) + " | paper: DominoTree, Qwen3-4B |",
           "|---|" + "---|" * (len(methods) + 1)]
    out.append(f"| {STAGE_LABELS['ar']} | " + " | ".join(f"{ar:.3f}" for _ in methods)
               + " | – |")
    paper = {"build": f"{PAPER['build']:.2f}", "round": f"{PAPER['round']:.2f}"}
    for stage in STAGES:
        cells = [f"{result['methods'][m][stage]:.3f}" for m in methods]
        out.append(f"| {STAGE_LABELS[stage]} | " + " | ".join(cells)
                   + f" | {paper.get(stage, '–')} |")
    shares = [100 * result["methods"][m]["build"] / result["methods"][m]["round"]
              for m in methods]
    out.append("| build share of the round | " + " | ".join(f"{s:.1f}%" for s in shares)
               + f" | {100 * PAPER['build'] / PAPER['round']:.1f}% |")
    out.append("| round / AR step | " + " | ".join(
        f"{result['methods'][m]['round'] / ar:.2f}" for m in methods) + " | – |")
    out.append("| published tau | " + " | ".join(f"{PUBLISHED_TAU[m]:.2f}" for m in methods)
               + f" | {PUBLISHED_TAU['dominotree']:.2f} |")
    out.append("| est. speedup: tau x AR step / round | " + " | ".join(
        f"{estimated_speedup(PUBLISHED_TAU[m], ar, result['methods'][m]['round']):.2f}x"
        for m in methods) + f" | {PAPER['speedup']:.2f}x (measured) |")
    return out


# ----------------------------------------------------------------------------- report

def device_line() -> str:
    dev = jax.devices()[0]
    return (f"jax {jax.__version__}, backend {jax.default_backend()}, "
            f"{jax.device_count()} x {getattr(dev, 'device_kind', dev.platform)}")


def write_report(report: dict, out: Path) -> None:
    lines = ["# GPU suite: Pallas kernel check and round stages", "",
             f"`{report['command']}`", "", f"Device: {report['device']}. "
             f"Random weights in {report['dtype']}, batch 1; each time is the median over "
             f"{report['repeats']} interleaved samples of {report.get('inner', 1)} calls "
             "dispatched back to back (per call).", ""]
    if report.get("kernel"):
        lines += ["## Pallas top-M kernel vs its jnp twin", ""] + kernel_table(report["kernel"])
        lines += [""]
    for name, r in report.get("kernel", {}).items():
        if r.get("error"):
            lines += [f"Kernel check {name} raised: `{r['error']}`", ""]
    for result in report.get("pairs", {}).values():
        lines += [f"## {result['title']}", "",
                  f"Context {result['context']} committed tokens, {result['cache_slots']} cache "
                  f"slots; verify rows: " + ", ".join(f"{m} {r}" for m, r in
                                                      result["verify_rows"].items())
                  + f"; tree expansions: {result.get('tree_kernel', 'auto')}.", ""]
        lines += pair_table(result) + [""]
    for error in report.get("errors", []):
        lines += [f"FAILED {error}", ""]
    lines += ["Estimated speedup = published tau (Qwen3-4B, temperature 0) x AR step / round: "
              "what the measured round would give at the paper's acceptance lengths. Paper "
              "column: the published DominoTree round on one GPU (tree build 3.67 ms of 26.54 "
              "ms) and its measured speedup.", ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    out.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU tests)")
    ap.add_argument("--out", type=Path, default=None,
                    help=f"markdown table (and .json beside it); default {DEFAULT_OUT} "
                    f"({DEFAULT_TINY_OUT} with --tiny)")
    ap.add_argument("--pairs", default="qwen3-4b-dflash,qwen3-8b-domino",
                    help="comma-separated: qwen3-4b-dflash, qwen3-8b-domino")
    ap.add_argument("--methods", default=None, help="comma-separated subset of each pair's "
                    "methods (default: all it supports)")
    ap.add_argument("--repeats", type=int, default=None, help="timed calls per stage "
                    "(default 30; 5 with --tiny)")
    ap.add_argument("--inner", type=int, default=None, help="calls dispatched back to back per "
                    "timed sample (default 10; 1 with --tiny)")
    ap.add_argument("--context", type=int, default=None,
                    help="committed tokens in the caches (default 512; 32 with --tiny)")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="sizes the cache like a decode of this many tokens (default 512; 32 "
                    "with --tiny)")
    ap.add_argument("--merge", action="store_true", help="keep the sections of an existing "
                    "--out report (same device) that this run does not redo: split a long run "
                    "into several commands")
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
        bad = [m for m in wanted if m not in PUBLISHED_TAU]
        if bad or not wanted:
            ap.error(f"unknown --methods {bad or wanted}; choose from {sorted(PUBLISHED_TAU)}")
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
    on_gpu = jax.default_backend() == "gpu"
    if not (args.tiny or on_gpu):
        ap.error(f"real sizes need a GPU (backend is {jax.default_backend()!r}); use --tiny")
    out = args.out or (DEFAULT_TINY_OUT if args.tiny else DEFAULT_OUT)
    if args.compile_cache:  # before the first compile
        jax.config.update("jax_compilation_cache_dir", str(args.compile_cache))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    report = dict(command="python benchmarks/gpu_suite.py " + " ".join(argv or sys.argv[1:]),
                  device=device_line(), dtype="bfloat16", repeats=repeats, inner=inner,
                  kernel={}, pairs={})
    log(report["device"])
    previous = out.with_suffix(".json")
    if args.merge and previous.exists():
        old = json.loads(previous.read_text())
        if old.get("device") != report["device"]:
            ap.error(f"--merge: {previous} was measured on {old.get('device')!r}, not here")
        report["kernel"].update(old.get("kernel", {}))
        report["pairs"].update(old.get("pairs", {}))
        report["command"] = old.get("command", "") + "; " + report["command"]
    ok, kernel_broken = True, False
    if not args.skip_kernel:
        checks = {}  # shapes -> the drafters that have them (each distinct shape checked once)
        for name in names:
            checks.setdefault(kernel_shapes(pairs[name]), []).append(name)
        if not args.tiny:
            checks.setdefault(SMOLLM2_KERNEL, []).append("smollm2-135m-domino")
        for shapes, drafters in checks.items():
            name = ", ".join(drafters)
            t = time.perf_counter()
            try:
                r = check_kernel(shapes, interpret=not on_gpu, seeds=3 if args.tiny else 20,
                                 repeats=repeats, inner=inner)
            except Exception as err:  # noqa: BLE001  (report it and go on to the timings)
                r = failed_kernel_row(shapes, not on_gpu, err)
                kernel_broken = True
            report["kernel"][name] = r
            ok &= r["kernel_ok"] and r["trees_equal"]
            log(f"kernel check {name}: {verdict(r['kernel_ok'] and r['trees_equal'])} "
                f"({time.perf_counter() - t:.1f} s){' ' + r['error'] if r.get('error') else ''}")
            write_report(report, out)
        print("\n".join(kernel_table(report["kernel"])) + "\n", flush=True)
    if not args.skip_stages:
        # a kernel that does not build must not hide the rest: time the trees with the jnp twin
        use_pallas = False if kernel_broken else "auto"
        for name in names:
            spec = pairs[name]
            t = time.perf_counter()
            try:
                params = pair_params(spec)
                log(f"{spec.name}: {num_params(params['target']) / 1e6:.1f} M target + "
                    f"{num_params(params['drafter']) / 1e6:.1f} M drafter parameters "
                    f"({time.perf_counter() - t:.1f} s)")
                result = time_pair(spec, params, context=context, max_new_tokens=max_new,
                                   repeats=repeats, inner=inner, use_pallas=use_pallas, log=log)
                del params
            except Exception as err:  # noqa: BLE001  (report it and go on to the next pair)
                ok = False
                report["errors"] = report.get("errors", []) + [f"{name}: {err!r}"]
                log(f"{spec.name}: FAILED: {err!r}")
                write_report(report, out)
                continue
            result["tree_kernel"] = "jnp twin (the Pallas kernel failed)" if kernel_broken \
                else ("Pallas" if on_gpu else "jnp twin (no GPU)")
            report["pairs"][name] = result
            write_report(report, out)
            print(f"{result['title']} (context {context}, {device_line()})")
            print("\n".join(pair_table(result)) + "\n", flush=True)
    log(f"wrote {out} and {out.with_suffix('.json')}")
    print(f"OVERALL: {verdict(ok)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
