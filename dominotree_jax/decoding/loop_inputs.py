"""What a round of ``decode`` reads (docs/algorithm.md §6): ``LoopConstants``, built once before
the loop and the same every round, and ``RoundInput``, the committed state a round starts from.
Their own module, so that the round's steps (draft, verify, commit) can name them without
importing the round."""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, NamedTuple

import jax

from dominotree_jax.decoding.auto_size import AutoPolicy
from dominotree_jax.decoding.config import DecodeConfig
from dominotree_jax.decoding.lookup import Candidates, Group
from dominotree_jax.model.cache import KVCache
from dominotree_jax.model.drafter import DrafterContext
from dominotree_jax.sampling import Sampling

if TYPE_CHECKING:
    from jaxtyping import Array, Float, Int, Key


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=("target", "drafter", "lengths_B", "prompt_BT", "head_rows_CH",
                                "sampling", "stops_Be", "group", "history_BhW", "plain_target",
                                "plain_drafter"),
                   meta_fields=("config", "policy"))
@dataclasses.dataclass(frozen=True)
class LoopConstants:
    """What every round of one ``decode`` reads and no round changes, built once before the
    loop (``decode``) and passed down whole. Only ``config`` and ``target`` are needed to run a
    round outside ``decode`` (benchmarks, the calibration); the rest default to "none"."""
    config: DecodeConfig            # static
    target: Any                     # the target model over its parameters
    drafter: Any = None             # the drafter (None for ``ar`` and ``lookup``)
    lengths_B: Int[Array, " B"] | None = None   # each row's prompt length
    # each row's prompt, right-padded: what lookup drafting searches besides the tokens
    # generated (``lookup.propose``)
    prompt_BT: Int[Array, "B T"] | None = None
    # the drafter's LM-head rows of its draft vocabulary (``Drafter.head_rows``), gathered
    # once before the loop; None: none, or gathered in the round
    head_rows_CH: Float[Array, "C H"] | None = None
    # the sampling values (runtime arrays) of a sampled config; None: the config's own
    sampling: Sampling | None = None
    stops_Be: Int[Array, "B e"] | None = None   # each row's own stop ids (-1 = none), besides
    #                                              config.stop_ids (decode's row_stop_ids)
    # lookup_group = G: each row's siblings (``lookup.group_of``), searched by ``lookup.propose``
    group: Group | None = None
    # lookup_history = H: each row's H earlier texts (-1 past each one's end; decode's
    # ``lookup_history`` padded to the rows' text width W = T + O), searched by ``lookup.propose``
    history_BhW: Int[Array, "B h W"] | None = None
    policy: AutoPolicy | None = None   # budget="auto": the draft-size policy (static)
    # budget="auto": the target a plain step (size 0) runs and whose token embedding the
    # Domino head reads, e.g. the float32 view of 16-bit weights made before the loop
    # (``target.bind_float32_view``); None: ``target``
    plain_target: Any = None
    # ... the drafter whose context rows a plain step computes
    # (``drafter.bind_drafter_float32_view``); None: ``drafter``
    plain_drafter: Any = None

    @property
    def head_target(self):
        """The target whose token embedding the Domino head reads."""
        return self.target if self.plain_target is None else self.plain_target

    def for_plain_step(self) -> "LoopConstants":
        """These constants with a plain step's models as ``target`` and ``drafter``."""
        return dataclasses.replace(self, target=self.head_target,
                                   drafter=(self.drafter if self.plain_drafter is None
                                            else self.plain_drafter))

    def replace(self, **kw) -> "LoopConstants":
        return dataclasses.replace(self, **kw)


class RoundInput(NamedTuple):
    """What a round reads that changes from round to round: the committed state of every row,
    this round's key and lookup paths."""
    cache: KVCache                 # target K/V, per layer [B, K, S, D]; committed below start
    ctx: DrafterContext | None     # drafter context of the committed rows (None for ``ar``)
    t0_B: Int[Array, " B"]          # the root: the last committed token
    start_B: Int[Array, " B"]       # the root's absolute position
    key: Key[Array, ""]            # PRNG key of this round's sampling
    # lookup drafting: this round's lookup paths (``lookup.propose``), else None
    lookup: Candidates | None = None
