"""Tree verification (docs/algorithm.md §5): one target forward over ``[t0, node_0 .. node_{N-1}]``.

Row ``r`` belongs at cache slot ``start + r``; its RoPE position is ``start`` for the root and
``start + 1 + depth`` for nodes. Each row sees the committed prefix (slots ``< start``) and,
inside the tree block, the root, its ancestors and itself: the structured mask of
``TargetModel.forward_rows`` (prefix length ``start``, in-block mask ``ancestor``), so no
``[B, R, S]`` mask is built; ``verify_mask`` spells the same visibility out densely.
``verify_rows`` only reads the cache and returns the rows' K/V (inside ``budget="auto"``'s
``lax.switch``); ``verify_in_place`` / ``verify`` also write all rows at ``start ..`` first
(a fixed size). Either way ``commit.py`` then writes the accepted rows to their final slots."""

from __future__ import annotations

import jax.numpy as jnp

from dominotree_jax.model.cache import KVCache


def verify_mask(start_B, ancestor_BRR, max_len: int):
    """``[B, R, S]`` boolean mask for the verify rows."""
    R = ancestor_BRR.shape[-1]
    slot_S = jnp.arange(max_len)
    rel_BS = slot_S[None, :] - start_B[:, None]
    in_tree_BS = (rel_BS >= 0) & (rel_BS < R)
    tree_vis_BRS = jnp.take_along_axis(
        ancestor_BRR, jnp.broadcast_to(jnp.clip(rel_BS, 0, R - 1)[:, None, :],
                                       (start_B.shape[0], R, max_len)), axis=2)
    return (rel_BS < 0)[:, None, :] | (in_tree_BS[:, None, :] & tree_vis_BRS)


def _rows_and_positions(t0_B, start_B, tokens_BN, depths_BN):
    rows_BR = jnp.concatenate([t0_B[:, None], tokens_BN], axis=1)
    pos_BR = start_B[:, None] + jnp.concatenate(
        [jnp.zeros_like(t0_B)[:, None], 1 + jnp.maximum(depths_BN, 0)], axis=1)
    return rows_BR, pos_BR


def _logits(target, hidden_BRH, sampled: bool):
    """The rows' logits; ``sampled`` (T > 0: a draw follows) lays the product out
    vocabulary-major (``TargetModel.logits_vocab_major``)."""
    return target.logits_vocab_major(hidden_BRH) if sampled else target.logits(hidden_BRH)


def verify_rows(target, cache: KVCache, t0_B, start_B, tokens_BN, depths_BN, ancestor_BRR,
                tap_layers: tuple[int, ...], sampled: bool = False):
    """(logits ``[B, R, V]``, taps ``[B, R, F]``, the rows' K/V: a ``KVRows`` of per-layer
    ``[B, R, K, D]``) with ``R = 1 + N``; the cache is only read (what a ``lax.switch`` branch
    may do without XLA copying the cache). ``sampled``: T > 0 (``_logits``)."""
    rows_BR, pos_BR = _rows_and_positions(t0_B, start_B, tokens_BN, depths_BN)
    out = target.forward_rows(rows_BR, pos_BR, cache, start_B, ancestor_BRR,
                              tap_layers=tap_layers)
    return _logits(target, out.hidden, sampled), out.taps, out.rows


def verify_in_place(target, cache: KVCache, t0_B, start_B, tokens_BN, depths_BN, ancestor_BRR,
                    tap_layers: tuple[int, ...], sampled: bool = False):
    """(logits, taps, the cache with every row written at ``start ..``, the rows' K/V). Each
    layer writes its rows before its attention reads the cache: outside a ``lax.switch`` branch
    XLA then updates the cache in place (reading first made it copy every layer's cache)."""
    rows_BR, pos_BR = _rows_and_positions(t0_B, start_B, tokens_BN, depths_BN)
    out = target.forward_cached(rows_BR, pos_BR, cache, start_B, start_B, ancestor_BRR,
                                tap_layers=tap_layers)
    return _logits(target, out.hidden, sampled), out.taps, out.cache, out.rows


def verify(target, cache: KVCache, t0_B, start_B, tokens_BN, depths_BN, ancestor_BRR,
           tap_layers: tuple[int, ...]):
    """(logits ``[B, 1+N, V]``, taps ``[B, 1+N, F]``, cache with the rows written at
    ``start ..``)."""
    return verify_in_place(target, cache, t0_B, start_B, tokens_BN, depths_BN, ancestor_BRR,
                           tap_layers)[:3]
