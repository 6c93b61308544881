"""The target-side sampling distribution: temperature, top-k, top-p."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dominotree_jax.sampling import sample_tokens, sampling_logprobs, validate_sampling


def test_top_k_and_top_p_filter_the_right_tokens():
    logits = jnp.log(jnp.array([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    lp = np.asarray(sampling_logprobs(logits, 1.0, top_k=2))
    assert np.isfinite(lp[0, :2]).all() and np.isinf(lp[0, 2:]).all()
    np.testing.assert_allclose(np.exp(lp[0, :2]), [0.5 / 0.7, 0.2 / 0.7], rtol=1e-6)
    lp = np.asarray(sampling_logprobs(logits, 1.0, top_p=0.8))  # 0.5+0.2 < 0.8 → keep 3
    assert np.isfinite(lp[0, :3]).all() and np.isinf(lp[0, 3:]).all()
    lp = np.asarray(sampling_logprobs(logits, 1.0, top_p=0.01))  # always keeps the best
    assert np.isfinite(lp[0, 0]) and np.isinf(lp[0, 1:]).all()


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
