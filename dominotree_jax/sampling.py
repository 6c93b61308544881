"""The target's sampling distribution: temperature, top-k, top-p (applied in HF's order).

``temperature == 0`` means greedy (argmax). Everything is float32 and jittable with static
settings.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def validate_sampling(temperature: float, top_k: int, top_p: float):
    if not temperature >= 0.0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 = off), got {top_k}")


def sampling_logprobs(logits_sV: jax.Array, temperature: float, top_k: int = 0,
                      top_p: float = 1.0) -> jax.Array:
    """Log-probabilities ``[..., V]`` of the distribution tokens are drawn from.

    Filtered-out tokens get ``-inf``. At ``temperature == 0`` this is the (unfiltered)
    temperature-1 distribution, which greedy decoding reports as its log-probs.
    """
    x = logits_sV.astype(jnp.float32)
    if temperature > 0:
        x = x / temperature
        if top_k > 0 and top_k < x.shape[-1]:
            kth = jax.lax.top_k(x, top_k)[0][..., -1:]
            x = jnp.where(x < kth, -jnp.inf, x)
        if top_p < 1.0:
            sorted_desc = -jnp.sort(-x, axis=-1)
            probs = jax.nn.softmax(sorted_desc, axis=-1)
            mass_before = jnp.cumsum(probs, axis=-1) - probs
            keep_sorted = mass_before < top_p  # the first token is always kept
            n_keep = jnp.sum(keep_sorted, axis=-1, keepdims=True)
            threshold = jnp.take_along_axis(sorted_desc, n_keep - 1, axis=-1)
            x = jnp.where(x < threshold, -jnp.inf, x)
    return jax.nn.log_softmax(x, axis=-1)


def sample_tokens(key, logits_sV: jax.Array, temperature: float, top_k: int = 0,
                  top_p: float = 1.0) -> jax.Array:
    """int32 tokens ``[...]``: argmax at temperature 0, else one draw per row."""
    if temperature == 0:
        return jnp.argmax(logits_sV, axis=-1).astype(jnp.int32)
    logp = sampling_logprobs(logits_sV, temperature, top_k, top_p)
    return jax.random.categorical(key, logp, axis=-1).astype(jnp.int32)
