"""The ``RLCluster`` the multi-device RL workers build: every role on one mesh, our engine,
GRPO's usual small settings (``rl_mesh_worker.py``, ``rl_cluster_multiprocess_worker.py``)."""

from __future__ import annotations

import functools

import optax
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.rollout import base_rollout

from dominotree_jax.rollout import DominoTreeRollout
from dominotree_jax.sharding import DATA
from spec_fixtures import IntTokenizer


def one_mesh_cluster(cluster_class, policy, reference, mesh, drafter_params, engine_kw, *,
                     new_tokens: int, seed=None):
    """``cluster_class`` (tunix's ``RLCluster`` or ours) with actor, reference and rollout on
    ``mesh``, the batch on its ``"data"`` axis, 4 trainer steps at most."""
    Role = rl_cluster_lib.Role
    return cluster_class(
        actor=policy, reference=reference, tokenizer=IntTokenizer(),
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={Role.ACTOR: mesh, Role.REFERENCE: mesh, Role.ROLLOUT: mesh},
            rollout_engine=functools.partial(DominoTreeRollout, drafter_params=drafter_params,
                                             **engine_kw),
            training_config=rl_cluster_lib.RLTrainingConfig(
                actor_optimizer=optax.adam(3e-2), eval_every_n_steps=100, max_steps=4,
                data_sharding_axis=(DATA,)),
            rollout_config=base_rollout.RolloutConfig(
                max_tokens_to_generate=new_tokens, max_prompt_length=8, temperature=0.9,
                top_p=1.0, seed=seed)))
