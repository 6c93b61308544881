"""Run by ``test_rl_multidevice.py`` in a subprocess with 8 host CPU devices: tunix's
``GRPOLearner`` trains through ``RLCluster`` with ``DominoTreeRollout`` on a 2 x 4
``dominotree_jax.sharding`` mesh (batch on ``"data"``, heads / MLP units on ``"model"``), the
parameters placed by ``shard_params``.

Checks: the engine's rollouts (methods ``dominotree`` and ``dflash``, greedy and sampled) on
the sharded parameters, with the batch on ``"data"``, equal a single-device engine's; two
global steps run with ``dominotree``; the policy moved, stayed finite and kept its
placement; the engine decoded with the trained weights. Prints ``ok ...`` lines; exits
non-zero on a failure.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import grpo_learner
from tunix.rl.rollout import base_rollout

from dominotree_jax.rollout import DominoTreeRollout, TunixCausalLM
from dominotree_jax.sharding import DATA, make_mesh, shard_params
from decode_helpers import FAST_XLA
from rl_cluster_fixture import one_mesh_cluster
from sharding_worker import wide_pair
from spec_fixtures import IntTokenizer

PAD, NEW = 0, 4
PROMPTS = ["3 17 5 9", "40 1", "5 12 40 2 2 7", "7"]


def leaves(model) -> list:
    return jax.tree.leaves(nnx.state(model.target if isinstance(model, TunixCausalLM)
                                     else model))


def check_rollouts(tcfg, dcfg, params, sharded, method: str, temperatures=(0.0, 0.9)):
    """Greedy and sampled rollouts on the sharded parameters (the batch on ``"data"``) equal
    a single-device engine's, tokens and log-probs."""
    kw = dict(drafter_config=dcfg, method=method, budget=6, node_topk=3,
              compiler_options=FAST_XLA)
    one = DominoTreeRollout(rollout_actor=TunixCausalLM.from_params(tcfg, params["target"],
                                                                    PAD),
                            tokenizer=IntTokenizer(), drafter_params=params["drafter"], **kw)
    many = DominoTreeRollout(rollout_actor=TunixCausalLM.from_params(tcfg, sharded["target"],
                                                                     PAD),
                             tokenizer=IntTokenizer(), drafter_params=sharded["drafter"], **kw)
    for temperature in temperatures:
        rc = base_rollout.RolloutConfig(max_tokens_to_generate=8, max_prompt_length=8,
                                        temperature=temperature, top_p=None, seed=5,
                                        return_logprobs=True)
        a_out, b_out = one.generate(PROMPTS, rc), many.generate(PROMPTS, rc)
        assert many.last.prompt_BT.sharding.spec == P(DATA, None), many.last.prompt_BT.sharding
        for a, b, x, y in zip(a_out.tokens, b_out.tokens, a_out.logprobs, b_out.logprobs):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_allclose(x, y, atol=1e-4)
    print(f"ok {method} rollouts (T={temperatures}) on the 2x4 mesh, batch on 'data', equal "
          "one device's", flush=True)


def main():
    assert jax.device_count() == 8, jax.devices()
    tcfg, dcfg, params = wide_pair()
    mesh = make_mesh(data=2, model=4)
    sharded = shard_params(params, mesh)
    q = sharded["target"]["layers"][0]["self_attn"]["q_proj"]["weight"][...]
    assert q.sharding.spec == P("model", None) and q.addressable_shards[0].data.shape[0] == \
        q.shape[0] // 4
    # the tree method (its builder's top-k: dominotree_jax/fence.py) and a chain
    check_rollouts(tcfg, dcfg, params, sharded, "dominotree")
    check_rollouts(tcfg, dcfg, params, sharded, "dflash", temperatures=(0.0,))
    engine_kw = dict(drafter_config=dcfg, method="dominotree", budget=6, node_topk=3,
                     compiler_options=FAST_XLA)

    policy = TunixCausalLM.from_params(tcfg, sharded["target"], PAD)
    reference = TunixCausalLM.from_params(
        tcfg, shard_params({"target": jax.tree.map(jnp.copy, params["target"])},
                           mesh)["target"], PAD)
    cluster = one_mesh_cluster(rl_cluster_lib.RLCluster, policy, reference, mesh,
                               sharded["drafter"], engine_kw, new_tokens=NEW)
    engine = cluster.rollout
    start = [np.asarray(x) for x in leaves(cluster.actor_trainer.model)]
    learner = grpo_learner.GRPOLearner(
        rl_cluster=cluster,
        reward_fns=lambda prompts, completions, **kw: [
            sum(int(t) for t in c.split()) / 256.0 for c in completions],
        algo_config=grpo_learner.GRPOConfig(num_generations=2, num_iterations=2, beta=0.04))
    learner.train([{"prompts": np.array(PROMPTS)}, {"prompts": np.array(PROMPTS[::-1])}])
    trained = leaves(cluster.actor_trainer.model)
    assert cluster.actor_trainer.train_steps == 4
    assert all(np.isfinite(np.asarray(x)).all() for x in trained)
    assert any(not np.array_equal(a, np.asarray(b)) for a, b in zip(start, trained))
    print("ok 2 GRPO global steps (x2 iterations) on the 2x4 mesh", flush=True)
    tq = cluster.actor_trainer.model.target.layers[0].self_attn.q_proj.weight[...]
    assert tuple(tq.sharding.spec)[:1] == ("model",), tq.sharding   # P("model", None)
    assert tq.addressable_shards[0].data.shape[0] == tq.shape[0] // 4
    assert len(tq.sharding.mesh.devices.flat) == 8
    ours = jax.tree.leaves(engine.params["target"])
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(ours, trained))
    assert engine.last.out.tokens.shape[0] == 8 and engine.num_compilations == 1
    print(f"ok the policy kept its placement ({tq.sharding.spec}) and the engine decodes with "
          "the trained weights", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
