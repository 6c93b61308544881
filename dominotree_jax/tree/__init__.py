"""Draft trees (docs/algorithm.md §4): the fixed-shape JAX builder, its NumPy reference,
attention masks."""

from dominotree_jax.tree.builder import TREE_METHODS, Tree, build_tree, build_tree_from_head
from dominotree_jax.tree.mask import chain_tree, tree_attention

__all__ = ["TREE_METHODS", "Tree", "build_tree", "build_tree_from_head", "chain_tree",
           "tree_attention"]
