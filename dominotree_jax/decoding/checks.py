"""``decode``'s input checks, refused by name before any compute, jitted or not.

Shapes, dtypes and settings are checked when ``decode`` is called, traced or not. Values
(token ids, lengths, row stop ids, prompt rows, runtime sampling values) are checked on the host
when they are concrete; when they are traced (``decode`` inside the caller's own ``jax.jit``)
the compiled program checks them first and, only when one fails, calls back to the host, which
raises the same ``ValueError`` text (inside the runtime error jax reports). The program's inputs
pass through that check, so nothing is computed from a refused input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.decoding.config import DecodeConfig
from dominotree_jax.precision import Precision
from dominotree_jax.sampling import Sampling, sampling_problem

if TYPE_CHECKING:   # shape annotations only; tests check them (tests/shape_check.py)
    from jaxtyping import Array, Int


class DecodeInputs(NamedTuple):
    """``decode``'s runtime arrays after the checks: ``b`` distinct prompts of ``T`` columns,
    ``B`` output rows (``b`` unless ``rows_B`` maps rows to prompts)."""
    prompt_bT: Int[Array, "b T"]
    lengths_b: Int[Array, " b"]
    rows_B: Int[Array, " B"] | None      # prompt_rows
    stops_Be: Int[Array, "B e"] | None   # row_stop_ids
    sampling: Sampling | None            # None: greedy
    history_BhW: Int[Array, "B h W"] | None = None   # lookup_history


def checked_inputs(prompt, *, config: DecodeConfig, key, prompt_lengths, prompt_rows,
                   row_stop_ids, sampling, lookup_history=None) -> DecodeInputs:
    """``decode``'s arguments as int32 arrays of the shapes it reads, refused by name when a
    shape, dtype or setting is wrong (values: ``refuse_on_host`` / ``refuse_in_program``)."""
    prompt_bT = jnp.asarray(prompt)
    if not jnp.issubdtype(prompt_bT.dtype, jnp.integer):
        raise ValueError(f"prompt must hold integer token ids, got dtype {prompt_bT.dtype}")
    prompt_bT = prompt_bT.astype(jnp.int32)
    if prompt_bT.ndim == 1:
        prompt_bT = prompt_bT[None]
    if prompt_bT.ndim != 2:
        raise ValueError(f"prompt must be [T] or [B, T], got shape {prompt_bT.shape}")
    b, T = prompt_bT.shape
    if T == 0 or b == 0:
        raise ValueError(f"empty prompt (shape {prompt_bT.shape})")
    limit = config.target.max_position_embeddings
    if T + config.max_new_tokens > limit:
        raise ValueError(f"prompt ({T}) + max_new_tokens ({config.max_new_tokens}) exceeds the "
                         f"target's max_position_embeddings ({limit})")
    if config.sampled and key is None:
        raise ValueError("temperature > 0 needs an explicit PRNG key (key=jax.random.key(...))")
    lengths_b = jnp.full((b,), T, jnp.int32) if prompt_lengths is None else \
        _int_array(prompt_lengths, "prompt_lengths", (b,), f"an integer [B={b}] array")
    rows_B = None if prompt_rows is None else _int_array(prompt_rows, "prompt_rows", None,
                                                         "a non-empty integer [B] array")
    B = b if rows_B is None else rows_B.shape[0]
    stops_Be = None if row_stop_ids is None else _int_array(
        row_stop_ids, "row_stop_ids", (B, None), f"an integer [B={B}, e] array (-1 = padding)")
    history_BhW = None
    if lookup_history is not None:
        if not config.lookup_history:
            raise ValueError("lookup_history texts need a config with lookup_history=H (H texts "
                             "per row); this one has 0")
        H, C = config.lookup_history, T + config.max_new_tokens
        history_BhW = _int_array(lookup_history, "lookup_history", (B, H, None),
                                 f"an integer [B={B}, H={H}, C] array (-1 = past the end)")
        if not 1 <= history_BhW.shape[2] <= C:
            raise ValueError(f"lookup_history texts must be 1 to {C} tokens wide (prompt width "
                             f"+ max_new_tokens), got {history_BhW.shape[2]}")
    return DecodeInputs(prompt_bT, lengths_b, rows_B, stops_Be, _sampling(config, sampling),
                        history_BhW)


def _int_array(x, name: str, shape, described: str):
    """``x`` as int32, refused unless integer and of ``shape`` (None: any one non-empty axis;
    None inside: any length)."""
    arr = jnp.asarray(x)
    if shape is not None and len(shape) == 1 and arr.size == shape[0]:
        arr = arr.reshape(shape)   # e.g. a [B, 1] column of lengths
    fits = (arr.ndim == 1 and arr.shape[0] >= 1) if shape is None else (
        arr.ndim == len(shape) and all(s is None or s == n for s, n in zip(shape, arr.shape)))
    if not fits or not jnp.issubdtype(arr.dtype, jnp.integer):
        raise ValueError(f"{name} must be {described}, got shape {arr.shape} dtype {arr.dtype}")
    return arr.astype(jnp.int32)


def _sampling(config: DecodeConfig, sampling) -> Sampling | None:
    """The runtime sampling values: ``sampling`` when given (scalars; the config must sample),
    else the config's (None when greedy)."""
    if sampling is None:
        return config.sampling
    if not config.sampled:
        raise ValueError("sampling values need a sampled config (temperature > 0); greedy "
                         "decoding is static: a config with temperature 0")
    values = Sampling.of(*sampling)
    if any(v.ndim for v in values):
        raise ValueError(f"sampling values must be scalars, got shapes "
                         f"{[tuple(v.shape) for v in values]}")
    return values


def _failures(v: DecodeInputs, config: DecodeConfig, xp):
    """``(failed, message)`` per value check, in order: ``failed`` a bool of ``xp`` (numpy, or
    jax.numpy on traced values), ``message(host_values)`` the refusal's text."""
    T, V = v.prompt_bT.shape[1], config.target.vocab_size
    n_b = v.lengths_b
    yield xp.any((n_b < 1) | (n_b > T)), \
        lambda h: f"prompt_lengths must be in [1, {T}], got {h.lengths_b.tolist()}"
    yield xp.any(_outside_vocab(v, V, xp)), \
        lambda h: (f"token ids outside the vocabulary [0, {V}): "
                   f"{_listed(h.prompt_bT[_outside_vocab(h, V, np)])}")
    if v.rows_B is not None:
        b = v.prompt_bT.shape[0]
        yield xp.any((v.rows_B < 0) | (v.rows_B >= b)), \
            lambda h: (f"prompt_rows must index the {b} prompts, got values in "
                       f"[{h.rows_B.min()}, {h.rows_B.max()}]")
    if v.stops_Be is not None:
        yield xp.any((v.stops_Be < -1) | (v.stops_Be >= V)), \
            lambda h: (f"row_stop_ids outside the vocabulary (or -1): "
                       f"{_listed(h.stops_Be[(h.stops_Be < -1) | (h.stops_Be >= V)])}")
    if v.history_BhW is not None:
        yield xp.any((v.history_BhW < -1) | (v.history_BhW >= V)), \
            lambda h: (f"lookup_history outside the vocabulary (or -1): "
                       f"{_listed(h.history_BhW[(h.history_BhW < -1) | (h.history_BhW >= V)])}")
    if v.sampling is not None:
        t, k, p = v.sampling
        yield ~(t > 0) | ~((p > 0) & (p <= 1)) | (k < 0), \
            lambda h: sampling_problem(*(x.item() for x in h.sampling)) or (
                f"temperature must be > 0 to sample (0 = greedy: a config with temperature "
                f"0), got {h.sampling.temperature.item()}")


def _outside_vocab(v: DecodeInputs, vocab: int, xp):
    """``[b, T]``: prompt ids within a row's length that are not token ids of the vocabulary."""
    T = v.prompt_bT.shape[1]
    within_bT = xp.arange(T)[None, :] < v.lengths_b[:, None]
    return within_bT & ((v.prompt_bT < 0) | (v.prompt_bT >= vocab))


def _listed(bad) -> list[int]:
    return sorted(set(np.asarray(bad).tolist()))[:10]


def is_traced(tree) -> bool:
    return any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(tree))


def refuse_on_host(v: DecodeInputs, config: DecodeConfig) -> None:
    """Raise the first failing value check's ``ValueError`` (concrete values)."""
    h = jax.tree.map(np.asarray, v)
    for failed, message in _failures(h, config, np):
        if failed:
            raise ValueError(message(h))


def refuse_in_program(v: DecodeInputs, config: DecodeConfig) -> DecodeInputs:
    """``v`` (traced) through a check in the program: when a value check fails, a host
    callback raises ``refuse_on_host``'s error; the result is ``v``, which the rest of the
    program reads, so nothing runs on refused values. Costs one reduction per input."""
    failed = jnp.any(jnp.stack([jnp.asarray(f) for f, _ in _failures(v, config, jnp)]))

    def raise_on_host(h: DecodeInputs) -> DecodeInputs:
        refuse_on_host(h, config)
        return h   # not reached: the device saw a failure

    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), v)
    return jax.lax.cond(failed, lambda v: jax.pure_callback(raise_on_host, shapes, v),
                        lambda v: v, v)


def check_params(params, config: DecodeConfig, uses_drafter: bool) -> None:
    """The parameters' dtypes against ``config.precision`` (refused naming both), or, without
    one, a drafter's pairing with the target (the policy's, ``precision.check_pair``)."""
    drafter_params = params.get("drafter") if uses_drafter else None
    if config.precision is not None:
        config.precision.check_params(params["target"], drafter_params,
                                      what="decode config's precision")
    elif drafter_params is not None:
        Precision.of_params(params["target"], drafter_params)
