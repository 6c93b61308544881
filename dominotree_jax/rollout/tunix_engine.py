"""``DominoTreeRollout``: a tunix rollout engine (``BaseRollout``) that samples with ``decode``.

Prompts are tokenized as tunix's sampler does, right-padded to ``max_prompt_length`` columns
(or the next power of two above the longest prompt, as tunix does) and decoded in one batch
with speculative decoding (DominoTree by default): the samples are exactly the target's at any
temperature, and the per-token log-probs come from the verification logits (no extra forward).

Log-probs (docs/rl.md): ``generate``'s and ``get_per_token_logps``' are what tunix's trainer
computes for the same tokens (``common.compute_per_token_logps`` at the rollout temperature):
``log softmax(logits / T)`` over the whole vocabulary, not the top-k / top-p filtered
distribution the tokens are drawn from. ``get_per_token_logps`` uses the temperature of the
``rollout_config`` the engine was built with (RLCluster passes its TRAIN config; else the last
``generate``'s, else 1). Pad ids inside prompts: ``prompt_pads`` (``__init__``). The pad id is
a stop id: a completion ends at its first pad or EOS (the trainer masks pad ids, so a
completion never holds one).

Drafter refresh (opt-in, ``drafter_refresh=``): after every ``generate`` call (so every
micro-batch RLCluster rolls out) one ``DrafterRefresher`` step on that rollout's features, the
new drafter used from the next call on; ``refresh_log`` holds each step's metrics, wall time
and memory, ``tunix_metrics`` hands them (and τ) to tunix's metrics logger.

Parameters are arguments of one jitted program per ``(DecodeConfig, batch, width)``, so
``update_params`` changes the next rollout without compiling anything (``num_compilations``).

Use it from tunix's ``RLCluster`` with ``ClusterConfig(rollout_engine=functools.partial(
DominoTreeRollout, drafter_config=..., drafter_params=...), ...)`` and a ``TunixCausalLM``
actor (``tests/test_tunix_learner.py`` runs tunix's ``GRPOLearner`` this way), or directly:
``DominoTreeRollout(rollout_actor=dj.Target or TargetModel, tokenizer=...)``.

Parameters and meshes: the engine decodes with the arrays it is given, except those placed on a
mesh with ``AxisType.Explicit`` axes (``jax.make_mesh``'s default, which RLCluster reshards the
actor onto): ``decode`` is written for ``Auto`` meshes (XLA's partitioner places the
intermediates), so such arrays are copied once to the same devices and ``PartitionSpec`` on the
same mesh with ``Auto`` axes, at construction and at every ``update_params``. With an ``Auto``
mesh (``tunix.utils.mesh.create_mesh``, ``dominotree_jax.sharding.make_mesh``) a colocated
engine shares the actor's parameter variables (no copy; tunix then never calls
``update_params``, and each rollout reads the trainer's current values); with an ``Explicit``
one it holds that copy, which tunix sees as separate weights and refreshes through
``update_params`` after every global step.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding

from dominotree_jax.decoding.auto_size import initial_state, probe_next
from dominotree_jax.decoding.config import DecodeConfig
from dominotree_jax.decoding.decode import DecodeOutput, decode
from dominotree_jax.model.target import TargetModel
from dominotree_jax.precision import Precision
from dominotree_jax.rollout.drafter_refresh import DrafterRefresher
from dominotree_jax.rollout.masked_forward import PROMPT_PADS, completion_logprobs, real_tokens
from dominotree_jax.rollout.placement import BatchPlacement
from dominotree_jax.rollout.tunix_model import TunixCausalLM
from dominotree_jax.rollout.tunix_types import BaseRollout, RolloutConfig, RolloutOutput

# the refresh's teacher-forced chain τ must rise by this factor since the last probe of
# budget="auto" before a refreshed drafter is probed again (update_drafter_params)
REPROBE_GAIN = 1.1


class _Tokenizer:
    """encode/decode and special ids of a Hugging Face tokenizer or of a tokenizer with tunix's
    ``encode / decode / bos_id / eos_id / pad_id`` methods (tunix's ``TokenizerAdapter``)."""

    def __init__(self, tok):
        self.tok = tok
        self.hf = hasattr(tok, "eos_token_id") and not callable(getattr(tok, "eos_id", None))

    def bos_id(self):
        return self.tok.bos_token_id if self.hf else self.tok.bos_id()

    def eos_id(self) -> int:
        return self.tok.eos_token_id if self.hf else self.tok.eos_id()

    def pad_id(self) -> int:
        if self.hf:
            return self.tok.pad_token_id if self.tok.pad_token_id is not None else self.eos_id()
        return self.tok.pad_id()

    def encode_prompt(self, text: str) -> list[int]:
        """As tunix's ``Sampler.tokenize``: encode, prepend BOS if there is one, dedupe BOS."""
        ids = list(self.tok.encode(text))
        bos = self.bos_id()
        if bos:
            ids = [bos] + ids
            while len(ids) > 1 and ids[0] == ids[1] == bos:
                ids = ids[1:]
        return ids

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids])


@dataclasses.dataclass
class LastRollout:
    """The arrays of the latest ``generate`` (device arrays; rows past ``num_prompts`` absent)."""
    prompt_BT: jax.Array       # right-padded prompt ids
    lengths_B: jax.Array       # prompt lengths
    out: DecodeOutput          # tokens, accept lengths, rounds, log-probs (and features)
    seconds: float             # wall time of the decode call (dispatch to ready)

    @property
    def tau(self) -> float:
        """Mean tokens committed per target forward over the batch."""
        return float(self.out.mean_tau())

    @property
    def num_tokens(self) -> int:
        return int(jnp.sum(self.out.num_tokens))

    @property
    def mean_draft_size(self) -> float:
        """Mean draft nodes verified per round (0 for ``ar``)."""
        if self.out.draft_sizes is None:
            return 0.0
        sizes = self.out.draft_sizes           # (jnp: also a multi-process global array)
        rounds = jnp.sum(sizes >= 0)
        return float(jnp.sum(jnp.where(sizes >= 0, sizes, 0)) / jnp.maximum(rounds, 1))


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _auto_axes_sharding(x):
    """The ``Auto``-axes twin of ``x``'s sharding when it is on a mesh with ``Explicit`` axes."""
    s = getattr(x, "sharding", None)
    if not (isinstance(s, NamedSharding) and isinstance(s.mesh, Mesh)
            and any(t == AxisType.Explicit for t in s.mesh.axis_types)):
        return None
    mesh = s.mesh.update(axis_types=(AxisType.Auto,) * len(s.mesh.axis_names))
    return NamedSharding(mesh, s.spec, memory_kind=s.memory_kind)


def without_explicit_axes(tree):
    """``tree`` unchanged (the same object) unless some array is placed on a mesh with
    ``Explicit`` axes; then a copy of the tree with those arrays on the same devices and
    ``PartitionSpec`` over the mesh with ``Auto`` axes (``decode`` and our forwards are written
    for ``Auto`` meshes)."""
    if tree is None or not any(_auto_axes_sharding(x) is not None
                               for x in jax.tree.leaves(tree)):
        return tree

    def place(x):
        s = _auto_axes_sharding(x)
        return x if s is None else jax.device_put(x, s)

    return jax.tree.map(place, tree)


def _prompt_pads_for(actor, prompt_pads, tokenizer) -> str:
    """The ``prompt_pads`` reading (``DominoTreeRollout.__init__``), checked against the actor's
    own: a ``TunixCausalLM`` with a ``pad_id`` reads inner pads as tokens (``"keep"``)."""
    model_pad = actor.pad_id if isinstance(actor, TunixCausalLM) else None
    if prompt_pads is None:   # tunix's trainer reading only for a tunix model without pad_id
        prompt_pads = "drop" if isinstance(actor, TunixCausalLM) and model_pad is None \
            else "keep"
    if prompt_pads not in PROMPT_PADS:
        raise ValueError(f"prompt_pads must be one of {PROMPT_PADS}, got {prompt_pads!r}")
    if isinstance(actor, TunixCausalLM) and (model_pad is None) != (prompt_pads == "drop"):
        raise ValueError(f"prompt_pads={prompt_pads!r} disagrees with the actor TunixCausalLM "
                         f"(pad_id={model_pad}): the trainer would score another context; "
                         "build it with pad_id=<the pad id> for 'keep', without for 'drop'")
    if model_pad is not None and tokenizer is not None and \
            int(_Tokenizer(tokenizer).pad_id()) != model_pad:
        raise ValueError(f"the actor TunixCausalLM's pad_id {model_pad} is not the tokenizer's "
                         f"pad id {_Tokenizer(tokenizer).pad_id()}")
    return prompt_pads


def _target_of(actor) -> tuple[Any, Any]:
    """``(TargetConfig, params)`` of a ``TunixCausalLM``, ``TargetModel`` or ``dj.Target``."""
    if isinstance(actor, TunixCausalLM):
        actor = actor.target
    if isinstance(actor, TargetModel):
        return actor.cfg, nnx.state(actor)
    if hasattr(actor, "config") and hasattr(actor, "params"):
        return actor.config, actor.params
    raise TypeError(f"rollout_actor must be a TunixCausalLM, TargetModel or dominotree_jax Target,"
                    f" got {type(actor).__name__}")


class DominoTreeRollout(BaseRollout):
    def __init__(self, rollout_actor=None, tokenizer=None, mesh=None, rollout_config=None, *,
                 drafter_config=None, drafter_params=None, method: str = "dominotree",
                 budget: int = 16, node_topk: int = 8, top_m: int = 0, seed: int = 0,
                 return_features: bool = False, prompt_pads: str | None = None,
                 drafter_refresh: bool | dict | None = None, share_prefill: bool = True,
                 compiler_options: dict | None = None, **decode_options):
        """``rollout_actor``: the target (see ``_target_of``). ``tokenizer``: HF or tunix style
        (only needed for text prompts). ``mesh``/``rollout_config``: accepted for tunix's
        ``RLCluster``; the parameters are used where they are (``dominotree_jax.sharding``
        places them), except that arrays on ``Explicit`` mesh axes are moved to ``Auto``
        ones (module docstring).
        ``method``/``budget``/``node_topk``/``top_m``: ``DecodeConfig`` settings (``"ar"``
        needs no drafter). ``return_features``: keep the committed tokens' tapped target
        features of each rollout (``last.out.features``) for ``drafter_refresh``.
        ``prompt_pads``: how a pad id inside a prompt is read, the same way by the rollout and
        by the trainer scoring it. ``"keep"``: a real token (the engine conditions on it; the
        policy/reference must be ``TunixCausalLM(..., pad_id=pad)`` so that tunix's trainer
        scores it so too); ``"drop"``: padding, tunix's trainer's own reading (the engine
        removes pad ids from prompts before decoding). Default: ``"drop"`` when
        ``rollout_actor`` is a ``TunixCausalLM`` without a ``pad_id``, else ``"keep"``.
        ``drafter_refresh``: True or ``DrafterRefresher`` keyword arguments (``lr``,
        ``anchors``, ``rows``, ``vocab_ids``, ...): a drafter step after every ``generate``.
        ``share_prefill``: prefill each distinct prompt of a ``generate`` call once and copy
        its caches to the rows repeating it (GRPO hands over G copies of each prompt); the
        samples are the same as without (``decode``'s ``prompt_rows``); one compilation per
        number of distinct prompts. Off on a multi-process mesh.
        ``compiler_options``: passed to ``jax.jit`` (e.g. a lower XLA optimisation level).
        Other keywords: ``DecodeConfig`` fields (``auto_sizes``, ``auto_costs``,
        ``draft_window``, ...). ``precision`` (one of them): the ``Precision`` the target and
        drafter parameters are held in, default: read from them (``self.precision``); every
        rollout's config carries it, so parameters handed over in another precision are
        refused by name (``update_params`` casts to it)."""
        if rollout_actor is None:
            raise ValueError("DominoTreeRollout needs rollout_actor (the target model)")
        self.tcfg, params = _target_of(rollout_actor)
        self.prompt_pads = _prompt_pads_for(rollout_actor, prompt_pads, tokenizer)
        self._model_pad = rollout_actor.pad_id if isinstance(rollout_actor, TunixCausalLM) \
            else None
        self.dcfg = drafter_config
        self._params = {"target": without_explicit_axes(params),
                        "drafter": without_explicit_axes(drafter_params)}
        self._tok = None if tokenizer is None else _Tokenizer(tokenizer)
        precision = decode_options.pop("precision", None)
        self.precision = (Precision.of_params(params, drafter_params) if precision is None
                          else Precision.of(precision))
        self.precision.check_params(params, drafter_params, what="rollout's precision")
        self._settings = dict(drafter=drafter_config, method=method, budget=budget,
                              node_topk=node_topk, top_m=top_m, precision=self.precision,
                              **decode_options)
        self.return_features = bool(return_features or drafter_refresh)
        self.share_prefill = bool(share_prefill)
        return_features = self.return_features
        # get_per_token_logps' temperature: RLCluster's TRAIN rollout config, as its trainer's
        self._logp_temperature = (None if rollout_config is None
                                  else float(rollout_config.temperature))
        DecodeConfig(target=self.tcfg, return_features=return_features,
                     **self._settings)  # bad settings fail here, not at the first rollout
        if method != "ar" and drafter_params is None:
            raise ValueError(f"method {method!r} needs drafter_params")
        self._key = jax.random.key(seed)
        self.refresher = None
        self.refresh_log: list[dict] = []
        if drafter_refresh:
            opts = {} if drafter_refresh is True else dict(drafter_refresh)
            opts.setdefault("compiler_options", compiler_options)
            self.refresher = DrafterRefresher(drafter_config, self.tcfg, drafter_params, **opts)
        self.traces: list[DecodeConfig] = []
        self.logp_traces: list[tuple] = []
        self.last: LastRollout | None = None
        self._last_temperature = 1.0
        # budget="auto": the draft-size policy's state, carried from rollout to rollout per
        # (config, batch size), so each rollout starts from what the previous ones measured
        self._auto_states: dict[tuple, Any] = {}
        self._probed_tau: float | None = None   # the refresh's chain τ at the last probe

        def run(params, prompt_BT, lengths_B, prompt_rows, key, auto_state, row_stops_Be, *,
                config):
            self.traces.append(config)   # Python side effect: once per compilation
            if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):   # key data (uint32)
                key = jax.random.wrap_key_data(key)
            return decode(params, prompt_BT, config=config, key=key, prompt_lengths=lengths_B,
                          auto_state=auto_state, row_stop_ids=row_stops_Be,
                          prompt_rows=prompt_rows)

        def logps(target_params, prompt_BT, completion_BY, pad_id, temperature):
            self.logp_traces.append(prompt_BT.shape + completion_BY.shape)
            T = prompt_BT.shape[1]
            real_BW = real_tokens(jnp.concatenate([prompt_BT, completion_BY], axis=1), pad_id,
                                  self.prompt_pads)
            return jax.lax.stop_gradient(completion_logprobs(
                target_params, self.tcfg, prompt_BT, completion_BY, real_BW[:, :T],
                real_BW[:, T:], temperature))

        self._decode = jax.jit(run, static_argnames="config", compiler_options=compiler_options)
        self._logps = jax.jit(logps, static_argnames=("pad_id", "temperature"),
                              compiler_options=compiler_options)

    # ------------------------------------------------------------------ BaseRollout
    def generate(self, prompts: Sequence[str | Sequence[int]], rollout_config: RolloutConfig,
                 stop_tokens: Sequence[Sequence[int]] | None = None, **kwargs) -> RolloutOutput:
        """Sample completions of ``prompts`` (strings, or token-id lists used as they are).
        ``stop_tokens``: optional per-prompt stop ids (one list per prompt, may be empty), on
        top of the ``rollout_config``'s (EOS, pad); a completion ends at (and drops) the first
        one of either. (The lists are a runtime ``[B, e]`` array: ``e`` is rounded up to a
        power of two, one compilation per ``e``.)"""
        if len(prompts) == 0:
            raise ValueError("generate needs at least one prompt")
        rc = rollout_config
        ids = [self._encode(p) for p in prompts]
        place = BatchPlacement.of(self._params["target"])
        if place.multi_process and self.refresher is not None:
            raise ValueError("drafter_refresh is not supported on a multi-process mesh (the "
                             "refresh step would train on every process's rows; untested)")
        width = max(int(rc.max_prompt_length), 1)
        B, longest = place.agree(len(ids), max(len(p) for p in ids))  # the same in every process
        if B != len(ids):
            raise ValueError(f"every process must generate the same number of prompts; this "
                             f"one has {len(ids)}, another {B}")
        if longest > width:  # tunix's sampler widens (never truncates) the prompt window
            width = _next_pow2(longest)
        pad = self.pad_id() if self._tok is not None else 0
        # what the target conditions on: under "drop" the trainer skips every pad id
        cond = ids
        if self.prompt_pads == "drop" and self._tok is not None:
            cond = [[t for t in p if t != pad] or p[-1:] for p in ids]
        prompt_BT = np.full((B, width), pad, np.int32)
        left_BT = np.full((B, width), pad, np.int32)
        for b, (p, c) in enumerate(zip(ids, cond)):
            prompt_BT[b, :len(c)] = c
            left_BT[b, width - len(p):] = p
        lengths_B = np.array([len(c) for c in cond], np.int32)
        stop = self._stop_ids(rc)
        row_stops_Be = self._row_stops(stop_tokens, len(ids), place)
        config = self.decode_config(rc)
        key = self._key_for(rc.seed)
        t0 = time.perf_counter()
        rows = place.global_rows(B)
        state_key = (config, rows)
        state = None
        if config.is_auto:   # host values: the first and the carried state trace alike (a
            # carried device state would hold the mesh's sharding, the first one none)
            state = jax.tree.map(np.asarray, self._auto_states.get(state_key)
                                 or initial_state(config, rows))
        if place.multi_process:   # host values every process holds alike: replicated
            key = np.asarray(jax.random.key_data(key))
        prompt_in, lengths_in = place.put(prompt_BT), place.put(lengths_B)
        shared = self._shared_prefill(prompt_BT, lengths_B, place)
        if shared is None:
            args = (prompt_in, lengths_in, None)
        else:   # each distinct prompt prefilled once, then copied to its rows
            args = tuple(place.put(x) for x in shared)
        out = self._decode(self._params, *args, key, state,
                           None if row_stops_Be is None else place.put(row_stops_Be),
                           config=config)
        jax.block_until_ready(out.tokens)
        if config.is_auto:
            self._auto_states[state_key] = out.auto_state
        self.last = LastRollout(jnp.asarray(prompt_in), jnp.asarray(lengths_in), out,
                                time.perf_counter() - t0)
        if rc.temperature is not None:
            self._last_temperature = float(rc.temperature)
        if self.refresher is not None:
            self._refresh()
        tokens_BY = place.local(out.tokens)   # this process's rows
        n_B = place.local(out.num_tokens)
        logp_BY = place.local(out.logprobs) if rc.return_logprobs else None
        tokens, logprobs, text = [], [], []
        for b in range(B):
            row = tokens_BY[b, :n_B[b]]
            hit = np.flatnonzero(np.isin(row, stop) | (
                False if row_stops_Be is None else np.isin(row, row_stops_Be[b])))
            end = int(hit[0]) if hit.size else len(row)   # tunix drops the EOS token
            tokens.append(row[:end].copy())
            if logp_BY is not None:
                logprobs.append(logp_BY[b, :end].copy())
            text.append(self._tok.decode(row[:end]) if self._tok is not None else "")
        return RolloutOutput(text=text, logits=[], tokens=tokens,
                             left_padded_prompt_tokens=left_BT,
                             logprobs=logprobs if rc.return_logprobs else None)

    def get_per_token_logps(self, prompt_tokens, completion_tokens,
                            temperature: float | None = None) -> jax.Array:
        """``[B, Y]`` log-probs of the completions (tunix's layout: prompts left-padded,
        completions right-padded with ``pad_id``), one teacher-forced forward, as tunix's
        trainer computes them: at ``temperature`` (default: the engine's rollout temperature,
        module docstring; 0 is read as 1, as tunix does), the pad ids read per
        ``prompt_pads``; 0 at completion padding."""
        if temperature is None:
            temperature = self._logp_temperature
        if temperature is None:
            temperature = self._last_temperature
        place = BatchPlacement.of(self._params["target"])
        if place.multi_process:   # this process's rows in, its rows out
            prompt, completion = (place.put(np.asarray(x, np.int32))
                                  for x in (prompt_tokens, completion_tokens))
            return jnp.asarray(place.local(self._logps(
                self._params["target"], prompt, completion, pad_id=int(self.pad_id()),
                temperature=float(temperature))))
        prompt, completion = without_explicit_axes(
            (jnp.asarray(prompt_tokens, jnp.int32), jnp.asarray(completion_tokens, jnp.int32)))
        return self._logps(self._params["target"], prompt, completion,
                           pad_id=int(self.pad_id()), temperature=float(temperature))

    def update_params(self, params, filter_types=None) -> None:
        """New target parameter values (a ``TargetModel``/``TunixCausalLM`` module or state,
        or a nested dict; a subset is merged in, as tunix's vanilla rollout does). Shapes must
        match; values are cast to the rollout dtype (and moved off ``Explicit`` mesh axes).
        No recompilation."""
        self._params = dict(self._params, target=without_explicit_axes(
            self._merged(self._params["target"], params, filter_types)))

    def update_drafter_params(self, drafter_params, probe: bool = True) -> None:
        """New drafter parameter values (same structure), placed as the current ones (a
        refresh step's output carries the training mesh's sharding): no recompilation.
        ``probe``: ``budget="auto"`` probes the new drafter in its next round
        (``auto_size.probe_next``) instead of waiting out a gap learned with the old one."""
        old = self._params["drafter"]
        if jax.tree.structure(old) != jax.tree.structure(drafter_params):
            raise ValueError("drafter_params must have the structure of the current drafter")

        def placed(new, cur):
            new = jnp.asarray(new, cur.dtype).reshape(cur.shape)
            return jax.device_put(new, cur.sharding) if isinstance(cur, jax.Array) else new
        self._params = dict(self._params, drafter=without_explicit_axes(
            jax.tree.map(placed, drafter_params, old)))
        if probe:
            self._auto_states = {k: probe_next(v) for k, v in self._auto_states.items()}

    def checkpoint_state(self) -> dict:
        """Host (numpy) copies of what the engine carries from rollout to rollout that is not
        the target's parameters (tunix checkpoints those): the PRNG key, the carried
        ``budget="auto"`` states (keyed by ``(DecodeConfig, rows)``), the last rollout
        temperature and, with the drafter refresh on, the refreshed drafter and the
        refresher's optimizer state. ``restore_checkpoint_state`` puts it back: the next
        rollouts are then those the saved engine would have made."""
        host = functools.partial(jax.tree.map, np.asarray)
        state = {"key": np.asarray(jax.random.key_data(self._key)),
                 "auto_states": {k: host(v) for k, v in self._auto_states.items()},
                 "last_temperature": self._last_temperature, "refresher": None,
                 "probed_tau": -1.0 if self._probed_tau is None else self._probed_tau}
        if self.refresher is not None:
            r = self.refresher
            state["refresher"] = {"flat": host(r.flat), "opt_state": host(r.opt_state),
                                  "num_steps": r.num_steps}
        return state

    def restore_checkpoint_state(self, state: dict) -> None:
        """The inverse of ``checkpoint_state`` on an engine built with the same settings."""
        if (state["refresher"] is None) != (self.refresher is None):
            raise ValueError("the checkpointed engine state and this engine disagree on the "
                             "drafter refresh (one has it on, the other off)")
        self._key = jax.random.wrap_key_data(jnp.asarray(state["key"], jnp.uint32))
        self._auto_states = dict(state["auto_states"])
        self._last_temperature = float(state["last_temperature"])
        probed = float(state.get("probed_tau", -1.0))
        self._probed_tau = None if probed < 0 else probed
        if self.refresher is not None:
            r, saved = self.refresher, state["refresher"]
            if jax.tree.structure(saved["flat"]) != jax.tree.structure(r.flat):
                raise ValueError("the checkpointed refreshed drafter has another structure")
            r.flat = jax.tree.map(jnp.asarray, saved["flat"])
            r.opt_state = jax.tree.map(jnp.asarray, saved["opt_state"])
            r.num_steps = int(saved["num_steps"])
            self.update_drafter_params(r.state)

    def pad_id(self) -> int:
        if self._tok is None:
            raise ValueError("pad_id needs a tokenizer")
        return int(self._tok.pad_id())

    def eos_id(self) -> int:
        if self._tok is None:
            raise ValueError("eos_id needs a tokenizer")
        return int(self._tok.eos_id())

    def model(self) -> TunixCausalLM:
        pad = None
        if self.prompt_pads == "keep":
            pad = self._model_pad if self._model_pad is not None else self.pad_id()
        return TunixCausalLM.from_params(self.tcfg, self._params["target"], pad)

    # ------------------------------------------------------------------ helpers
    @property
    def params(self) -> dict:
        """``{"target": ..., "drafter": ...}`` as ``decode`` takes them."""
        return self._params

    @property
    def num_compilations(self) -> int:
        return len(self.traces)

    def _refresh(self) -> None:
        """One drafter step on the latest rollout's features; the engine decodes with the new
        drafter from the next ``generate`` on."""
        self._key, sub = jax.random.split(self._key)
        m = self.refresher.step(self._params["target"], self.last, sub)
        # probe the refreshed drafter only when its teacher-forced chain τ on the latest
        # rollout has risen by REPROBE_GAIN since the last probe (a step every rollout would
        # otherwise cost a drafted round each time, whatever it found)
        tau = float(m["chain_tau_before"])
        probe = self._probed_tau is None or tau >= REPROBE_GAIN * self._probed_tau
        if probe:
            self._probed_tau = tau
        self.update_drafter_params(self.refresher.state, probe=probe)
        self.refresh_log.append({**m, "step": self.refresher.num_steps,
                                 "batch": int(self.last.out.tokens.shape[0])})

    def tunix_metrics(self, **unused) -> dict:
        """The latest rollout's acceptance (``rollout/tau``: tokens per target forward,
        ``rollout/draft_size``: mean draft nodes per round, ``rollout/seconds``) and, with the
        refresh on, its latest step (``refresh/*``), as ``(value, aggregation)`` pairs: pass
        ``metric_fns=[engine.tunix_metrics]`` to a tunix learner (called once per rollout
        micro-batch) and they reach tunix's metrics logger each global step."""
        if self.last is None:
            return {}
        out = {"rollout/tau": (self.last.tau, np.mean),
               "rollout/draft_size": (self.last.mean_draft_size, np.mean),
               "rollout/seconds": (self.last.seconds, np.sum)}
        if self.refresh_log:
            r = self.refresh_log[-1]
            out.update({"refresh/loss": (r["loss"], np.mean),
                        "refresh/chain_tau_before": (r["chain_tau_before"], np.mean),
                        "refresh/seconds": (r["seconds"], np.sum),
                        "refresh/temp_bytes": (r.get("temp_bytes", 0), np.max),
                        "refresh/logits_bytes": (r["logits_bytes"], np.max)})
        return out

    def decode_config(self, rc: RolloutConfig) -> DecodeConfig:
        """The ``DecodeConfig`` a ``RolloutConfig`` maps to (one compiled program each)."""
        top_k = 0 if rc.top_k is None or rc.top_k < 0 else int(rc.top_k)
        top_p = 1.0 if rc.top_p is None else float(rc.top_p)
        return DecodeConfig(target=self.tcfg, max_new_tokens=int(rc.max_tokens_to_generate),
                            temperature=float(rc.temperature), top_k=top_k, top_p=top_p,
                            stop_ids=self._stop_ids(rc),
                            return_logprobs=bool(rc.return_logprobs),
                            logprobs_filtered=False,
                            return_features=self.return_features, **self._settings)

    def _shared_prefill(self, prompt_BT, lengths_B, place: BatchPlacement):
        """``(distinct prompts [U, T], their lengths [U], each row's prompt [B])`` when some
        rows repeat a prompt (GRPO's G samples) and ``share_prefill`` is on, else None (also
        on a multi-process mesh, where each process would hold another ``U``)."""
        if not self.share_prefill or place.multi_process:
            return None
        first: dict[bytes, int] = {}
        rows_B = np.array([first.setdefault(prompt_BT[b, :n].tobytes(), len(first))
                           for b, n in enumerate(lengths_B)], np.int32)
        if len(first) == len(rows_B):
            return None
        distinct = np.unique(rows_B, return_index=True)[1]   # first row of each prompt
        return prompt_BT[distinct], lengths_B[distinct], rows_B

    def _row_stops(self, stop_tokens, B: int, place: BatchPlacement) -> np.ndarray | None:
        """``stop_tokens`` (one list per prompt) as a ``[B, e]`` int32 array, -1-padded, ``e``
        a power of two (the same in every process)."""
        if stop_tokens is None:
            return None
        if len(stop_tokens) != B:
            raise ValueError(f"stop_tokens needs one list per prompt: {len(stop_tokens)} lists "
                             f"for {B} prompts")
        rows = [[int(t) for t in np.asarray(r).reshape(-1)] for r in stop_tokens]
        bad = sorted({t for r in rows for t in r if not 0 <= t < self.tcfg.vocab_size})
        if bad:
            raise ValueError(f"stop_tokens outside the vocabulary [0, {self.tcfg.vocab_size}): "
                             f"{bad[:10]}")
        (longest,) = place.agree(max(len(r) for r in rows))
        out_Be = np.full((B, _next_pow2(max(longest, 1))), -1, np.int32)
        for b, r in enumerate(rows):
            out_Be[b, :len(r)] = r
        return out_Be

    def _stop_ids(self, rc: RolloutConfig) -> tuple[int, ...]:
        stop = [int(t) for t in rc.eos_tokens] if rc.eos_tokens else (
            [self.eos_id()] if self._tok is not None else [])
        if self._tok is not None and self.pad_id() not in stop:
            stop.append(self.pad_id())   # the trainer masks pad ids: a completion ends there
        return tuple(stop)

    def _encode(self, prompt) -> list[int]:
        if not isinstance(prompt, str) and np.asarray(prompt).dtype.kind in "USO":
            if np.asarray(prompt).size != 1:   # (tunix's learners may hand over [1] arrays)
                raise ValueError(f"a prompt must be one string or a list of token ids, got "
                                 f"{prompt!r}")
            prompt = str(np.asarray(prompt).reshape(-1)[0])
        if isinstance(prompt, str):
            if self._tok is None:
                raise ValueError("text prompts need a tokenizer; pass token-id lists instead")
            ids = self._tok.encode_prompt(prompt)
        else:
            ids = [int(t) for t in np.asarray(prompt).reshape(-1)]
        if not ids:
            raise ValueError("empty prompt")
        return ids

    def _key_for(self, seed):
        if seed is None:  # a fresh key per call (tunix's sampler would reuse PRNGKey(0))
            self._key, sub = jax.random.split(self._key)
            return sub
        if isinstance(seed, (int, np.integer)):
            return jax.random.key(int(seed))
        if jnp.issubdtype(jnp.asarray(seed).dtype, jax.dtypes.prng_key):
            return seed
        return jax.random.wrap_key_data(jnp.asarray(seed, jnp.uint32))  # jax.random.PRNGKey

    @staticmethod
    def _merged(old_state, new, filter_types):
        del filter_types  # the values given are merged by path whatever filter chose them
        if isinstance(new, nnx.Module):
            new = nnx.state(new)
        pure = nnx.to_pure_dict(new) if isinstance(new, nnx.State) else dict(new)
        if "target" in pure and "embed_tokens" not in pure:   # a TunixCausalLM's state
            pure = pure["target"]
        merged = jax.tree.map(lambda x: x, old_state)
        nnx.replace_by_pure_dict(merged, pure)
        for (path, n), o in zip(jax.tree_util.tree_leaves_with_path(merged),
                                jax.tree.leaves(old_state)):
            if n.shape != o.shape:
                raise ValueError(f"update_params: {jax.tree_util.keystr(path)} has shape "
                                 f"{n.shape}, the rollout model has {o.shape}")
        return jax.tree.map(lambda n, o: jnp.asarray(n, o.dtype), merged, old_state)
