"""What the GRPO arm machinery (``grpo_run``, ``grpo_speed``) needs of a task: the models, the
tokenizer, how prompts are cut and completions stopped, and each arm's engine settings
(``experiments/grpo/grpo_smollm2.py``'s ``Task`` is one)."""

from __future__ import annotations

from typing import Any, Protocol

from dominotree_jax.rollout.tunix_types import RolloutConfig


class ArmTask(Protocol):
    tcfg: Any                       # the target's TargetConfig
    tparams: Any                    # its parameters: the initial policy and the reference
    dcfg: Any                       # the drafter's DrafterConfig
    dparams: Any                    # its parameters
    tokenizer: Any                  # HF or tunix style (encode, decode, pad / eos ids)
    stop_ids: list[int]             # token ids that end a completion
    pad_id: int                     # the policy's pad id (``TunixCausalLM(..., pad_id)``)
    prompt_width: int               # prompts are cut to this many tokens
    compiler_options: dict | None   # the engine's ``jax.jit`` options (None: XLA's defaults)

    def engine_options(self, arm: str, refresh: dict) -> dict:
        """``DominoTreeRollout`` keyword arguments of ``arm`` (``refresh``: the
        ``drafter_refresh`` options of an arm that refreshes its drafter). ``<arm>@<precision>``
        (``grpo_speed.arm_precision``): that arm with ``precision=`` the engine holds the
        weights in (the engine casts the float32 policy and drafter it is given)."""


def sampling_config(task: ArmTask, max_new: int, temperature: float) -> RolloutConfig:
    """The rollouts' sampling: full vocabulary at ``temperature``, at most ``max_new`` new
    tokens, the task's prompt width and stop ids; no fixed seed (the engine's key advances)."""
    return RolloutConfig(max_tokens_to_generate=max_new, max_prompt_length=task.prompt_width,
                         temperature=temperature, top_p=1.0, top_k=None,
                         eos_tokens=task.stop_ids, seed=None)
