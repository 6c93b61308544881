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
    return jax.nn.log_softmax(sampling_logits(logits_sV, temperature, top_k, top_p), axis=-1)


def sampling_logits(logits_sV: jax.Array, temperature: float, top_k: int = 0,
                    top_p: float = 1.0) -> jax.Array:
    """float32 ``[..., V]``: the logits tempered and filtered (``-inf`` outside top-k / top-p),
    not normalised: ``sampling_logprobs`` up to a per-row constant, what ``draw`` reads."""
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
    return x


def sample_tokens(key, logits_sV: jax.Array, temperature: float, top_k: int = 0,
                  top_p: float = 1.0) -> jax.Array:
    """int32 tokens ``[...]``: the first maximum at temperature 0, else one draw per row from
    the filtered distribution (``draw`` of ``sampling_logits``: no normalising pass)."""
    if temperature == 0:
        return first_argmax(logits_sV)
    return draw(key, sampling_logits(logits_sV, temperature, top_k, top_p))


def first_argmax(x_sV: jax.Array) -> jax.Array:
    """int32 index of the first maximum along the last axis (``jnp.argmax``'s result, NaN-free
    input): one max and one min reduction, 2-5x faster on XLA:CPU than ``jnp.argmax``'s
    (value, index) reduction (17 rows x 49k logits: 1.9 vs 0.4 ms, Zen 5)."""
    V = x_sV.shape[-1]
    top_s1 = jnp.max(x_sV, axis=-1, keepdims=True)
    first_s = jnp.min(jnp.where(x_sV == top_s1, jnp.arange(V, dtype=jnp.int32), V), axis=-1)
    return jnp.minimum(first_s, V - 1)


DRAW_BLOCK = 128   # vocabulary entries per block of ``draw``'s two-level search


def draw(key, logw_sV: jax.Array) -> jax.Array:
    """int32 ``[...]``: one exact draw per row from the weights ``exp(logw)`` (any
    normalisation; ``-inf`` = never), by inverse CDF with one uniform per row: the row's
    mass is cut into blocks of ``DRAW_BLOCK`` entries, the uniform picks a block from the
    blocks' cumulative masses and then an entry from that block's. One uniform and two short
    scans a row instead of ``jax.random.categorical``'s Gumbel noise for every vocabulary
    entry: 4 x 17 rows of SmolLM2's 49k logits in 4 ms instead of 49 ms (Zen 5), which at T > 0
    had made a batch-4, 17-row verify cost ~7 AR steps instead of ~3."""
    V, blk = logw_sV.shape[-1], DRAW_BLOCK
    nb = -(-V // blk)
    x = logw_sV.astype(jnp.float32)
    w_sV = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    w_sNb = jnp.pad(w_sV, [(0, 0)] * (x.ndim - 1) + [(0, nb * blk - V)]).reshape(
        x.shape[:-1] + (nb, blk))
    cum_sN = jnp.cumsum(jnp.sum(w_sNb, axis=-1), axis=-1)
    u_s = jax.random.uniform(key, x.shape[:-1], jnp.float32) * cum_sN[..., -1]
    block_s = jnp.minimum(jnp.sum(cum_sN <= u_s[..., None], axis=-1), nb - 1)
    before_s = jnp.take_along_axis(jnp.pad(cum_sN, [(0, 0)] * (x.ndim - 1) + [(1, 0)]),
                                   block_s[..., None], axis=-1)[..., 0]
    w_sb = jnp.take_along_axis(w_sNb, block_s[..., None, None], axis=-2)[..., 0, :]
    entry_s = jnp.sum(jnp.cumsum(w_sb, axis=-1) <= (u_s - before_s)[..., None], axis=-1)
    # rounding can carry the residual past the block's last entry of positive weight
    last_s = blk - 1 - jnp.argmax(w_sb[..., ::-1] > 0, axis=-1)
    return (block_s * blk + jnp.minimum(entry_s, last_s)).astype(jnp.int32)
