"""One of two processes joined by ``jax.distributed.initialize`` on 127.0.0.1 (gloo CPU
collectives, 2 host devices each), run by ``test_rl_multidevice.py``: a whole tunix
``RLCluster`` -- ``GRPOLearner``, the ``DominoTreeRollout`` engine and the actor trainer --
across both processes.

What runs where (docs/rl.md "Many devices, many hosts"): every role (actor, reference,
rollout) is on one ``data`` x ``model`` = 4 x 1 mesh over the 4 global devices, the
parameters replicated; each process runs the same learner over its own prompts (its half of
every step's batch). The engine decodes the global batch once (each process's rows on its
own devices) and hands each process its rows; rewards and group advantages are computed on
the host of the process whose rows they are; tunix's trainer assembles the global batch
(``make_array_from_process_local_data``) and the gradient is reduced over all 4 devices.

Check: after 2 GRPO steps of 2 iterations each (``beta`` 0.04: the reference model's KL
term is in the loss; the old policy's log-probs come from the engine) the policy of a
2-process ``MultiProcessRLCluster`` equals that of a single-process one (this process's first
device, run by process 0 after the 2-process run) given every prompt of every step, in process
order. tunix's own ``RLCluster`` fails this check (55 % of the weights differ:
``dominotree_jax/rollout/cluster.py``); ``--tunix-cluster`` runs it to show that.

Usage: ``rl_cluster_multiprocess_worker.py PROCESS_ID PORT [--tunix-cluster]``. Prints
``ok ...``; exits non-zero on a failure.
"""

from __future__ import annotations

import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402
from tunix.rl import rl_cluster as rl_cluster_lib  # noqa: E402
from tunix.rl.grpo import grpo_learner  # noqa: E402

from dominotree_jax.rollout import TunixCausalLM  # noqa: E402
from dominotree_jax.rollout.cluster import MultiProcessRLCluster  # noqa: E402
from dominotree_jax.sharding import make_mesh  # noqa: E402
from decode_helpers import FAST_XLA  # noqa: E402
from rl_cluster_fixture import one_mesh_cluster  # noqa: E402
from spec_fixtures import tiny_pair  # noqa: E402

PAD = 0
STEPS = [["3 17 5 9", "40 1", "5 12 40 2 2 7", "7"], ["9 9 1", "21 30 11", "60", "2 8 1 4"]]


def reward(prompts, completions, **kw):
    return [sum(int(t) for t in c.split()) / 256.0 for c in completions]


def train(tcfg, dcfg, params, mesh, steps, cluster_class) -> list[np.ndarray]:
    """2 GRPO global steps (2 iterations each: the old policy's log-probs from the engine)
    through ``cluster_class`` on ``mesh``; the trained policy's leaves."""
    engine_kw = dict(drafter_config=dcfg, method="dominotree", budget=6, node_topk=3,
                     compiler_options=FAST_XLA)
    policy = TunixCausalLM.from_params(tcfg, params["target"], PAD)
    reference = TunixCausalLM.from_params(tcfg, jax.tree.map(jnp.copy, params["target"]), PAD)
    cluster = one_mesh_cluster(cluster_class, policy, reference, mesh, params["drafter"],
                               engine_kw, new_tokens=4, seed=11)
    learner = grpo_learner.GRPOLearner(
        rl_cluster=cluster, reward_fns=reward,
        algo_config=grpo_learner.GRPOConfig(num_generations=2, num_iterations=2, beta=0.04))
    learner.train([{"prompts": np.array(p)} for p in steps])
    assert cluster.actor_trainer.train_steps == 4, cluster.actor_trainer.train_steps
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(cluster.actor_trainer.model.target))]


def main(process_id: int, port: int, cluster_class=MultiProcessRLCluster) -> int:
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=process_id)
    assert jax.process_count() == 2 and jax.device_count() == 4, jax.devices()
    tcfg, dcfg, params = tiny_pair()
    mesh = make_mesh(data=4, model=1)          # over the 4 global devices
    replicated = NamedSharding(mesh, P())
    gparams = jax.tree.map(lambda x: jax.make_array_from_callback(
        np.shape(x), replicated, lambda idx, x=np.asarray(x): x[idx]), params)
    half = len(STEPS[0]) // 2
    mine = [p[half * process_id: half * (process_id + 1)] for p in STEPS]
    got = train(tcfg, dcfg, gparams, mesh, mine, cluster_class)   # the policy, replicated
    start = [np.asarray(x) for x in jax.tree.leaves(params["target"])]
    assert any(not np.allclose(a, b) for a, b in zip(start, got)), "the policy did not move"
    if process_id == 0:   # the single-process reference: one device, every prompt
        local_mesh = make_mesh(data=1, model=1, devices=jax.local_devices()[:1])
        want = train(tcfg, dcfg, jax.device_put(params, NamedSharding(local_mesh, P())),
                     local_mesh, STEPS, cluster_class)
        for a, b in zip(want, got):
            np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-5)
        print(f"ok process 0: 2 GRPO steps of a 2-process {cluster_class.__name__} (its "
              f"{half} prompts a step, beta 0.04) equal one process given all of them",
              flush=True)
    else:
        print(f"ok process {process_id}: trained on its {half} prompts a step", flush=True)
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2]),
                  rl_cluster_lib.RLCluster if "--tunix-cluster" in sys.argv else
                  MultiProcessRLCluster))
