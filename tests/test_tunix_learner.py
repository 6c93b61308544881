"""google-tunix's own GRPO learner trains through ``RLCluster`` with ``DominoTreeRollout`` as
the rollout engine (tiny random target, ``TunixCausalLM`` policy and reference, 1-device CPU
mesh, 2 prompts x a group of 2, 4 new tokens, 2 global steps of ``GRPOLearner.train`` with 2
GRPO iterations each).

It checks what the integration must do: tunix builds our engine from the ``functools.partial``
in ``ClusterConfig``; every step's rollouts come from our ``generate`` (4 completions, at most 4
tokens, seen by the reward function) with the policy's current weights (step 2 samples with the
weights step 1 produced); the old-policy log-probs come from our ``get_per_token_logps``; the
policy parameters change and stay finite; no decode program is compiled twice. With
``jax.make_mesh``'s default ``Explicit`` axes the engine keeps its own copy and tunix hands the
new weights to ``update_params`` after each step (the last one equals the trained policy); with
``Auto`` axes the colocated engine shares the policy's variables and tunix never needs to."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

pytest.importorskip("tunix", reason="google-tunix is not installed (make test installs it)")
import optax  # noqa: E402
from tunix.rl import rl_cluster as rl_cluster_lib  # noqa: E402
from tunix.rl.grpo import grpo_learner  # noqa: E402
from tunix.rl.rollout import base_rollout  # noqa: E402

from decode_helpers import FAST_XLA  # noqa: E402
from dominotree_jax.rollout import (DominoTreeRollout, TunixCausalLM,  # noqa: E402
                                    completion_logprobs)
from spec_fixtures import IntTokenizer, tiny_pair  # noqa: E402

# tunix 0.1.7 uses `with mesh:` and pxla.thread_resources, optax.global_norm: deprecated APIs
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PAD = 0
NEW = 4
# tunix repeats each batch's arrays G times along axis 0 (a list of strings would be mapped
# string by string): prompts are numpy arrays, as its data pipelines give them
BATCHES = [{"prompts": np.array(["3 17 5 9", "40 1"])},
           {"prompts": np.array(["5 12 40 2 2 7", "7"])}]


def flat(state) -> dict:
    """``{path: array}`` of a target's (or a ``TunixCausalLM``'s) parameter state."""
    pure = nnx.to_pure_dict(state) if isinstance(state, nnx.State) else state
    if "target" in pure and "embed_tokens" not in pure:
        pure = pure["target"]
    return {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(pure)}


def same_values(a: dict, b: dict) -> bool:
    assert a.keys() == b.keys()
    return all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


class RecordingRollout(DominoTreeRollout):
    """Our engine, noting what tunix asks of it (array references only: ``update_params`` runs
    under tunix's transfer guards, which forbid device-to-host copies)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.generated = []   # (number of prompts, target parameters the rollout used)
        self.updates = []     # parameters handed to update_params
        self.logps = []       # (prompt, completion, result) of get_per_token_logps

    def generate(self, prompts, rollout_config, **kw):
        self.generated.append((len(prompts), flat(self.params["target"])))
        return super().generate(prompts, rollout_config, **kw)

    def get_per_token_logps(self, prompt_tokens, completion_tokens):
        out = super().get_per_token_logps(prompt_tokens, completion_tokens)
        self.logps.append((prompt_tokens, completion_tokens, out))
        return out

    def update_params(self, params, filter_types=None):
        self.updates.append(flat(params))
        super().update_params(params, filter_types)


@pytest.mark.parametrize("axis_type,hybrid", [("explicit", False), ("auto", False),
                                               ("auto", True)])
def test_grpo_learner_steps_through_rlcluster_with_our_engine(axis_type, hybrid):
    """``hybrid``: the policy is a Gated DeltaNet hybrid (its teacher-forced log-probs and
    gradients through the recurrent layers, its rollouts verified on recurrent state)."""
    tcfg, dcfg, params = tiny_pair(hybrid=hybrid)
    policy = TunixCausalLM.from_params(tcfg, params["target"])
    reference = TunixCausalLM.from_params(tcfg, jax.tree.map(jnp.copy, params["target"]))
    # Explicit: jax.make_mesh's default; Auto: tunix.utils.mesh.create_mesh's, and ours
    kind = {"explicit": jax.sharding.AxisType.Explicit, "auto": jax.sharding.AxisType.Auto}
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(kind[axis_type],) * 2)
    Role = rl_cluster_lib.Role
    cluster = rl_cluster_lib.RLCluster(
        actor=policy, reference=reference, tokenizer=IntTokenizer(),
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={Role.ACTOR: mesh, Role.REFERENCE: mesh, Role.ROLLOUT: mesh},
            rollout_engine=functools.partial(
                RecordingRollout, drafter_config=dcfg, drafter_params=params["drafter"],
                budget=6, node_topk=3, top_m=16, compiler_options=FAST_XLA),
            training_config=rl_cluster_lib.RLTrainingConfig(
                actor_optimizer=optax.adam(3e-2), eval_every_n_steps=100, max_steps=4),
            rollout_config=base_rollout.RolloutConfig(
                max_tokens_to_generate=NEW, max_prompt_length=8, temperature=1.0, top_p=1.0)))
    engine = cluster.rollout
    assert isinstance(engine, RecordingRollout)
    start = flat(nnx.state(cluster.actor_trainer.model))

    seen = []   # the completions tunix hands the reward function, per step

    def reward(prompts, completions, **kwargs):   # varies within a group: nonzero advantages
        seen.append(list(completions))
        return [sum(int(t) for t in c.split()) / (64.0 * NEW) for c in completions]

    learner = grpo_learner.GRPOLearner(
        rl_cluster=cluster, reward_fns=reward,
        algo_config=grpo_learner.GRPOConfig(num_generations=2, num_iterations=2, beta=0.04))
    learner.train(BATCHES)

    end = flat(nnx.state(cluster.actor_trainer.model))
    assert cluster.actor_trainer.train_steps == 4   # 2 global steps x num_iterations 2
    # every rollout came from our engine: 2 prompts x 2 samples, <= NEW tokens each
    assert [n for n, _ in engine.generated] == [4, 4]
    assert len(seen) == 2 and all(len(batch) == 4 for batch in seen)
    assert all(len(c.split()) <= NEW for batch in seen for c in batch)
    assert engine.last is not None and engine.last.out.tokens.shape[0] == 4
    # num_iterations > 1: tunix takes the old-policy log-probs from our get_per_token_logps
    assert len(engine.logps) == 2
    prompt, completion, old = (np.asarray(x) for x in engine.logps[0])
    assert old.shape == (4, NEW)
    np.testing.assert_allclose(old, completion_logprobs(
        params["target"], tcfg, prompt, completion, prompt != PAD, completion != PAD), atol=1e-5)
    # the learner moved the policy, and the second rollout sampled with the moved weights
    assert all(np.isfinite(np.asarray(x)).all() for x in end.values())
    assert not same_values(start, end)
    first, second = engine.generated[0][1], engine.generated[1][1]
    assert same_values(first, start)
    assert not same_values(second, start)
    # the engine ends on the trained policy, having compiled one decode (and log-prob) program
    assert same_values(flat(engine.params["target"]), end)
    assert engine.num_compilations == 1 and len(engine.logp_traces) == 1
    if axis_type == "explicit":
        # own copy: tunix syncs after each global step; step 2 sampled with step 1's result
        assert len(engine.updates) == 2
        assert same_values(second, engine.updates[0])
        assert same_values(engine.updates[1], end)
        leaf = jax.tree.leaves(engine.params["target"])[0]
        assert leaf.sharding.mesh.axis_types == (jax.sharding.AxisType.Auto,) * 2
    else:
        # colocated on an Auto mesh: the engine shares the policy's variables, no sync needed
        assert engine.updates == []
        ours = jax.tree.leaves(engine.params["target"])
        theirs = jax.tree.leaves(nnx.state(cluster.actor_trainer.model.target))
        assert len(ours) == len(theirs) and all(a is b for a, b in zip(ours, theirs))


def test_drafter_refresh_inside_grpo_learner():
    """``drafter_refresh=`` (its default schedule): one drafter step after every rollout
    micro-batch tunix asks for (here 2 per global step, ``rollout_micro_batch_size=1`` x a
    group of 2), each on that
    micro-batch's own tokens (a checksum computed inside the compiled step equals the sum of
    the prompt and completion ids tunix handed the reward function), the drafter parameters
    changing every time and the engine decoding with the new ones; time and memory are logged
    per step and reach tunix's metrics logger through ``engine.tunix_metrics``."""
    tcfg, dcfg, params = tiny_pair()
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    Role = rl_cluster_lib.Role
    cluster = rl_cluster_lib.RLCluster(
        actor=TunixCausalLM.from_params(tcfg, params["target"], PAD),
        reference=TunixCausalLM.from_params(tcfg, jax.tree.map(jnp.copy, params["target"]),
                                            PAD),
        tokenizer=IntTokenizer(),
        cluster_config=rl_cluster_lib.ClusterConfig(
            role_to_mesh={Role.ACTOR: mesh, Role.REFERENCE: mesh, Role.ROLLOUT: mesh},
            rollout_engine=functools.partial(
                RecordingRollout, drafter_config=dcfg, drafter_params=params["drafter"],
                budget=6, node_topk=3, top_m=16, compiler_options=FAST_XLA,
                drafter_refresh={"lr": 1e-2, "anchors": 3, "rows": None}),
            training_config=rl_cluster_lib.RLTrainingConfig(
                actor_optimizer=optax.adam(3e-2), eval_every_n_steps=100, max_steps=2,
                rollout_micro_batch_size=1),
            rollout_config=base_rollout.RolloutConfig(
                max_tokens_to_generate=NEW, max_prompt_length=8, temperature=0.9, top_p=1.0)))
    engine = cluster.rollout
    assert engine.prompt_pads == "keep" and engine.refresher is not None
    drafters = []   # the drafter parameters each generate call decoded with
    original_generate = engine.generate

    def generate(prompts, rollout_config, **kw):
        drafters.append(flat(engine.params["drafter"]))
        out = original_generate(prompts, rollout_config, **kw)
        # what the compiled step must have summed: prompt ids + committed ids (eos = pad = 0)
        expected.append(sum(int(t) for p in prompts for t in str(np.asarray(p).reshape(-1)[0])
                            .split()) + sum(int(np.sum(t)) for t in out.tokens))
        return out

    expected = []
    engine.generate = generate
    logged = []
    cluster.with_external_metrics_logger(lambda buf: logged.append(dict(buf.metrics)))
    learner = grpo_learner.GRPOLearner(
        rl_cluster=cluster, metric_fns=[engine.tunix_metrics],
        reward_fns=lambda prompts, completions, **kw: [
            sum(int(t) for t in c.split()) / 256.0 for c in completions],
        algo_config=grpo_learner.GRPOConfig(num_generations=2, num_iterations=1, beta=0.04))
    learner.train(BATCHES)

    log = engine.refresh_log
    assert len(engine.generated) == 4 and [n for n, _ in engine.generated] == [2, 2, 2, 2]
    assert len(log) == 4 and engine.refresher.num_steps == 4     # every micro-batch, not 1/step
    assert [r["token_sum"] for r in log] == expected              # each on its own rollout
    assert all(r["rows"] == 2 and r["labels"] > 0 for r in log)
    assert all(r["seconds"] > 0 and r["temp_bytes"] > 0 and r["logits_bytes"] > 0
               for r in log)
    assert len(engine.refresher.traces) == 1                      # one compiled step
    # the drafter changed at every step, and each rollout used the previous step's result
    final = flat(engine.params["drafter"])
    chain = drafters + [final]
    assert all(not same_values(a, b) for a, b in zip(chain, chain[1:]))
    assert same_values(final, flat(engine.refresher.state))
    assert all(np.isfinite(np.asarray(x)).all() for x in final.values())
    # the per-step figures reached tunix's metrics buffers
    names = set().union(*(m.keys() for m in logged)) if logged else set()
    assert {"rollout/tau", "refresh/seconds", "refresh/temp_bytes"} <= names
