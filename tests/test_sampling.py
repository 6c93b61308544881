"""The target-side sampling distribution: temperature, top-k, top-p."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dominotree_jax.sampling import (DRAW_BLOCK, Sampling, draw, first_argmax, is_greedy,
                                     sample_tokens, sampling_logprobs, validate_sampling)


def test_top_k_and_top_p_filter_the_right_tokens():
    logits = jnp.log(jnp.array([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    lp = np.asarray(sampling_logprobs(logits, 1.0, top_k=2))
    assert np.isfinite(lp[0, :2]).all() and np.isinf(lp[0, 2:]).all()
    np.testing.assert_allclose(np.exp(lp[0, :2]), [0.5 / 0.7, 0.2 / 0.7], rtol=1e-6)
    lp = np.asarray(sampling_logprobs(logits, 1.0, top_p=0.8))  # 0.5+0.2 < 0.8 → keep 3
    assert np.isfinite(lp[0, :3]).all() and np.isinf(lp[0, 3:]).all()
    lp = np.asarray(sampling_logprobs(logits, 1.0, top_p=0.01))  # always keeps the best
    assert np.isfinite(lp[0, 0]) and np.isinf(lp[0, 1:]).all()


@pytest.mark.parametrize("t,k,p", [(0.7, 0, 1.0), (0.7, 3, 1.0), (1.3, 0, 0.8), (0.9, 17, 0.6),
                                   (1.0, 300, 1.0), (1.0, 300, 0.5), (2.0, 1, 0.3)])
def test_traced_settings_give_what_static_ones_give(t, k, p):
    """One program over traced temperature / top-k / top-p (the sort skipped at run time when
    nothing is filtered) gives the distribution and the draws of the static settings."""
    logits = jax.random.normal(jax.random.key(5), (6, 300)) * 3
    keys = jax.random.split(jax.random.key(1), 6)
    traced_lp = jax.jit(lambda x, s: sampling_logprobs(x, *s))
    traced_tok = jax.jit(lambda ks, x, s: jax.vmap(lambda kk, row: sample_tokens(kk, row, *s))(
        ks, x))
    static_lp = sampling_logprobs(logits, t, k, p)
    np.testing.assert_allclose(np.asarray(traced_lp(logits, Sampling.of(t, k, p))),
                               np.asarray(static_lp), rtol=1e-6)
    kept = np.isfinite(np.asarray(static_lp)).sum(-1)
    assert (kept == (min(k, 300) if 0 < k else 300)).all() or p < 1.0, kept
    np.testing.assert_array_equal(
        np.asarray(traced_tok(keys, logits, Sampling.of(t, k, p))),
        np.asarray(jax.vmap(lambda kk, row: sample_tokens(kk, row, t, k, p))(keys, logits)))


def test_only_the_number_zero_is_greedy():
    assert is_greedy(0) and is_greedy(0.0) and not is_greedy(0.5)
    assert not is_greedy(np.float32(0.7)) and not is_greedy(jnp.float32(1.0))


def test_temperature_scales_and_zero_is_argmax():
    logits = jnp.array([[1.0, 3.0, 2.0]])
    np.testing.assert_allclose(np.asarray(sampling_logprobs(logits, 0.5)),
                               np.asarray(jax.nn.log_softmax(logits / 0.5)), rtol=1e-6)
    assert int(sample_tokens(jax.random.key(0), logits, 0.0)[0]) == 1


def test_sampling_frequencies():
    logits = jnp.log(jnp.array([0.6, 0.3, 0.1]))
    keys = jax.random.split(jax.random.key(0), 20000)
    draws = np.asarray(jax.vmap(lambda k: sample_tokens(k, logits, 1.0))(keys))
    np.testing.assert_allclose(np.bincount(draws, minlength=3) / 20000, [0.6, 0.3, 0.1],
                               atol=0.015)


@pytest.mark.parametrize("t,k,p,msg", [(-0.1, 0, 1.0, "temperature"), (1.0, 0, 0.0, "top_p"),
                                       (1.0, 0, 1.5, "top_p"), (1.0, -1, 1.0, "top_k")])
def test_invalid_settings_are_refused(t, k, p, msg):
    with pytest.raises(ValueError, match=msg):
        validate_sampling(t, k, p)


def test_first_argmax_is_jnp_argmax_ties_included():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, 5, (7, 3, 300)).astype(np.float32))   # many ties
    np.testing.assert_array_equal(np.asarray(first_argmax(x)), np.asarray(jnp.argmax(x, -1)))
    x = jnp.asarray(rng.standard_normal((2, 49152)).astype(np.float32))
    np.testing.assert_array_equal(np.asarray(first_argmax(x)), np.asarray(jnp.argmax(x, -1)))


@pytest.mark.parametrize("vocab", [5, 300, 1000])
def test_draw_matches_the_distribution_and_never_draws_a_zero_weight(vocab):
    """``draw``'s two-level inverse CDF (blocks of ``DRAW_BLOCK``, the last one partial)
    against exact probabilities: chi-square over the entries, none of weight 0 (-inf) drawn,
    unnormalised log-weights accepted."""
    from scipy import stats
    rng = np.random.default_rng(vocab)
    w = rng.gamma(0.3, size=vocab)
    w[rng.random(vocab) < 0.3] = 0.0                  # zero weights, inside blocks and at ends
    w[-1] = 0.0
    w[min(vocab - 2, DRAW_BLOCK - 1)] = w.max() + 1   # mass at a block's last entry
    with np.errstate(divide="ignore"):
        logw = jnp.asarray(np.log(w) + 7.0, jnp.float32)   # any normalisation; log 0 = -inf
    n = 60000
    s = np.asarray(jax.jit(lambda k: draw(k, jnp.broadcast_to(logw, (n, vocab))))(
        jax.random.key(vocab)))
    assert s.min() >= 0 and s.max() < vocab and (w[s] > 0).all()
    counts = np.bincount(s, minlength=vocab)
    expected = n * w / w.sum()
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    p = stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()).pvalue
    assert p > 1e-3, p


def test_draw_is_a_pure_function_of_its_key():
    logw = jnp.asarray(np.random.default_rng(1).standard_normal((4, 17, 700)), jnp.float32)
    a = draw(jax.random.key(3), logw)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(draw(jax.random.key(3), logw)))
    assert not np.array_equal(np.asarray(a), np.asarray(draw(jax.random.key(4), logw)))


def test_vocab_major_logits_equal_the_logits_and_16bit_weights_fall_back():
    """``TargetModel.logits_vocab_major`` (what a T > 0 verify samples from): the same logits
    as ``logits``, laid out differently only inside the compiled product."""
    from dominotree_jax.model.target import bind_target, init_target_params
    from spec_fixtures import tiny_pair
    tcfg, _, params = tiny_pair(block_size=4)
    target = bind_target(tcfg, params["target"])
    h = jax.random.normal(jax.random.key(0), (3, 5, tcfg.hidden_size))
    np.testing.assert_allclose(np.asarray(jax.jit(target.logits_vocab_major)(h)),
                               np.asarray(jax.jit(target.logits)(h)), rtol=1e-5, atol=1e-5)
    bf16 = bind_target(tcfg, init_target_params(tcfg, 0, dtype=jnp.bfloat16))
    np.testing.assert_array_equal(np.asarray(bf16.logits_vocab_major(h)),
                                  np.asarray(bf16.logits(h)))
