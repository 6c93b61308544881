"""RL rollouts with speculative decoding: a tunix rollout engine (``DominoTreeRollout``, built from
``engine_params``, ``engine_tokenizer``, ``engine_batches``, ``engine_programs``, ``auto_probe``
and ``engine_metrics``), the
tunix model calling convention for our target (``TunixCausalLM``), a jitted drafter update
that follows the policy from rollout features (``drafter_refresh``), the engine's state
saved and restored beside tunix's checkpoints (``checkpoints``), and tunix's ``RLCluster`` made
right across processes (``cluster.MultiProcessRLCluster``). The GRPO experiment harness that
drives them is in ``experiments/grpo/``."""

from dominotree_jax.rollout.checkpoints import (EngineCheckpoints,  # noqa: F401
                                               attach_engine_checkpoints,
                                               finish_checkpoint_writes,
                                               restore_engine_state)
from dominotree_jax.rollout.masked_forward import (completion_logprobs,  # noqa: F401
                                                   masked_forward)
from dominotree_jax.rollout.tunix_engine import DominoTreeRollout  # noqa: F401
from dominotree_jax.rollout.tunix_model import TunixCausalLM  # noqa: F401
from dominotree_jax.rollout.tunix_types import (HAVE_TUNIX, BaseRollout,  # noqa: F401
                                                RolloutConfig, RolloutOutput)

if HAVE_TUNIX:
    from dominotree_jax.rollout.cluster import MultiProcessRLCluster  # noqa: F401
