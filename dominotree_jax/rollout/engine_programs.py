"""The rollout engine's two jitted programs and what they compile for.

``RolloutPrograms.decode``: ``decode`` over a prompt batch, compiled once per
``(DecodeConfig.program, batch, width)`` (``decode_config_for`` maps tunix's ``RolloutConfig``
to the ``DecodeConfig``); the parameters and the sampling values (temperature, top-k, top-p)
are arguments, so new values never recompile. ``traces`` lists the config of each
compilation; the drafter's draft head it reads (``decode.draft_head``) is made once per config
and parameter values, not in every call (``RolloutPrograms.head_for``).
``RolloutPrograms.per_token_logps``: the teacher-forced completion log-probs tunix's trainer
computes (``masked_forward.completion_logprobs``), compiled once per shapes and pad id
(``logp_traces``; the temperature is an argument). Rows go on the data axis of the
parameters' mesh (``placement.BatchPlacement``).
"""

from __future__ import annotations

import weakref

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dominotree_jax.config import TargetConfig
from dominotree_jax.decoding.config import DecodeConfig
from dominotree_jax.decoding.decode import DecodeOutput, check_inputs, decode, draft_head
from dominotree_jax.rollout.engine_batches import PromptBatch, shared_prefill_rows
from dominotree_jax.rollout.engine_params import without_explicit_axes
from dominotree_jax.rollout.masked_forward import completion_logprobs, real_tokens
from dominotree_jax.rollout.placement import BatchPlacement
from dominotree_jax.rollout.tunix_types import RolloutConfig


def decode_config_for(tcfg: TargetConfig, rc: RolloutConfig, stop: tuple[int, ...],
                  return_features: bool, settings: dict) -> DecodeConfig:
    """The ``DecodeConfig`` of a ``RolloutConfig`` (sampling, length, log-probs over the whole
    vocabulary) with stop ids ``stop`` and the engine's ``settings`` (method, budget, ...)."""
    top_k = 0 if rc.top_k is None or rc.top_k < 0 else int(rc.top_k)
    top_p = 1.0 if rc.top_p is None else float(rc.top_p)
    return DecodeConfig(target=tcfg, max_new_tokens=int(rc.max_tokens_to_generate),
                        temperature=float(rc.temperature), top_k=top_k, top_p=top_p,
                        stop_ids=stop, return_logprobs=bool(rc.return_logprobs),
                        logprobs_filtered=False, return_features=return_features, **settings)


def key_of_seed(seed):
    """A ``RolloutConfig.seed`` as a typed PRNG key: an int, a typed key, or raw key data
    (``jax.random.PRNGKey``); None for None (the engine then draws a fresh key: tunix's
    sampler would reuse ``PRNGKey(0)``)."""
    if seed is None:
        return None
    if isinstance(seed, (int, np.integer)):
        return jax.random.key(int(seed))
    if jnp.issubdtype(jnp.asarray(seed).dtype, jax.dtypes.prng_key):
        return seed
    return jax.random.wrap_key_data(jnp.asarray(seed, jnp.uint32))


class RolloutPrograms:
    """The jitted decode and log-prob programs of one engine (module docstring), for the target
    ``tcfg`` whose prompt pad ids are read per ``prompt_pads``."""

    def __init__(self, tcfg: TargetConfig, prompt_pads: str, compiler_options: dict | None):
        self.traces: list[DecodeConfig] = []
        self.logp_traces: list[tuple] = []

        def run(params, head_CH, prompt_BT, lengths_B, prompt_rows, key, auto_state,
                row_stops_Be, sampling, history_BhW, *, config, value_checks):
            self.traces.append(config)   # Python side effect: once per compilation
            if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):   # key data (uint32)
                key = jax.random.wrap_key_data(key)
            return decode(params, prompt_BT, config=config, key=key, prompt_lengths=lengths_B,
                          auto_state=auto_state, row_stop_ids=row_stops_Be,
                          prompt_rows=prompt_rows, draft_head=head_CH, sampling=sampling,
                          lookup_history=history_BhW, value_checks=value_checks)

        def logps(target_params, prompt_BT, completion_BY, temperature, pad_id):
            self.logp_traces.append(prompt_BT.shape + completion_BY.shape)
            T = prompt_BT.shape[1]
            real_BW = real_tokens(jnp.concatenate([prompt_BT, completion_BY], axis=1), pad_id,
                                  prompt_pads)
            return jax.lax.stop_gradient(completion_logprobs(
                target_params, tcfg, prompt_BT, completion_BY, real_BW[:, :T],
                real_BW[:, T:], temperature))

        self._decode = jax.jit(run, static_argnames=("config", "value_checks"),
                               compiler_options=compiler_options)
        self._draft_head = jax.jit(draft_head, static_argnames="config",
                                   compiler_options=compiler_options)
        self._heads: dict[DecodeConfig, tuple] = {}
        self._logps = jax.jit(logps, static_argnames="pad_id", compiler_options=compiler_options)

    def head_for(self, params, config: DecodeConfig):
        """The draft head of ``params`` under ``config``: the one made for the last call unless
        a target parameter array was replaced since (``update_params``, or a trainer that
        shares its variables with the engine) or the draft vocabulary changed. The arrays it
        was made from are held by weak references (an old policy is not kept alive)."""
        leaves = jax.tree.leaves(params["target"])
        d2t = _draft_vocab(params.get("drafter"))
        hit = self._heads.get(config)
        if hit is not None:
            refs, old_d2t, head = hit
            if (len(refs) == len(leaves) and all(r() is x for r, x in zip(refs, leaves))
                    and _same_vocab(old_d2t, d2t)):
                return head
        head = self._draft_head(params, config=config)
        self._heads[config] = ([weakref.ref(x) for x in leaves], d2t, head)
        return head

    def decode(self, params, batch: PromptBatch, key, auto_state, row_stops_Be,
               config: DecodeConfig, place: BatchPlacement, share_prefill: bool,
               history_BhW=None):
        """``(DecodeOutput, prompt_BT, lengths_B)``: ``batch`` decoded under ``config``, its rows
        placed by ``place`` (the placed prompt arrays are returned beside the output); waits for
        the tokens. ``auto_state``: the ``budget="auto"`` state to start from (host values), or
        None. ``row_stops_Be``: per-row stop ids or None. ``share_prefill``: prefill each
        distinct prompt once, then copy it to its rows (``shared_prefill_rows``; not on a
        multi-process mesh, where each process would hold another number of them).
        ``history_BhW``: each row's earlier texts (``decode``'s ``lookup_history``) or None."""
        if place.multi_process:   # host values every process holds alike: replicated
            key = np.asarray(jax.random.key_data(key))
        prompt_BT, lengths_B = place.put(batch.prompt_BT), place.put(batch.lengths_B)
        shared = shared_prefill_rows(batch.prompt_BT, batch.lengths_B) \
            if share_prefill and not place.multi_process else None
        host = (batch.prompt_BT, batch.lengths_B, None) if shared is None else shared
        # the values checked here, on the host, so that the program has no host callback and
        # jax's persistent compilation cache keeps it across runs; on a multi-process mesh
        # (each process checks only its rows) the program checks the whole batch too
        check_inputs(host[0], config=config, key=key, prompt_lengths=host[1],
                     prompt_rows=host[2], row_stop_ids=row_stops_Be, lookup_history=history_BhW)
        args = (prompt_BT, lengths_B, None) if shared is None else \
            tuple(place.put(x) for x in shared)
        compiled = len(self.traces)
        out: DecodeOutput = self._decode(
            params, self.head_for(params, config.program), *args, key, auto_state,
            None if row_stops_Be is None else place.put(row_stops_Be), config.sampling,
            None if history_BhW is None else place.put(history_BhW), config=config.program,
            value_checks=place.multi_process)
        if len(self.traces) > compiled:   # compiled for this call: record the config asked
            self.traces[-1] = config
        jax.block_until_ready(out.tokens)
        return out, prompt_BT, lengths_B

    def per_token_logps(self, target_params, prompt_tokens, completion_tokens, pad_id: int,
                        temperature: float) -> jax.Array:
        """``[B, Y]`` log-probs of the completions (tunix's layout: prompts left-padded,
        completions right-padded with ``pad_id``) at ``temperature``; 0 at completion padding.
        On a multi-process mesh each process hands over its rows and gets its rows back."""
        place = BatchPlacement.of(target_params)
        temperature = np.float32(1.0 if temperature == 0 else temperature)   # 0 reads as 1
        if place.multi_process:
            prompt, completion = (place.put(np.asarray(x, np.int32))
                                  for x in (prompt_tokens, completion_tokens))
            return jnp.asarray(place.local(self._logps(
                target_params, prompt, completion, temperature, pad_id=pad_id)))
        prompt, completion = without_explicit_axes(
            (jnp.asarray(prompt_tokens, jnp.int32), jnp.asarray(completion_tokens, jnp.int32)))
        return self._logps(target_params, prompt, completion, temperature, pad_id=pad_id)


def _draft_vocab(drafter_state):
    """The ``d2t`` map of a drafter state as a host array (None without a drafter or a draft
    vocabulary)."""
    if drafter_state is None:
        return None
    pure = nnx.to_pure_dict(drafter_state) if isinstance(drafter_state, nnx.State) \
        else drafter_state
    d2t = pure.get("d2t")
    return None if d2t is None else np.asarray(d2t)


def _same_vocab(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None
                                         and np.array_equal(a, b))
