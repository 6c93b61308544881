"""Drafting one round: nothing (``ar``), a chain (``dflash``, ``domino``) or a tree
(``ddtree``, ``dominotree``), returned in one tree layout for verification."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dominotree_jax.model.drafter import dflash_chain
from dominotree_jax.decoding.config import DecodeConfig
from dominotree_jax.tree import build_tree, tree_attention


class Draft(NamedTuple):
    tokens_BN: jax.Array     # [B, N] int32
    parents_BN: jax.Array    # [B, N] int32, -1 = child of the root
    depths_BN: jax.Array     # [B, N] int32 (-1 for invalid nodes)
    valid_BN: jax.Array      # [B, N] bool
    ancestor_BRR: jax.Array  # [B, 1+N, 1+N] bool verify-row visibility inside the tree


def tap_layers_for(config: DecodeConfig) -> tuple[int, ...]:
    return () if config.method == "ar" else tuple(config.drafter.target_layer_ids)


def bind_drafter_for(config: DecodeConfig, drafter_params):
    if config.method == "ar":
        return None
    from dominotree_jax.model.drafter import bind_drafter
    if drafter_params is None:
        raise ValueError(f"method {config.method!r} needs drafter parameters")
    return bind_drafter(config.drafter, drafter_params)


def draft_round(config: DecodeConfig, target, drafter, ctx, t0_B, start_B) -> Draft:
    B = t0_B.shape[0]
    if config.method == "ar":
        empty_i = jnp.zeros((B, 0), jnp.int32)
        return Draft(empty_i, empty_i, empty_i, jnp.zeros((B, 0), bool),
                     jnp.ones((B, 1, 1), bool))
    z_BKH, base_BKV = drafter.draft(target, ctx, t0_B, start_B)
    if config.method == "dflash":
        tokens_BK, _ = dflash_chain(base_BKV)
        return _chain(tokens_BK)
    if config.method == "domino":
        tokens_BK, _ = drafter.domino_chain(target, z_BKH, base_BKV, t0_B)
        return _chain(tokens_BK)
    return _tree(config, target, drafter, z_BKH, base_BKV, t0_B)


def _tree(config: DecodeConfig, target, drafter, z_BKH, base_BKV, t0_B) -> Draft:
    """Best-first tree per batch row (``ddtree`` marginal, ``dominotree`` conditional)."""
    gru = drafter.prefix_gru
    proj = drafter.embed_proj
    weights = (target.embed_tokens.weight[...],
               None if gru is None else gru.weight_ih_l0[...],
               None if gru is None else gru.weight_hh_l0[...],
               None if proj is None else proj[0].weight[...],
               None if proj is None else proj[2].weight[...])

    def one(base_KV, z_KH, t0):
        return build_tree(base_KV, z_KH, t0, *weights, method=config.method,
                          budget=config.budget, node_topk=config.node_topk, top_m=config.top_m,
                          prefix_len=config.drafter.pure_draft_prefix_len,
                          use_pallas=config.use_pallas)

    tree = jax.vmap(one)(base_BKV, z_BKH, t0_B)
    valid_BN = tree.valid
    ancestor_BRR, _ = jax.vmap(tree_attention)(tree.parents, valid_BN)
    return Draft(tree.tokens, tree.parents, tree.depths, valid_BN, ancestor_BRR)


def _chain(tokens_BK) -> Draft:
    """A chain as a tree: node ``i``'s parent is ``i - 1``; row ``r`` sees rows ``<= r``."""
    B, K = tokens_BK.shape
    idx = jnp.arange(K, dtype=jnp.int32)
    bc = lambda a: jnp.broadcast_to(a, (B,) + a.shape)  # noqa: E731
    causal_RR = jnp.tril(jnp.ones((K + 1, K + 1), bool))
    return Draft(tokens_BK, bc(idx - 1), bc(idx), jnp.ones((B, K), bool), bc(causal_RR))
