"""Tree verification (docs/algorithm.md §5): one target forward over ``[t0, node_0 .. node_{N-1}]``.

Row ``r`` is written to cache slot ``start + r``; its RoPE position is ``start`` for the root
and ``start + 1 + depth`` for nodes. Each row sees the committed prefix (slots ``< start``) and,
inside the tree block, the root, its ancestors and itself: that is the structured mask of
``TargetModel.forward_cached`` (prefix length ``start``, in-block mask ``ancestor``), so no
``[B, R, S]`` mask is built; ``verify_mask`` spells the same visibility out densely.
"""

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


def verify(target, cache: KVCache, t0_B, start_B, tokens_BN, depths_BN, ancestor_BRR,
           tap_layers: tuple[int, ...]):
    """(logits ``[B, 1+N, V]``, taps ``[B, 1+N, F]``, cache with the rows written)."""
    rows_BR = jnp.concatenate([t0_B[:, None], tokens_BN], axis=1)
    pos_BR = start_B[:, None] + jnp.concatenate(
        [jnp.zeros_like(t0_B)[:, None], 1 + jnp.maximum(depths_BN, 0)], axis=1)
    out = target.forward_cached(rows_BR, pos_BR, cache, start_B, start_B, ancestor_BRR,
                                tap_layers=tap_layers)
    return target.logits(out.hidden), out.taps, out.cache
