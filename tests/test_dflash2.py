"""DFlash2 drafters (docs/algorithm.md §3c): the in-block convolution and the path selector
against NumPy, a drafter whose convolutions are the identity drafting exactly as its DFlash
backbone, ``dflash2`` and ``dflash2tree`` lossless (equal to ``ar`` at T = 0 with batches, stop
ids, lookup and ``budget="auto"``; the target's distribution at T = 1) and an oracle reaching the
longest acceptance."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from dominotree_jax import DecodeConfig
from dominotree_jax.decoding.costs import CostTable
from dominotree_jax.model.drafter import DrafterContext, bind_drafter, init_drafter_params
from dominotree_jax.model.state import flat_to_state, state_to_flat
from dominotree_jax.model.target import bind_target
from dominotree_jax.selector_head import block_conv, selector_chain

from decode_helpers import (assert_equals_ar_on_a_batch,
                            assert_samples_follow_the_target,
                            assert_scripted_drafts_fully_accepted, jit_decode)
from spec_fixtures import sampling_case, tiny_pair

jdecode = jit_decode()


def test_block_conv_matches_numpy():
    """``Σ_o (base[o] + group-repeated δ[o]) ⊙ u_{t−o}``, zeros before the block's slot 0."""
    rng = np.random.default_rng(0)
    B, T, H, K, g = 2, 5, 12, 3, 4
    u = rng.normal(size=(B, T, H)).astype(np.float32)
    base = rng.normal(size=(K, H)).astype(np.float32)
    delta = rng.normal(size=(B, T, K, H // g)).astype(np.float32)
    want = np.zeros((B, T, H))
    for b in range(B):
        for t in range(T):
            for o in range(K):
                if t - o >= 0:
                    tap = base[o] + np.repeat(delta[b, t, o], g)
                    want[b, t] += tap * u[b, t - o]
    np.testing.assert_allclose(block_conv(jnp.asarray(u), jnp.asarray(base), jnp.asarray(delta)),
                               want, rtol=1e-5, atol=1e-5)


def test_selector_chain_matches_numpy():
    tcfg, dcfg, params = tiny_pair(dflash2=True)
    w = bind_drafter(dcfg, params["drafter"]).selector_weights()
    rng = np.random.default_rng(1)
    J, H, V, k = dcfg.num_draft_positions, dcfg.hidden_size, dcfg.vocab_size, 6
    z = rng.normal(size=(2, J, H)).astype(np.float32)
    base = (rng.normal(size=(2, J, V)) * 3).astype(np.float32)
    t0 = np.array([4, 50])
    toks, lps = selector_chain(w, jnp.asarray(z), jnp.asarray(base), jnp.asarray(t0), k)
    pred, succ, proj = (np.asarray(x, np.float64) for x in w)
    for b in range(2):
        prev = int(t0[b])
        for d in range(J):
            cand = np.argsort(-base[b, d], kind="stable")[:k]
            s = base[b, d][cand] + (succ[cand] * (proj @ z[b, d])) @ pred[prev]
            lp = s - s.max() - np.log(np.exp(s - s.max()).sum())
            assert int(toks[b, d]) == int(cand[np.argmax(s)])
            np.testing.assert_allclose(float(lps[b, d]), lp.max(), rtol=1e-5, atol=1e-5)
            prev = int(cand[np.argmax(s)])
    # the selector changes the walk: some depth leaves the base logits' argmax
    assert (np.asarray(toks) != base.argmax(-1)).any()


def test_identity_convolutions_draft_as_the_dflash_backbone():
    """Unit self-taps and no correction: a DFlash2 drafter's block forward is its DFlash
    backbone's, exactly; the tiny pair's random convolutions change it."""
    tcfg, dcfg, params = tiny_pair(dflash2=True)
    plain_cfg = dataclasses.replace(dcfg, conv_kernel=0, selector_rank=0)
    plain = init_drafter_params(plain_cfg, 5)
    flat = state_to_flat(init_drafter_params(dcfg, 5))
    flat.update(state_to_flat(plain))        # the same backbone, and identity convolutions:
    for name in flat:                        # unit self-taps (the init), no correction
        if name.endswith("kernel_projection.weight"):
            flat[name] = jnp.zeros_like(flat[name])
    ident = flat_to_state(dcfg, flat)
    target = bind_target(tcfg, params["target"])
    rng = np.random.default_rng(2)
    ctx = DrafterContext.zeros(dcfg, 2, 16)
    feats = jnp.asarray(rng.normal(size=(2, 10, dcfg.num_taps * dcfg.hidden_size)), jnp.float32)
    pos = jnp.broadcast_to(jnp.arange(10, dtype=jnp.int32), (2, 10))
    t0, start = jnp.asarray([3, 9], jnp.int32), jnp.asarray([10, 10], jnp.int32)
    outs = []
    for cfg, p in ((plain_cfg, plain), (dcfg, ident), (dcfg, params["drafter"])):
        d = bind_drafter(cfg, p)
        c = d.extend_context(ctx, feats, pos, jnp.zeros((2,), jnp.int32),
                             jnp.full((2,), 10, jnp.int32))
        outs.append(d.draft(target, c, t0, start))
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
    assert not np.allclose(outs[0][1], outs[2][1], atol=1e-3)


CASES = [("dflash2", {}), ("dflash2tree", {}), ("dflash2", dict(lookup=2)),
         ("dflash2tree", dict(lookup=2)),
         ("dflash2", dict(budget="auto", auto_costs=CostTable())),
         ("dflash2tree", dict(budget="auto", auto_costs=CostTable(), lookup=2))]


@pytest.mark.parametrize("method,extra", CASES)
def test_greedy_equals_ar_with_batches_stops_lookup_and_auto(method, extra):
    tcfg, dcfg, params = tiny_pair(dflash2=True)
    assert_equals_ar_on_a_batch(tcfg, dcfg, params, method,
                                **{**dict(budget=6, node_topk=3), **extra})


@pytest.mark.parametrize("method", ["dflash2", "dflash2tree"])
def test_oracle_reaches_the_longest_acceptance(method):
    tcfg, dcfg, params = tiny_pair(dflash2=True)
    sel = params["drafter"]["candidate_selector"]
    sel["successor_codebook"] = sel["successor_codebook"].replace(
        jnp.zeros_like(sel["successor_codebook"][...]))   # the selector keeps the base's order
    assert_scripted_drafts_fully_accepted(tcfg, dcfg, params, method, dcfg.block_size - 1)


@pytest.mark.parametrize("method", ["dflash2", "dflash2tree"])
def test_sampling_matches_the_target_distribution(method):
    assert_samples_follow_the_target(sampling_case(dflash2=True), method)


def test_dflash2_settings_are_checked():
    from dominotree_jax.config import ConfigError, check_drafter
    tcfg, dcfg, _ = tiny_pair(dflash2=True)
    with pytest.raises(ValueError, match="'dflash2' needs a DFlash2 drafter"):
        DecodeConfig(target=tcfg, drafter=tiny_pair()[1], method="dflash2")
    with pytest.raises(ValueError, match="node_topk=7 must lie in"):
        DecodeConfig(target=tcfg, drafter=dcfg, method="dflash2tree", node_topk=7)
    for bad, match in ((dict(conv_group=5), "does not divide"),
                       (dict(shift_label=True), "shift_label=False"),
                       (dict(draft_vocab_size=8), "draft vocabulary is not supported")):
        with pytest.raises(ConfigError, match=match):
            check_drafter(dataclasses.replace(dcfg, **bad))
