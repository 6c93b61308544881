"""Tree attention helpers for verification (docs/algorithm.md §5) and chain trees.

``tree_attention(parents_N, valid_N)`` builds the within-tree attention of the verify input
``[t0, node_0, ..., node_{N-1}]``: row 0 is the root, row ``i+1`` is node ``i``. A row sees
itself, the root and its ancestors. It is computed by pointer doubling: after step ``t`` each
row holds its ancestors at distance ``< 2**t`` and ``jump`` points at its ``2**t``-th ancestor
(the root points at itself), so ``N.bit_length()`` steps (``2**steps > N``) cover any depth.

``chain_tree(tokens_J, logprobs_J)`` wraps a chain draft (DFlash, Domino) as a ``Tree``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dominotree_jax.tree.builder import Tree


def tree_attention(parents_N: jax.Array, valid_N: jax.Array) -> tuple[jax.Array, jax.Array]:
    """→ ``(ancestor_mask [1+N, 1+N] bool, depth_plus_one [1+N] int32)``.

    ``ancestor_mask[i, j]``: row ``i`` may attend to row ``j`` (``j`` is ``i``, the root, or an
    ancestor of ``i``). ``depth_plus_one``: 0 for the root, ``depth + 1`` for a node (its position
    offset from ``t0``). Invalid nodes see only themselves and the root (``depth_plus_one = 1``).
    Parents must have smaller indices than their children (pop order).
    """
    N = parents_N.shape[-1]
    parents = jnp.where(valid_N, parents_N, -1).astype(jnp.int32)
    jump_R = jnp.concatenate([jnp.zeros((1,), jnp.int32), parents + 1])  # row of the parent
    mask_RR = jnp.eye(N + 1, dtype=bool)
    for _ in range(max(1, N.bit_length())):  # 2**steps > N >= distance of any node to the root
        mask_RR = mask_RR | mask_RR[jump_R]
        jump_R = jump_R[jump_R]
    depth_plus_one = jnp.sum(mask_RR, axis=-1).astype(jnp.int32) - 1
    return mask_RR, depth_plus_one


def chain_tree(tokens_sJ: jax.Array, logprobs_sJ: jax.Array) -> Tree:
    """A chain: node ``i`` at depth ``i`` is the child of node ``i-1`` (node 0: of the root);
    scores are the cumulative sums of ``logprobs``. Leading dims are kept."""
    J = tokens_sJ.shape[-1]
    idx = jnp.arange(J, dtype=jnp.int32)
    shape = tokens_sJ.shape
    return Tree(
        tokens=tokens_sJ.astype(jnp.int32),
        parents=jnp.broadcast_to(idx - 1, shape),
        depths=jnp.broadcast_to(idx, shape),
        scores=jnp.cumsum(logprobs_sJ.astype(jnp.float32), axis=-1),
        num_nodes=jnp.full(shape[:-1], J, jnp.int32),
    )
