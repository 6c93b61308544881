"""Tree acceptance (docs/algorithm.md §5): walk from the root following the target's own choices.

Rows: ``0`` is the root (``t0``); row ``i + 1`` is draft node ``i``. ``post_BR[b, r]`` is the
target's choice after row ``r`` (argmax or an independent sample). Fixed shapes: the walk
always takes ``max_depth`` steps and stops moving once no child matches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp

if TYPE_CHECKING:   # shape annotations only; tests check them (tests/shape_check.py)
    from jaxtyping import Array, Int


class Accepted(NamedTuple):
    # verify rows of the root + accepted path (P = max_depth + 1; padded by repeating the last)
    rows_BP: Int[Array, "B P"]
    num_nodes_B: Int[Array, " B"]  # accepted draft nodes (tau = num_nodes + 1)
    bonus_B: Int[Array, " B"]      # the target's token after the last accepted row


def accept_walk(tokens_BN, parents_BN, valid_BN, post_BR, max_depth: int) -> Accepted:
    """Greedy-or-sampled walk; ``parents`` use node indices with -1 for the root."""
    B, N = tokens_BN.shape
    parent_row_BN = parents_BN + 1

    def step(carry, _):
        cur_B, n_B = carry
        want_B = jnp.take_along_axis(post_BR, cur_B[:, None], axis=1)[:, 0]
        match_BN = valid_BN & (parent_row_BN == cur_B[:, None]) & (tokens_BN == want_B[:, None])
        found_B = jnp.any(match_BN, axis=1)
        nxt_B = jnp.where(found_B, jnp.argmax(match_BN, axis=1) + 1, cur_B)
        return (nxt_B, n_B + found_B), nxt_B

    zeros = jnp.zeros((B,), jnp.int32)
    if max_depth == 0 or N == 0:
        rows = zeros[:, None]
        return Accepted(rows, zeros, post_BR[:, 0])
    # visited: [max_depth, B], the row each step of the walk stands on (rows_BP without the root)
    (last_B, n_B), visited = jax.lax.scan(step, (zeros, zeros), None, length=max_depth)
    rows_BP = jnp.concatenate([zeros[:, None], visited.T.astype(jnp.int32)], axis=1)
    bonus_B = jnp.take_along_axis(post_BR, last_B[:, None], axis=1)[:, 0]
    return Accepted(rows_BP, n_B.astype(jnp.int32), bonus_B)
