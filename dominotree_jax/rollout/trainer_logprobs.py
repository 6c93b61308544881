"""Log-probs by the trainer's own program (``DominoTreeRollout(trainer_logprobs=True)``).

A decode's log-probs come from its verify passes: the target's numbers for the same tokens,
but from other programs (a cache, other row shapes), so they agree with the trainer's
teacher-forced forward to ~1e-5, not bit for bit. Stacks that check rollout against trainer
log-probs bit for bit need the same program on the same inputs. This module computes them with
tunix's own ``common.compute_per_token_logps`` over a ``TunixCausalLM`` of the engine's target
parameters, on the arrays tunix's GRPO learner builds from a rollout (the left-padded prompts,
completions right-padded to ``max_tokens_to_generate`` with the pad id, the pad and end ids,
the rollout temperature): the rollout's log-probs and the engine's ``get_per_token_logps`` (the
learner's "old" log-probs) are then the trainer's bits whenever the trainer scores the same
batch on the same parameters (a micro-batch of the rollout batch runs another program shape).
"""

from __future__ import annotations

import numpy as np


def padded_completions(tokens: list, width: int, pad_id: int) -> np.ndarray:
    """``[B, width]`` int32: each row's completion right-padded with ``pad_id``, as tunix's
    GRPO learner pads ``RolloutOutput.tokens`` (``width``: ``max_tokens_to_generate``)."""
    out = np.full((len(tokens), width), pad_id, np.int32)
    for b, t in enumerate(tokens):
        if len(t) > width:
            raise ValueError(f"completion {b} has {len(t)} tokens, more than {width}")
        out[b, :len(t)] = t
    return out


def trainer_model(tcfg, target_params, model_pad):
    """``(graphdef, state)`` of a ``TunixCausalLM(tcfg, target_params, model_pad)``: the policy
    as the trainer holds it (built once per parameter update, ``trainer_per_token_logps``)."""
    from flax import nnx

    from dominotree_jax.rollout.tunix_model import TunixCausalLM
    return nnx.split(TunixCausalLM.from_params(tcfg, target_params, model_pad))


def trainer_per_token_logps(model, prompt_BT, completion_BY, pad_id: int, eos_id: int,
                            temperature: float):
    """``[B, Y]`` tunix's ``compute_per_token_logps`` of the completions under ``model``
    (``trainer_model``'s ``(graphdef, state)``)."""
    import jax.numpy as jnp
    from tunix.rl import common
    graphdef, state = model
    return common.compute_per_token_logps(graphdef, state, jnp.asarray(prompt_BT),
                                          jnp.asarray(completion_BY), pad_id=int(pad_id),
                                          eos_id=int(eos_id), temperature=float(temperature))
