"""``DecodeConfig``: the static, hashable settings of one ``decode`` program."""

from __future__ import annotations

import dataclasses
from typing import Any

from dominotree_jax.config import TargetConfig
from dominotree_jax.sampling import validate_sampling
from dominotree_jax.tree.builder import TREE_METHODS, check_settings

CHAIN_METHODS = ("dflash", "domino")
METHODS = ("ar",) + CHAIN_METHODS + TREE_METHODS


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Everything about a decode that shapes the compiled program.

    ``jax.jit(decode, static_argnames="config")`` compiles once per distinct config.
    """

    target: TargetConfig
    drafter: Any = None              # DrafterConfig, required by every method but "ar"
    method: str = "ar"
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    stop_ids: tuple[int, ...] = ()
    budget: int = 16                 # N: draft nodes per tree (root excluded)
    node_topk: int = 8               # k: children per node
    top_m: int = 64                  # M: candidates per depth (0 = full vocabulary)
    use_pallas: Any = "auto"
    return_logprobs: bool = False
    max_len: int | None = None       # cache slots; None = prompt + max_new_tokens + verify rows

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose one of {METHODS}")
        validate_sampling(self.temperature, self.top_k, self.top_p)
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.method != "ar":
            if self.drafter is None:
                raise ValueError(f"method {self.method!r} needs a drafter config")
            if self.drafter.block_size < 2:
                raise ValueError(f"drafter block_size must be >= 2, got "
                                 f"{self.drafter.block_size}")
        if self.method in TREE_METHODS:
            check_settings(self.drafter.num_draft_positions, self.target.vocab_size,
                           method=self.method, budget=self.budget, node_topk=self.node_topk,
                           top_m=self.top_m, prefix_len=self.drafter.pure_draft_prefix_len)
        if self.method in ("domino", "dominotree") and not self.drafter.is_domino:
            raise ValueError(f"method {self.method!r} needs a Domino drafter "
                             "(projector_type 'domino')")
        bad = [s for s in self.stop_ids if not 0 <= s < self.target.vocab_size]
        if bad:
            raise ValueError(f"stop ids outside the vocabulary: {bad}")

    def replace(self, **kw) -> "DecodeConfig":
        return dataclasses.replace(self, **kw)

    @property
    def num_draft_nodes(self) -> int:
        """Rows verified per round besides the root."""
        if self.method == "ar":
            return 0
        if self.method in CHAIN_METHODS:
            return self.drafter.num_draft_positions
        return self.budget

    @property
    def max_depth(self) -> int:
        """Longest acceptable path (nodes) in one round."""
        if self.method == "ar":
            return 0
        return min(self.drafter.num_draft_positions, self.num_draft_nodes)
