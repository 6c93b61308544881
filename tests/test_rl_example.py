"""Fresh parameter values never recompile ``decode``; the RL rollout example runs and learns
with a single decode compilation."""

from __future__ import annotations

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax

from decode_helpers import FAST_XLA
from dominotree_jax import DecodeConfig, decode
from spec_fixtures import tiny_pair

EXAMPLE = pathlib.Path(__file__).parent.parent / "examples" / "rl_rollout.py"


def test_decode_traces_once_across_parameter_updates():
    tcfg, dcfg, params = tiny_pair()
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method="dominotree", max_new_tokens=8,
                       temperature=1.0, budget=6, node_topk=3, top_m=16, return_logprobs=True)
    traces = []

    def traced(params, prompt_BT, lengths_B, key, *, config):
        traces.append(config)
        return decode(params, prompt_BT, config=config, key=key, prompt_lengths=lengths_B)

    f = jax.jit(traced, static_argnames="config", compiler_options=FAST_XLA)
    prompt_BT = jnp.array([[3, 17, 5, 9], [40, 1, 0, 0]], jnp.int32)
    lengths_B = jnp.array([4, 2], jnp.int32)
    opt = optax.sgd(0.5)
    target, state = params["target"], opt.init(params["target"])
    logprobs = []
    for step in range(4):  # the first call, then 3 updated parameter sets
        out = f({"target": target, "drafter": params["drafter"]}, prompt_BT, lengths_B,
                jax.random.key(0), config=cfg)
        logprobs.append(np.asarray(out.logprobs))
        grads = jax.tree.map(lambda x: jnp.full_like(x, 0.1 * (step + 1)), target)
        updates, state = opt.update(grads, state, target)
        target = optax.apply_updates(target, updates)
    assert len(traces) == 1
    # the new values were really used (not baked into the program as constants)
    assert all(not np.array_equal(logprobs[0], lp) for lp in logprobs[1:])


def test_rl_example_runs_with_one_decode_compilation():
    spec = importlib.util.spec_from_file_location("rl_rollout", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    history = module.main(steps=4, verbose=False)  # 4 rollouts around 3 updates
    assert history["compilations"] == 1
    assert len(history["reward"]) == 4
    assert max(history["logprob_gap"]) < 1e-4  # rollout log-probs == teacher-forced ones


GRPO = pathlib.Path(__file__).parent.parent / "examples" / "grpo_smollm2.py"


def _load_grpo():
    spec = importlib.util.spec_from_file_location("grpo_smollm2", GRPO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_grpo_reward_and_advantages():
    grpo = _load_grpo()
    assert grpo.reward(" 68.", 30, 38) == 1.0
    assert grpo.reward("The answer is 68", 30, 38) == 1.0
    assert grpo.reward("6 8", 30, 38) == 0.0 and grpo.reward("", 1, 2) == 0.0
    adv = grpo.group_advantages(np.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]), 4)
    assert adv[0] > 0 > adv[1] and np.allclose(adv[4:], 0.0)
    np.testing.assert_allclose(adv[:4].sum(), 0.0, atol=1e-6)


def test_grpo_example_tiny_loop_compiles_once():
    """The GRPO example's loop on a tiny random model: rollouts through the tunix engine,
    policy updates, a drafter refreshed from rollout features; every program compiles once."""
    grpo = _load_grpo()
    res = grpo.main(model="tiny", steps=3, prompts=2, group=4, max_new=6, drafter="refresh",
                    refresh_every=2, verbose=False)
    rows = res["rows"]
    assert len(rows) == 3
    assert res["compiles"] == {"rollout": 1, "update": 1, "refresh": 1}
    assert max(r["logprob_gap"] for r in rows) < 1e-4   # rollout log-probs == teacher-forced
    assert all(r["tau"] >= 1.0 and r["tokens"] > 0 for r in rows)
    assert all(np.isfinite(r["drafter_loss"]) and r["chain_tau_current"] >= 1.0 for r in rows)
