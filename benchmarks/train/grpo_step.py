"""Where a GRPO step's training time goes on the real SmolLM2-135M, at the example's shape.

tunix's trainer work per step of ``examples/grpo_smollm2.py`` (16 rollouts: prompts
left-padded to 64, completions right-padded to 48): the reference model's per-token log-probs
(``common.compute_per_token_logps``, a forward), the GRPO loss's value and gradient through
the policy (``algo_core.grpo_loss_fn``, forward + backward), and the optimizer update (clip +
AdamW). Each is jitted alone, with the policy/reference being ``TunixCausalLM`` as in the
example, and timed after a compiling call; XLA's own FLOP count of each program is printed next
to it, and the achieved GFLOP/s of plain float32 matmuls at the model's shapes (the rate the
FLOPs could at best run at on this CPU).

    python -m benchmarks train grpo_step [--reps 3] [--batch 16]
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from benchmarks.common import ROOT


def timed(f, *args, reps: int):
    jax.block_until_ready(f(*args))   # warm
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        times.append(time.perf_counter() - t0)
    return times


def compiled_with_flops(jitted, *args):
    """``(compiled program, XLA's FLOP count of it, compile seconds)``."""
    t0 = time.perf_counter()
    compiled = jitted.lower(*args).compile()
    seconds = time.perf_counter() - t0
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return compiled, float(cost.get("flops", float("nan"))) if cost else float("nan"), seconds


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--only", default="", help="run only the phases whose name contains this")
    args = ap.parse_args(argv)
    run(args.reps, args.batch, only=args.only)


def run(reps: int = 3, batch: int = 16, prompt_width: int = 64, max_new: int = 48,
        only: str = "") -> dict:
    import importlib.util
    from tunix.rl import algo_core, common
    from tunix.rl.grpo import grpo_learner

    from dominotree_jax.rollout import TunixCausalLM

    spec = importlib.util.spec_from_file_location(
        "grpo_smollm2", ROOT / "examples" / "grpo_smollm2.py")
    grpo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(grpo)
    task = grpo.Task("smollm2")
    pad, eos = task.pad_id, task.stop_ids[0]
    texts = next(grpo.batches(0, 1, batch, task.as_prompt))["prompts"]
    rng = np.random.default_rng(0)
    prompt_BT = np.full((batch, prompt_width), pad, np.int32)
    for b, t in enumerate(texts):
        ids = task.tokenizer.encode(str(t))[-prompt_width:]
        prompt_BT[b, prompt_width - len(ids):] = ids   # left-padded, as tunix hands them over
    completion_BY = rng.integers(100, 40000, (batch, max_new)).astype(np.int32)
    lens_B = rng.integers(max_new // 4, max_new + 1, batch)
    mask_BY = (np.arange(max_new)[None] < lens_B[:, None]).astype(np.int32)
    completion_BY = np.where(mask_BY > 0, completion_BY, pad).astype(np.int32)
    prompt_BT, completion_BY, mask_BY = map(jnp.asarray, (prompt_BT, completion_BY, mask_BY))

    policy = TunixCausalLM.from_params(task.tcfg, task.tparams, pad)
    graphdef, state = nnx.split(policy)
    n_params = sum(x.size for x in jax.tree.leaves(state))
    tokens = batch * (prompt_width + max_new)
    cfg = grpo_learner.GRPOConfig(num_generations=4, num_iterations=1, beta=0.04)
    cfg.temperature = 0.9
    out = {"params": int(n_params), "tokens": tokens, "batch": batch,
           "shape": [prompt_width, max_new], "six_n_d_tflop": 6 * n_params * tokens / 1e12}

    # plain matmul rate at the model's shapes (float32)
    a = jnp.ones((tokens, task.tcfg.hidden_size), jnp.float32)
    for name, cols in (("mlp", task.tcfg.intermediate_size), ("vocab", task.tcfg.vocab_size)):
        w = jnp.ones((task.tcfg.hidden_size, cols), jnp.float32)
        mm = jax.jit(lambda a, w: a @ w)
        t = min(timed(mm, a, w, reps=reps))
        out[f"matmul_{name}_gflops"] = 2 * tokens * task.tcfg.hidden_size * cols / t / 1e9

    def ref_logps(state, p, c):
        return common.compute_per_token_logps(graphdef, state, p, c, pad, eos,
                                              temperature=0.9)

    def loss(state, p, c, m):
        example = common.TrainExample(
            prompt_ids=p, prompt_mask=(p != pad).astype(jnp.int32), completion_ids=c,
            completion_mask=m, advantages=jnp.linspace(-1.0, 1.0, batch),
            ref_per_token_logps=jnp.zeros(c.shape, jnp.float32), old_per_token_logps=None)
        value, _ = algo_core.grpo_loss_fn(nnx.merge(graphdef, state), example, cfg, pad, eos)
        return value

    opt = optax.chain(optax.clip_by_global_norm(1.0),
                      optax.adamw(3e-5, b1=0.9, b2=0.99, weight_decay=0.0))
    params = nnx.state(policy, nnx.Param)
    opt_state = opt.init(params)

    def update(params, opt_state, grads):
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    phases = {
        "reference_logps (forward)": (jax.jit(ref_logps), (state, prompt_BT, completion_BY)),
        "grpo_loss value_and_grad": (jax.jit(jax.value_and_grad(loss)),
                                     (state, prompt_BT, completion_BY, mask_BY)),
        "optimizer update": (jax.jit(update), (params, opt_state,
                                               jax.tree.map(jnp.ones_like, params))),
    }
    for name, (f, args) in phases.items():
        if only and only not in name:
            continue
        compiled, fl, compile_s = compiled_with_flops(f, *args)
        t = timed(compiled, *args, reps=reps)
        out[name] = {"seconds": t, "median_s": float(np.median(t)), "compile_s": compile_s,
                     "xla_tflop": fl / 1e12, "gflops_achieved": fl / float(np.median(t)) / 1e9}
        print(name, out[name], flush=True)
    print(json.dumps(out, indent=1))
    return out
