"""Draft trees (SPEC §4): the fixed-shape JAX builder, its NumPy reference, attention masks."""

from dominotree_jax.tree.builder import Tree, build_tree
from dominotree_jax.tree.mask import chain_tree, tree_attention

__all__ = ["Tree", "build_tree", "chain_tree", "tree_attention"]
