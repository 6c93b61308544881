"""Shared bits of the batching / log-prob / sharding tests: a quick-to-compile jitted decode
and a lookup "oracle" drafter that gets some drafts accepted."""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax import decode
from dominotree_jax.model.drafter import Drafter

# The tiny test models run in milliseconds; XLA's CPU backend optimisations cost seconds per
# compile. Level 0 halves compile time and changes no result these tests look at; XLA's CPU
# loop emitters instead of its fusion emitters (the default) halve it again for a decode
# program (dominotree 3.0 -> 1.5-1.9 s, Intel Xeon, 2026-12-07).
FAST_XLA = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True,
            "xla_cpu_use_fusion_emitters": False}
# The sampling tests' batches of ~20000 rows: XLA's constant folding evaluates the loop's
# batch-wide constants (e.g. a [20000, J, V] reduce of a broadcast constant) in its HLO
# interpreter at compile time, 5-12 s each. Without the pass the same values are computed when
# the program runs (milliseconds); the decode itself is unchanged.
SAMPLING_XLA = dict(FAST_XLA, xla_disable_hlo_passes="constant_folding")


def jit_decode(compiler_options=FAST_XLA):
    """``decode`` jitted with ``config`` static, compiled with ``compiler_options``, without
    the in-program value checks (test_api_jit tests those): a program with their host callback
    is never written to the persistent compilation cache the test processes share."""
    return jax.jit(functools.partial(decode, value_checks=False), static_argnames="config",
                   compiler_options=compiler_options)


def fresh_jit_decode(compiler_options=FAST_XLA):
    """``run(params, prompt_BT, lengths_B, key=None, *, config)``: ``decode`` jitted with a
    compilation cache of its own (a new function object per call), so traces made while a test
    patches the drafter are never shared with other test modules."""

    def run(params, prompt_BT, lengths_B, key=None, *, config):
        return decode(params, prompt_BT, config=config, key=key, prompt_lengths=lengths_B,
                      value_checks=False)

    return jax.jit(run, static_argnames="config", compiler_options=compiler_options)


@contextlib.contextmanager
def count_host_callbacks(monkeypatch):
    """Counts ``jax.pure_callback``s traced while the block runs."""
    made, real = [], jax.pure_callback

    def counting(*a, **kw):
        made.append(a[0])
        return real(*a, **kw)

    monkeypatch.setattr(jax, "pure_callback", counting)
    yield made


def oracle_table(prompt_BT, lengths_B, gen_BY, vocab, depth):
    """int32 ``[S, V, J]``: the token depth ``d`` should guess for a block at ``start`` whose
    ``t0`` is ``v`` (-1: no guess). Right (from the AR continuation) unless ``start + d`` is
    ``3 mod 4``, where it stays silent and the random drafter guesses instead."""
    seqs = [np.concatenate([p[:n], g]) for p, n, g in zip(prompt_BT, lengths_B, gen_BY)]
    S = max(len(s) for s in seqs) + 1
    table = np.full((S, vocab, depth), -1, np.int32)
    for seq in seqs:
        for start in range(len(seq)):
            for d in range(depth):
                if start + 1 + d < len(seq) and (start + d) % 4 != 3:
                    table[start, seq[start], d] = seq[start + 1 + d]
    return jnp.asarray(table)


@contextlib.contextmanager
def lookup_drafter(table_SVJ):
    """Patch ``Drafter.draft``: where the table has a guess, it dominates the base logits."""
    original = Drafter.draft

    def draft(self, target, ctx, t0_B, start_B, head_rows_CH=None):
        z, base_BJV = original(self, target, ctx, t0_B, start_B, head_rows_CH)
        guess_BJ = table_SVJ[jnp.clip(start_B, 0, table_SVJ.shape[0] - 1), t0_B]
        hot_BJV = jax.nn.one_hot(guess_BJ, base_BJV.shape[-1]) * 30.0  # -1 → all zeros
        return z, jnp.where((guess_BJ >= 0)[..., None], base_BJV * 0.01 + hot_BJV, base_BJV)

    Drafter.draft = draft
    try:
        yield
    finally:
        Drafter.draft = original


def assert_equals_ar_on_a_batch(tcfg, dcfg, params, method: str, **kw):
    """``method`` decodes two right-padded prompts of different lengths with a stop id exactly
    as ``ar`` does (``kw``: more ``DecodeConfig`` settings, e.g. ``lookup``, ``budget="auto"``)."""
    from dominotree_jax import DecodeConfig
    run = jit_decode()
    prompt = jnp.asarray([[3, 17, 5, 9, 33, 2, 8, 3, 17], [4, 4, 21, 6, 0, 0, 0, 0, 0]],
                         jnp.int32)
    lengths = jnp.asarray([9, 5], jnp.int32)
    base = dict(max_new_tokens=30, stop_ids=(11,))
    ar = run(params, prompt, config=DecodeConfig(target=tcfg, method="ar", **base),
             prompt_lengths=lengths)
    out = run(params, prompt, config=DecodeConfig(target=tcfg, drafter=dcfg, method=method,
                                                  **{**base, **kw}), prompt_lengths=lengths)
    np.testing.assert_array_equal(out.tokens, ar.tokens, err_msg=method)
    np.testing.assert_array_equal(out.num_tokens, ar.num_tokens, err_msg=method)


def assert_scripted_drafts_fully_accepted(tcfg, dcfg, params, method: str, max_depth: int,
                                          **kw):
    """With the drafter's base logits scripted to the target's own continuation
    (``spec_fixtures.scripted_drafter``; its head made neutral by the caller), ``method``
    decodes ``ar``'s tokens and every round but the last accepts ``max_depth`` drafted tokens
    plus the bonus (``kw``: more ``DecodeConfig`` settings)."""
    from dominotree_jax import DecodeConfig
    from spec_fixtures import scripted_drafter
    prompt = jnp.array([3, 17, 5, 9, 33])
    n = 30
    ar = jit_decode()(params, prompt, config=DecodeConfig(target=tcfg, method="ar",
                                                          max_new_tokens=n + 10))
    seq = np.concatenate([np.asarray(prompt), np.asarray(ar.tokens[0])])
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method=method, max_new_tokens=n, budget=8,
                       node_topk=2, **kw)
    with scripted_drafter(seq):
        out = fresh_jit_decode()(params, prompt[None], None, config=cfg)
    np.testing.assert_array_equal(out.tokens[0], ar.tokens[0, :n])
    taus = np.asarray(out.accept_lengths[0, :int(out.num_rounds[0])])
    assert cfg.max_depth == max_depth
    assert (taus[:-1] == max_depth + 1).all(), taus


def assert_samples_follow_the_target(case, method: str, **kw):
    """At T = 1 the first tokens of 20000 rows drafted by ``method`` pass a chi-square test
    against the target's exact distribution (``case``: ``spec_fixtures.sampling_case``), and
    drafts were accepted."""
    from dominotree_jax import DecodeConfig
    from spec_fixtures import first_tokens_chi_square_p
    runs = 20000
    tcfg, dcfg, params, prompt, exact = case
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method=method, max_new_tokens=3,
                       temperature=1.0, budget=6, node_topk=2, **kw)
    out = jit_decode(SAMPLING_XLA)(params, jnp.tile(prompt, (runs, 1)), config=cfg,
                                   key=jax.random.key(7))
    p = first_tokens_chi_square_p(np.asarray(out.tokens), exact, tcfg.vocab_size)
    assert p > 1e-3, (method, p)
    assert int(np.asarray(out.accept_lengths).max()) > 1   # drafts were accepted
