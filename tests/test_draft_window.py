"""The drafter window: a windowed layer sees exactly the last ``W`` committed context rows, a
``W``-slot ring gives the same drafts as a full-length context, ``W`` at least the sequence
changes nothing, and decoding stays lossless."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dominotree_jax.config import ConfigError, DrafterConfig
from dominotree_jax.model.drafter import DrafterContext, bind_drafter
from dominotree_jax.model.target import bind_target

from decode_helpers import FAST_XLA
from spec_fixtures import tiny_pair

FULL = 40  # context slots of the full-length reference
PIECES = (9, 3, 5, 1, 4)  # committed rows per extend (like a prefill and four rounds)


@pytest.fixture(scope="module")
def pair():
    tcfg, dcfg, params = tiny_pair(vocab=64, block_size=4, domino=False, layers=3)
    dcfg = dataclasses.replace(dcfg, num_hidden_layers=2, num_target_layers=3,
                               target_layer_ids=(0, 2))
    from dominotree_jax.model.drafter import init_drafter_params
    return tcfg, dcfg, params["target"], init_drafter_params(dcfg, 3)


@functools.partial(jax.jit, static_argnames=("tcfg", "dcfg", "slots", "pieces"),
                   compiler_options=FAST_XLA)
def _draft(tcfg, dcfg, tparams, dparams, feats_BTF, slots, pieces=PIECES):
    """Extend a ``slots``-slot context piece by piece (junk rows past each piece), then draft."""
    B = feats_BTF.shape[0]
    d, tgt = bind_drafter(dcfg, dparams), bind_target(tcfg, tparams)
    ctx = DrafterContext.zeros(dcfg, B, slots)
    start = 0
    for n in pieces:
        T = n + 2  # two junk rows past the committed ones, as commit writes them
        rows = feats_BTF[:, start:start + T]
        pos = jnp.broadcast_to(start + jnp.arange(T, dtype=jnp.int32), (B, T))
        ctx = d.extend_context(ctx, rows, pos, jnp.full((B,), start, jnp.int32),
                               jnp.full((B,), n, jnp.int32))
        start += n
    return d.draft(tgt, ctx, jnp.array([3, 7], jnp.int32), ctx.length)


def _feats(dcfg, seed=0):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.standard_normal((2, FULL, dcfg.num_taps * dcfg.hidden_size)),
                       jnp.float32)


def test_window_at_least_the_sequence_changes_nothing(pair):
    tcfg, dcfg, tp, dp = pair
    feats = _feats(dcfg)
    z, base = _draft(tcfg, dcfg, tp, dp, feats, FULL)
    for w in (sum(PIECES), FULL):
        wz, wbase = _draft(tcfg, dataclasses.replace(dcfg, draft_window=w), tp, dp, feats, FULL)
        np.testing.assert_array_equal(wz, z)
        np.testing.assert_array_equal(wbase, base)


@pytest.mark.parametrize("window", [1, 8])
def test_window_sees_exactly_the_last_rows(pair, window):
    tcfg, dcfg, tp, dp = pair
    wcfg = dataclasses.replace(dcfg, draft_window=window)
    n = sum(PIECES)
    feats = _feats(dcfg)
    z, _ = _draft(tcfg, wcfg, tp, dp, feats, FULL)
    older = feats.at[:, :n - window].set(5.0)   # rows outside the window
    np.testing.assert_array_equal(_draft(tcfg, wcfg, tp, dp, older, FULL)[0], z)
    inside = feats.at[:, n - window].set(5.0)   # the oldest row inside it
    assert float(jnp.max(jnp.abs(_draft(tcfg, wcfg, tp, dp, inside, FULL)[0] - z))) > 1e-4
    full_z, _ = _draft(tcfg, dcfg, tp, dp, feats, FULL)
    assert float(jnp.max(jnp.abs(full_z - z))) > 1e-4  # the window does hide something


@pytest.mark.parametrize("window", [1, 8])
def test_a_window_sized_ring_drafts_like_the_full_context(pair, window):
    tcfg, dcfg, tp, dp = pair
    wcfg = dataclasses.replace(dcfg, draft_window=window)
    assert wcfg.context_slots(FULL) == window
    feats = _feats(dcfg, 1)
    z, base = _draft(tcfg, wcfg, tp, dp, feats, FULL)
    rz, rbase = _draft(tcfg, wcfg, tp, dp, feats, window)  # pieces of 9 > window wrap the ring
    np.testing.assert_allclose(rz, z, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rbase, base, rtol=1e-5, atol=1e-4)


def test_released_sliding_layers_and_the_setting_combine(pair):
    _, dcfg, _, _ = pair
    hf = dcfg.to_hf_dict()
    hf.update(use_sliding_window=True, sliding_window=6,
              layer_types=["sliding_attention", "full_attention"])
    released = DrafterConfig.from_hf_dict(hf)
    assert [released.layer_window(i) for i in range(2)] == [6, None]
    assert released.context_slots(FULL) == FULL  # a full layer needs every row
    both = dataclasses.replace(released, draft_window=10)
    assert [both.layer_window(i) for i in range(2)] == [6, 10]
    assert both.context_slots(FULL) == 10
    hf["use_sliding_window"] = False  # as in transformers: the window is then off
    assert DrafterConfig.from_hf_dict(hf).sliding_window is None
    assert DrafterConfig.from_hf_dict(released.to_hf_dict()) == released
    with pytest.raises(ConfigError, match="draft_window=0 must be a positive integer"):
        dataclasses.replace(dcfg, draft_window=0)
    with pytest.raises(ConfigError, match="layer_types has 1 entries for 2 layers"):
        dataclasses.replace(released, layer_types=("sliding_attention",))


def test_ring_context_has_window_slots(pair):
    tcfg, dcfg, tp, dp = pair
    wcfg = dataclasses.replace(dcfg, draft_window=4)
    out = _draft(tcfg, wcfg, tp, dp, _feats(dcfg), wcfg.context_slots(FULL))[1]
    assert out.shape == (2, dcfg.num_draft_positions, tcfg.vocab_size)


# --------------------------------------------------------------------------- decode

@pytest.fixture(scope="module")
def domino_pair():
    return tiny_pair(vocab=64, block_size=4, domino=True, seed=2)


def test_decode_config_folds_the_window_into_the_drafter(domino_pair):
    from dominotree_jax import DecodeConfig
    tcfg, dcfg, _ = domino_pair
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method="dominotree", draft_window=16)
    assert cfg.drafter.draft_window == 16 and cfg.drafter.context_slots(100) == 16
    assert cfg.replace(draft_window=None).drafter == dcfg
    with pytest.raises(ValueError, match="draft_window must be a positive integer"):
        cfg.replace(draft_window=0)


@pytest.mark.parametrize("method", ["dflash"])
def test_decode_is_lossless_and_a_wide_window_changes_nothing(domino_pair, method):
    from decode_helpers import fresh_jit_decode

    from dominotree_jax import DecodeConfig
    tcfg, dcfg, params = domino_pair
    run = fresh_jit_decode()
    rng = np.random.default_rng(3)
    prompt = jnp.asarray(rng.integers(0, 63, (2, 20)), jnp.int32)
    lengths = jnp.asarray([20, 13], jnp.int32)
    base = DecodeConfig(target=tcfg, drafter=dcfg, method=method, max_new_tokens=16,
                        budget=6, node_topk=2, top_m=0)
    ar = run(params, prompt, lengths, config=base.replace(method="ar", drafter=None))
    full = run(params, prompt, lengths, config=base)
    np.testing.assert_array_equal(full.tokens, ar.tokens)
    for window in (3, 64):
        out = run(params, prompt, lengths, config=base.replace(draft_window=window))
        np.testing.assert_array_equal(out.tokens, ar.tokens)  # lossless with any window
        if window == 64:  # at least prompt + output: the very same drafts and rounds
            np.testing.assert_array_equal(out.accept_lengths, full.accept_lengths)
            np.testing.assert_array_equal(out.num_rounds, full.num_rounds)
