"""A causal forward of the target over sequences with holes (left-padded prompts followed by
right-padded completions, tunix's layout), and the per-token log-probs of completions.

Positions count the valid tokens before each one; a query sees the valid keys at or before it.
Differentiable in the parameters (GRPO losses use it inside ``jax.grad``).

Which tokens are real when a pad id may also occur inside a prompt (SmolLM2: pad = eos =
``<|im_end|>``, in every chat prompt) is ``real_tokens``' ``prompt_pads`` (docs/rl.md):
``"drop"``: every pad id is padding (tunix's trainer, ``common.process_ids``); ``"keep"``: only
the leading run (left padding) and the trailing run (completion padding) are.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dominotree_jax.config import TargetConfig
from dominotree_jax.model.cache import gather_rows
from dominotree_jax.model.target import (ForwardOut, TargetModel, bind_target,
                                         teacher_forced_forward)


PROMPT_PADS = ("keep", "drop")


def real_tokens(tokens_BW, pad_id: int, prompt_pads: str = "drop"):
    """``[B, W]`` bool: which tokens of a left-padded prompt + right-padded completion are real.

    ``"drop"``: those ``!= pad_id``. ``"keep"``: all but the leading and the trailing runs of
    ``pad_id`` (a pad id between real tokens is a real token)."""
    if prompt_pads not in PROMPT_PADS:
        raise ValueError(f"prompt_pads must be one of {PROMPT_PADS}, got {prompt_pads!r}")
    not_pad_BW = tokens_BW != pad_id
    if prompt_pads == "drop":
        return not_pad_BW
    seen_before_BW = jnp.cumsum(not_pad_BW, axis=1) > 0
    seen_after_BW = jnp.cumsum(not_pad_BW[:, ::-1], axis=1)[:, ::-1] > 0
    return seen_before_BW & seen_after_BW


def masked_forward(target: TargetModel, tokens_BW, valid_BW, tap_layers=()) -> ForwardOut:
    """One causal forward of ``[B, W]`` tokens of which ``valid_BW`` are real."""
    B, W = tokens_BW.shape
    pos_BW = jnp.maximum(jnp.cumsum(valid_BW.astype(jnp.int32), axis=1) - 1, 0)
    col_W = jnp.arange(W)
    mask_BWW = (col_W[None, None, :] <= col_W[None, :, None]) & valid_BW[:, None, :]
    return teacher_forced_forward(target, tokens_BW, pos_BW, mask_BWW, tuple(tap_layers))


def completion_logprobs(target_params, tcfg: TargetConfig, prompt_BT, completion_BY,
                        prompt_valid_BT, completion_valid_BY, temperature: float = 1.0):
    """``[B, Y]`` log-probs of ``completion_BY`` after ``prompt_BT`` from ``softmax(logits /
    temperature)`` (``temperature == 0`` is read as 1). The ``*_valid`` masks mark real tokens
    (padding may sit anywhere: tunix left-pads prompts, decode right-pads them). Entries at
    completion padding are 0."""
    seq_BW = jnp.concatenate([prompt_BT, completion_BY], axis=1).astype(jnp.int32)
    valid_BW = jnp.concatenate([prompt_valid_BT, completion_valid_BY], axis=1).astype(bool)
    target = bind_target(tcfg, target_params)
    out = masked_forward(target, seq_BW, valid_BW)
    T, W = prompt_BT.shape[1], seq_BW.shape[1]
    # completion token j is predicted by the hidden state of the last real token before it
    last_real_BW = jax.lax.cummax(jnp.where(valid_BW, jnp.arange(W)[None], 0), axis=1)
    pred_BY = last_real_BW[:, T - 1:W - 1]
    logits_BYV = target.logits(gather_rows(out.hidden, pred_BY))
    if isinstance(temperature, jax.Array) or temperature not in (0.0, 1.0):   # traced: > 0
        logits_BYV = logits_BYV / temperature
    logp_BYV = jax.nn.log_softmax(logits_BYV, axis=-1)
    logp_BY = jnp.take_along_axis(logp_BYV, completion_BY[..., None].astype(jnp.int32), 2)[..., 0]
    return jnp.where(completion_valid_BY, logp_BY, 0.0)
