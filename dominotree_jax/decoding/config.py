"""``DecodeConfig``: the static, hashable settings of one ``decode`` program."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from dominotree_jax.config import TargetConfig
from dominotree_jax.decoding import auto_size, costs as round_costs, lookup as lookup_source
from dominotree_jax.decoding.lookup import LOOKUP_LENGTH, LOOKUP_PATHS
from dominotree_jax.precision import Precision
from dominotree_jax.sampling import Sampling, validate_sampling
from dominotree_jax.tree.builder import (CORRECTED_TREE_METHODS, MARKOV_TREE_METHODS,
                                         SELECTOR_TREE_METHODS, TREE_METHODS, check_settings)

CHAIN_METHODS = ("dflash", "domino", "dspark", "dflash2")
# the methods that read a head besides the backbone: the Domino head's, DSpark's Markov head's
DOMINO_METHODS = ("domino",) + CORRECTED_TREE_METHODS
DSPARK_METHODS = ("dspark",) + MARKOV_TREE_METHODS
DFLASH2_METHODS = ("dflash2",) + SELECTOR_TREE_METHODS
# a dspark chain's node scores: this share of the confidence head's survival, the rest path
# probability (DecodeConfig.confidence_share's default with a confidence head). 0: path
# probability predicted SmolLM2's rounds better (experiments/dspark_heads/decoded.json)
CONFIDENCE_SHARE = 0.0
# "lookup": no drafter, the draft is copied from the prompt and the text so far (lookup.py)
METHODS = ("ar",) + CHAIN_METHODS + TREE_METHODS + ("lookup",)
DRAFTER_METHODS = CHAIN_METHODS + TREE_METHODS


def missing_head(method: str, drafter) -> str | None:
    """Why ``drafter`` (a ``DrafterConfig``) cannot run ``method`` for want of a head, or None."""
    if method in DOMINO_METHODS and not drafter.is_domino:
        return f"method {method!r} needs a Domino drafter (projector_type 'domino')"
    if method in DSPARK_METHODS and not drafter.is_dspark:
        return f"method {method!r} needs a DSpark drafter (a Markov head: markov_rank > 0)"
    if method in DFLASH2_METHODS and not drafter.is_dflash2:
        return f"method {method!r} needs a DFlash2 drafter (a path selector: selector_rank > 0)"
    return None


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """A decode's settings: ``program`` (everything but the sampling values) shapes the
    compiled program, ``sampling`` (temperature, top-k, top-p) are its runtime arguments;
    ``decode`` compiles once per distinct ``program``.
    """

    target: TargetConfig
    drafter: Any = None              # DrafterConfig, required by every method but "ar"
    method: str = "ar"
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    stop_ids: tuple[int, ...] = ()
    # N: draft nodes per tree (root excluded), or "auto": each round picks a size from
    # ``auto_sizes`` by expected tokens per unit of time (``decoding/auto_size.py``; with
    # method "lookup": a plain step or the lookup paths, by their expected acceptance)
    budget: int | str = 16
    node_topk: int = 8               # k: children per node
    # M: candidates per depth (0 = the full vocabulary, the default: with a drafter whose base
    # head is weak at depths >= 1 -- ours -- the corrected token often sits outside the base
    # logits' top 64; benchmarks/results/drafter_v4/README.md)
    top_m: int = 0
    use_pallas: Any = "auto"
    return_logprobs: bool = False
    # which log-probs: True = of the distribution tokens are drawn from (top-k / top-p applied,
    # -inf outside); False = of softmax(logits / temperature) over the whole vocabulary, what RL
    # trainers (tunix's ``compute_per_token_logps``) score the same tokens with
    logprobs_filtered: bool = True
    # also return the target's tapped features of the prompt and committed tokens (the
    # drafter's inputs; ``rollout.drafter_refresh`` trains on them): the layers ``drafter``
    # taps, so it needs a drafter config, also with methods "ar" and "lookup", which then
    # tap them without drafting
    return_features: bool = False
    max_len: int | None = None       # cache slots; None = prompt + max_new_tokens + verify rows
    # W: every drafter layer sees only the last W committed context rows (its context is then
    # a W-slot ring); None: the drafter's own (released sliding_window, else everything).
    # Copied into ``drafter.draft_window``, which is what the drafter reads.
    draft_window: int | None = None
    # budget="auto" only: the static sizes a round may verify (draft nodes; 0 = a plain AR
    # step; None = trees 0, 2, 4, 8, 16, chains 0, 2, 4, ..., J; read ``size_options``), the
    # round costs (``CostTable``s; None = the default cost model ``costs.default_tables()``;
    # a config never reads a file: pass ``costs.load_calibrated_costs(...)`` for this machine's
    # table, as ``Pair.config`` does) and the base probe interval in rounds
    auto_sizes: tuple[int, ...] | None = None
    auto_costs: Any = None
    auto_probe_every: int = 8
    # lookup drafting (decoding/lookup.py, which checks these): K continuations copied from
    # the prompt and the text so far join every round's draft (0 = off; method "lookup" takes
    # 4 when 0); matches of lookup_ngram = (min, max) tokens, longest first, starting inside
    # the last lookup_window positions; paths of lookup_length tokens (a chain's: at most its
    # depth; None: lookup.LOOKUP_LENGTH[method "lookup" or not], the lengths that measured
    # best); both stay as given, their defaults resolved in ``lookup_paths`` /
    # ``lookup_path_length``; lookup_accept: P(depth d accepted | earlier accepted) per
    # matched n (rows) and depth (columns), the scores that rank lookup nodes against the
    # drafter's (None: measured default, lookup.DEFAULT_ACCEPT); lookup_group = G: a row also
    # copies from what the rows of its block of G consecutive rows that continue the same
    # prompt have generated (GRPO's group; 0 = off); lookup_history = H: and H earlier texts
    # per row, ``decode(..., lookup_history=[B, H, C])`` (the engine keeps them per prompt)
    lookup: int = 0
    lookup_ngram: tuple[int, int] = (1, 4)
    lookup_length: int | None = None
    lookup_window: int = 1024
    lookup_accept: tuple[tuple[float, ...], ...] | None = None
    lookup_group: int = 0
    lookup_history: int = 0
    # the precision the parameters are held in (a ``precision.Precision`` or its text, e.g.
    # "float32+bfloat16"): ``decode`` refuses parameters held in another, naming both. None:
    # whatever they are held in (read from their dtypes; ``Pair.config`` sets the pair's)
    precision: Precision | None = None
    # a ``dspark`` chain's node scores (what budget="auto" sizes by, what lookup paths compete
    # with): this share of the confidence head's survival (the product of its sigmoids down the
    # chain), the rest the chain's own path probability. None: ``CONFIDENCE_SHARE`` when the
    # drafter has a confidence head, else 0 (``confidence_weight``)
    confidence_share: float | None = None

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown method {self.method!r}; choose one of {METHODS}")
        if self.precision is not None:
            object.__setattr__(self, "precision", Precision.of(self.precision))
        if self.draft_window is not None and (not isinstance(self.draft_window, int)
                                              or self.draft_window < 1):
            raise ValueError(f"draft_window must be a positive integer, got "
                             f"{self.draft_window!r}")
        if self.drafter is not None and self.drafter.draft_window != self.draft_window:
            object.__setattr__(self, "drafter", dataclasses.replace(
                self.drafter, draft_window=self.draft_window))
        validate_sampling(self.temperature, self.top_k, self.top_p)
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.return_features and self.drafter is None:
            raise ValueError(f"return_features needs a drafter config (its tap layers); method "
                             f"{self.method!r} was given none")
        self._check_lookup()
        if self.method in DRAFTER_METHODS:
            if self.drafter is None:
                raise ValueError(f"method {self.method!r} needs a drafter config")
            if self.drafter.block_size < 2:
                raise ValueError(f"drafter block_size must be >= 2, got "
                                 f"{self.drafter.block_size}")
        self._resolve_auto()
        if self.method in TREE_METHODS:
            check_settings(self.drafter.num_draft_positions, self.target.vocab_size,
                           method=self.method, budget=self.num_draft_nodes,
                           node_topk=self.node_topk,
                           top_m=self.tree_top_m, prefix_len=self.drafter.pure_draft_prefix_len)
        missing = missing_head(self.method, self.drafter)
        if missing:
            raise ValueError(missing)
        self._check_confidence()
        bad = [s for s in self.stop_ids if not 0 <= s < self.target.vocab_size]
        if bad:
            raise ValueError(f"stop ids outside the vocabulary: {bad}")

    def _check_lookup(self):
        ngram, accept = lookup_source.checked_settings(self)
        object.__setattr__(self, "lookup_ngram", ngram)
        object.__setattr__(self, "lookup_accept", accept)

    def _resolve_auto(self):
        if isinstance(self.budget, str) and self.budget != "auto":
            raise ValueError(f"budget must be a positive int or 'auto', got {self.budget!r}")
        if not self.is_auto:
            if not isinstance(self.budget, (int, str)) or isinstance(self.budget, bool):
                raise ValueError(f"budget must be a positive int or 'auto', got {self.budget!r}")
            return
        if not isinstance(self.auto_probe_every, int) or self.auto_probe_every < 1:
            raise ValueError(f"auto_probe_every must be a positive int, got "
                             f"{self.auto_probe_every!r}")
        if self.auto_sizes is not None:
            object.__setattr__(self, "auto_sizes", tuple(self.auto_sizes))
        auto_size.check_sizes(self.size_options, self.method,
                              self.drafter.num_draft_positions if self.uses_drafter else None)
        costs = self.auto_costs
        if costs is None:
            costs = round_costs.default_tables()
        elif isinstance(costs, round_costs.CostTable):
            costs = (costs,)
        costs = tuple(costs)
        if not costs or not all(isinstance(c, round_costs.CostTable) for c in costs):
            raise ValueError(f"auto_costs must be a CostTable or a tuple of them, got {costs!r}")
        object.__setattr__(self, "auto_costs", costs)

    @property
    def size_options(self) -> tuple[int, ...]:
        """The draft sizes a round may verify: ``auto_sizes`` (or their default) in auto mode,
        else the one fixed size. (``DecodeOutput.draft_sizes`` is the size each round did
        verify.)"""
        if not self.is_auto:
            return (self.num_draft_nodes,)
        if self.auto_sizes is not None:
            return self.auto_sizes
        return auto_size.default_sizes(
            self.method, self.drafter.num_draft_positions if self.uses_drafter else None)

    @property
    def is_auto(self) -> bool:
        """``budget="auto"`` with a drafting method or ``lookup`` (``ar`` ignores the
        budget)."""
        return self.budget == "auto" and self.method != "ar"

    @property
    def lookup_paths(self) -> int:
        """K: lookup paths per round, ``lookup`` (``LOOKUP_PATHS`` for method "lookup" when
        0). The fields stay as given, so ``replace(method=...)`` resolves afresh."""
        return LOOKUP_PATHS if self.method == "lookup" and self.lookup == 0 else self.lookup

    @property
    def lookup_path_length(self) -> int:
        """Tokens per lookup path: ``lookup_length``, or ``LOOKUP_LENGTH`` of the method."""
        return (LOOKUP_LENGTH[self.method == "lookup"] if self.lookup_length is None
                else self.lookup_length)

    @property
    def uses_drafter(self) -> bool:
        return self.method in DRAFTER_METHODS

    @property
    def is_tree(self) -> bool:
        """Whether a round's draft may branch (its kept rows are then moved into place)."""
        return self.method in TREE_METHODS or self.method == "lookup"

    @property
    def draft_depth(self) -> int:
        """``J``: the deepest draft node's depth + 1: the drafter's block, or ``lookup_length``
        when lookup paths may reach deeper (a tree method, or no drafter); a chain keeps its
        block (the lookup path replaces the chain in its rows)."""
        if self.method == "lookup":
            return self.lookup_path_length
        J = self.drafter.num_draft_positions
        if self.lookup and self.method in TREE_METHODS:
            return max(J, self.lookup_path_length)
        return J

    @property
    def sampled(self) -> bool:
        """Whether tokens are drawn (temperature > 0) rather than the argmax: the one sampling
        setting that is static."""
        return self.temperature > 0

    @property
    def sampling(self) -> Sampling | None:
        """The runtime sampling values (``sampling.Sampling``), None when greedy."""
        return Sampling.of(self.temperature, self.top_k, self.top_p) if self.sampled else None

    @functools.cached_property
    def program(self) -> "DecodeConfig":
        """This config without its sampling values (temperature 1 when sampled, else 0; no
        top-k / top-p) and with its lookup defaults written out: the static key of
        ``decode``'s compiled program, which reads the values from ``sampling`` at run time."""
        plain = dict(temperature=float(self.sampled), top_k=0, top_p=1.0,
                     lookup=self.lookup_paths, lookup_length=self.lookup_path_length)
        if all(getattr(self, k) == v for k, v in plain.items()):
            return self
        return dataclasses.replace(self, **plain)

    def _check_confidence(self):
        share = self.confidence_share
        if share is None:
            return
        if not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
            raise ValueError(f"confidence_share must lie in [0, 1], got {share!r}")
        if share > 0 and (self.method != "dspark" or not self.drafter.confidence_head):
            raise ValueError("confidence_share > 0 needs method 'dspark' and a drafter with a "
                             "confidence head")

    @property
    def tree_top_m(self) -> int:
        """``M``, the candidates per depth the tree builder reads: ``top_m``, or a DFlash2
        drafter's ``selector_top_k`` for its tree."""
        return (self.drafter.selector_top_k if self.method in SELECTOR_TREE_METHODS
                else self.top_m)

    @property
    def confidence_weight(self) -> float:
        """The share of the confidence head's survival in a ``dspark`` chain's scores."""
        if self.confidence_share is not None:
            return float(self.confidence_share)
        has_head = (self.method == "dspark" and self.drafter is not None
                    and self.drafter.confidence_head)
        return CONFIDENCE_SHARE if has_head else 0.0

    def replace(self, **kw) -> "DecodeConfig":
        return dataclasses.replace(self, **kw)

    def without_lookup(self, **kw) -> "DecodeConfig":
        """This config with every ``lookup*`` setting at its default (no lookup drafting), and
        ``kw`` replaced."""
        off = {f.name: f.default for f in dataclasses.fields(self)
               if f.name.startswith("lookup")}
        return dataclasses.replace(self, **{**off, **kw})

    @property
    def num_draft_nodes(self) -> int:
        """Rows verified per round besides the root."""
        if self.method == "ar":
            return 0
        if self.is_auto:
            return self.size_options[-1]
        if self.method in CHAIN_METHODS:
            return self.drafter.num_draft_positions
        return self.budget

    @property
    def max_depth(self) -> int:
        """Longest acceptable path (nodes) in one round."""
        if self.method == "ar":
            return 0
        return min(self.draft_depth, self.num_draft_nodes)
