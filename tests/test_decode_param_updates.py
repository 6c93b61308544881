"""Fresh parameter values never recompile ``decode``: an RL loop's updated policy runs the same
program, and the new values are really used."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from decode_helpers import FAST_XLA
from dominotree_jax import DecodeConfig, decode
from spec_fixtures import tiny_pair


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
