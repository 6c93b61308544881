"""Step 1 of a round, drafting (docs/algorithm.md §2–4): nothing (``ar``), a chain (``dflash``,
``domino``, ``dspark``, ``dflash2``) or a best-first tree (``ddtree``, ``condstatic``,
``dominotree``, ``dsparktree``, ``dflash2tree``), all returned in one tree layout (``Draft``)
for verification.

``draft_round`` runs the drafter's block forward and then ``chain_draft`` or ``tree_draft`` on
its outputs; benchmarks call those two directly to time the stages apart. Lookup paths (the
round's ``lookup.propose``) join the chain or tree through ``decoding/lookup.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp

from dominotree_jax.decoding import lookup
from dominotree_jax.decoding.config import CHAIN_METHODS, DecodeConfig
from dominotree_jax.decoding.stages import STAGE_DRAFT, STAGE_TREE
from dominotree_jax.domino_head import dflash_chain, domino_chain
from dominotree_jax.markov_head import blended_logprobs, markov_chain
from dominotree_jax.model.drafter import bind_drafter
from dominotree_jax.tree import Tree, build_tree_from_head, chain_tree, tree_attention
from dominotree_jax.selector_head import selector_chain
from dominotree_jax.tree.builder import (CORRECTED_TREE_METHODS, MARKOV_TREE_METHODS,
                                         SELECTOR_TREE_METHODS)

if TYPE_CHECKING:   # shape annotations only; tests check them (tests/shape_check.py)
    from jaxtyping import Array, Bool, Float, Int

    from dominotree_jax.decoding.loop_inputs import LoopConstants, RoundInput


class Draft(NamedTuple):
    """One round's draft for every batch row, in pop order (parents before children)."""
    tokens_BN: Int[Array, "B N"]
    parents_BN: Int[Array, "B N"]      # -1 = child of the root
    depths_BN: Int[Array, "B N"]       # -1 for invalid nodes
    valid_BN: Bool[Array, "B N"]
    ancestor_BRR: Bool[Array, "B R R"]  # verify row i sees row j (R = 1 + N)
    # float32 the drafter's cumulative path log-prob of each node (-inf if invalid);
    # non-increasing in pop order, so the first n nodes are the n most likely ones
    scores_BN: Float[Array, "B N"] | None = None


def tap_layers_for(config: DecodeConfig) -> tuple[int, ...]:
    """Target layers whose outputs the drafter reads (none for ``ar`` and ``lookup``, unless
    they return the features for a drafter config they were given: ``return_features``)."""
    if config.uses_drafter or (config.return_features and config.drafter is not None):
        return tuple(config.drafter.target_layer_ids)
    return ()


def bind_drafter_for(config: DecodeConfig, drafter_params):
    """The drafter module over its parameters, or None for ``ar`` and ``lookup``."""
    if not config.uses_drafter:
        return None
    if drafter_params is None:
        raise ValueError(f"method {config.method!r} needs drafter parameters")
    return bind_drafter(config.drafter, drafter_params)


def draft_from_tree(tree: Tree) -> Draft:
    """A batch of ``Tree``s (leading dim B) with their verify-row visibility."""
    ancestor_BRR, _ = jax.vmap(tree_attention)(tree.parents, tree.valid)
    return Draft(tree.tokens, tree.parents, tree.depths, tree.valid, ancestor_BRR,
                 jnp.where(tree.valid, tree.scores, -jnp.inf).astype(jnp.float32))


def empty_draft(batch: int) -> Draft:
    """``ar``: no nodes; the root row is verified alone."""
    return first_nodes(skipped_draft(batch, 0), 0)


def skipped_draft(batch: int, num_nodes: int) -> Draft:
    """A draft of ``num_nodes`` invalid nodes (auto mode's rounds that do not draft)."""
    N = num_nodes
    return Draft(jnp.zeros((batch, N), jnp.int32), jnp.full((batch, N), -1, jnp.int32),
                 jnp.full((batch, N), -1, jnp.int32), jnp.zeros((batch, N), bool),
                 jnp.broadcast_to(jnp.eye(N + 1, dtype=bool).at[:, 0].set(True),
                                  (batch, N + 1, N + 1)),
                 jnp.full((batch, N), -jnp.inf, jnp.float32))


def first_nodes(draft: Draft, n: int) -> Draft:
    """The first ``n`` nodes of ``draft`` (static ``n``): a valid subtree, since parents come
    before their children in pop order; their verify rows keep the same visibility."""
    return Draft(draft.tokens_BN[:, :n], draft.parents_BN[:, :n], draft.depths_BN[:, :n],
                 draft.valid_BN[:, :n], draft.ancestor_BRR[:, :n + 1, :n + 1],
                 draft.scores_BN[:, :n])


def chain_draft(config: DecodeConfig, target, drafter, z_BJH, base_BJV, t0_B,
                paths=None) -> Draft:
    """Greedy chain of ``J`` nodes: DFlash (argmax of the base logits), Domino (corrected by
    the GRU head) or DSpark (corrected by the Markov head).
    ``target``: whose token embedding the Domino head reads. The chain and tree builders work
    over the drafter's draft vocabulary; the ``Draft`` holds target ids. ``paths``: the
    round's lookup paths (``lookup.propose``) when ``config.lookup_paths``."""
    if config.method == "dflash":
        tokens_BJ, logprobs_BJ = dflash_chain(base_BJV)
    elif config.method == "dflash2":
        tokens_BJ, logprobs_BJ = selector_chain(drafter.selector_weights(), z_BJH, base_BJV,
                                                t0_B, config.drafter.selector_top_k)
    elif config.method == "dspark":
        markov = drafter.markov_weights()
        tokens_BJ, logprobs_BJ = markov_chain(markov, base_BJV, t0_B)
        if config.confidence_weight:   # node scores from the confidence head's survival
            prev_BJ = jnp.concatenate([t0_B[:, None].astype(jnp.int32),
                                       markov.target_ids(tokens_BJ[:, :-1])], axis=1)
            logprobs_BJ = blended_logprobs(logprobs_BJ, drafter.confidence(z_BJH, prev_BJ),
                                           config.confidence_weight)
    else:
        tokens_BJ, logprobs_BJ = domino_chain(drafter.head_weights(target), z_BJH, base_BJV,
                                              t0_B, config.drafter.pure_draft_prefix_len)
    tokens_BJ = drafter.to_target(tokens_BJ)
    if not config.lookup_paths:
        return draft_from_tree(chain_tree(tokens_BJ, logprobs_BJ))
    return draft_from_tree(lookup.merge_into_chain(tokens_BJ, logprobs_BJ, paths))


def tree_draft(config: DecodeConfig, target, drafter, z_BJH, base_BJV, t0_B,
               paths=None) -> Draft:
    """Best-first tree of ``num_draft_nodes`` per batch row (``ddtree`` marginal,
    ``condstatic`` one correction per depth along the greedy path, ``dominotree`` conditional
    on each node's path through the Domino head, ``dsparktree`` on each node's token through
    the Markov head); ``paths``: as in ``chain_draft``."""
    head = (drafter.head_weights(target) if config.method in CORRECTED_TREE_METHODS else
            drafter.markov_weights() if config.method in MARKOV_TREE_METHODS else
            drafter.selector_weights() if config.method in SELECTOR_TREE_METHODS else None)

    def one(base_JV, z_JH, t0):
        return build_tree_from_head(base_JV, z_JH, t0, head, method=config.method,
                                    budget=config.num_draft_nodes, node_topk=config.node_topk,
                                    top_m=config.tree_top_m,
                                    prefix_len=config.drafter.pure_draft_prefix_len,
                                    use_pallas=config.use_pallas)

    tree = jax.vmap(one)(base_BJV, z_BJH, t0_B)   # tokens in the draft vocabulary
    tree = tree._replace(tokens=drafter.to_target(tree.tokens))
    return draft_from_tree(lookup.merge_into_tree(config, tree, paths) if config.lookup_paths
                           else tree)


def lookup_draft(config: DecodeConfig, paths) -> Draft:
    """``method="lookup"`` (and a round the drafter sits out): the best ``num_draft_nodes``
    lookup nodes of ``paths`` alone (``lookup.tree_of_paths``)."""
    return draft_from_tree(lookup.tree_of_paths(config, paths))


def draft_round(inp: RoundInput, consts: LoopConstants) -> Draft:
    """The drafter's block forward after the root ``inp.t0_B`` at positions ``inp.start_B …``
    (reading ``inp.ctx``), then the chain or tree built on its outputs, the round's lookup paths
    (``inp.lookup``) joined to it; method ``"lookup"``: the paths alone. The Domino head reads
    the token embedding of ``consts.head_target``; the drafter's head rows are
    ``consts.head_rows_CH`` (gathered once before the loop; None: here)."""
    config, drafter = consts.config, consts.drafter
    if config.method == "ar":
        return empty_draft(inp.t0_B.shape[0])
    if config.method == "lookup":
        with jax.named_scope(STAGE_TREE):
            return lookup_draft(config, inp.lookup)
    with jax.named_scope(STAGE_DRAFT):
        z_BJH, base_BJV = drafter.draft(consts.target, inp.ctx, inp.t0_B, inp.start_B,
                                        consts.head_rows_CH)
    build = chain_draft if config.method in CHAIN_METHODS else tree_draft
    with jax.named_scope(STAGE_TREE):
        return build(config, consts.head_target, drafter, z_BJH, base_BJV, inp.t0_B, inp.lookup)
