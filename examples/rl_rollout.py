"""Policy-gradient RL with speculative rollouts: the target learns, the drafter stays frozen.

Each step rolls out a batch with ``decode`` (method "dominotree", temperature 1 — lossless, so
the samples are exactly the target's), scores them, and takes one GRPO-style step on the target:
advantages are rewards normalised within each group of samples of the same prompt, and the loss
is ``-mean(A * logp(tokens))`` with ``logp`` from a differentiable teacher-forced forward of the
target. The rollout's own log-probs (``return_logprobs=True``) are the "old policy" log-probs;
they are checked against the teacher-forced ones (they are the same numbers).

The jitted rollout takes the parameters as arguments, so fresh parameter values after every
update reuse the one compiled decode program: the script counts traces and prints it (1).

Toy task: a tiny random target (vocabulary 64) is rewarded by the fraction of generated tokens
in ``GOOD`` (ids 0..7, an eighth of the vocabulary).

    python examples/rl_rollout.py [--steps 30]
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dominotree_jax import DecodeConfig, decode
from dominotree_jax.config import DrafterConfig, TargetConfig
from dominotree_jax.model.cache import KVCache
from dominotree_jax.model.drafter import init_drafter_params
from dominotree_jax.model.target import bind_target, causal_mask, init_target_params
from dominotree_jax.sampling import sampling_logprobs

VOCAB, GOOD = 64, 8
PROMPTS, GROUP, MAX_NEW = 4, 8, 16   # 4 prompts x 8 samples = a batch of 32 rollouts


def tiny_models():
    """A 2-layer random target and a frozen random Domino drafter for it."""
    tcfg = TargetConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16)
    dcfg = DrafterConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, block_size=4, mask_token_id=VOCAB - 1, num_target_layers=2,
                         target_layer_ids=(0, 1), projector_type="domino", gru_hidden_dim=16,
                         emb_dim=16)
    target = jax.tree.map(lambda x: x * 4.0 if x.ndim == 2 else x, init_target_params(tcfg, 0))
    return tcfg, dcfg, target, init_drafter_params(dcfg, 1)


def rollout_batch(seed: int):
    """``[PROMPTS*GROUP, 8]`` right-padded prompts of 3..8 tokens, each repeated ``GROUP`` times."""
    rng = np.random.default_rng(seed)
    lengths_P = rng.integers(3, 9, PROMPTS)
    prompt_PT = np.where(np.arange(8)[None] < lengths_P[:, None],
                         rng.integers(GOOD, VOCAB - 1, (PROMPTS, 8)), 0)
    return (jnp.asarray(np.repeat(prompt_PT, GROUP, 0), jnp.int32),
            jnp.asarray(np.repeat(lengths_P, GROUP), jnp.int32))


def sequence_logprobs(target_params, tcfg, prompt_BT, lengths_B, tokens_BN, num_B):
    """``[B, N]`` log-probs (temperature 1) of the generated tokens under ``target_params`` from
    one causal forward over prompt + generated tokens (prompts right-padded; 0 past ``num``)."""
    B, T = prompt_BT.shape
    N = tokens_BN.shape[1]
    W = T + N
    j_W = jnp.arange(W)[None]
    gen_idx_BW = jnp.clip(j_W - lengths_B[:, None], 0, N - 1)
    seq_BW = jnp.where(j_W < lengths_B[:, None],
                       jnp.pad(prompt_BT, ((0, 0), (0, N))),
                       jnp.maximum(jnp.take_along_axis(tokens_BN, gen_idx_BW, 1), 0))
    model = bind_target(tcfg, target_params)
    cache = KVCache.zeros(tcfg.num_hidden_layers, B, W, tcfg.num_key_value_heads, tcfg.head_dim)
    out = model(seq_BW, jnp.broadcast_to(jnp.arange(W), (B, W)), causal_mask(B, W, W), cache,
                jnp.zeros((B,), jnp.int32))
    logp_BWV = sampling_logprobs(model.logits(out.hidden), 1.0)
    pred_idx_BN = lengths_B[:, None] - 1 + jnp.arange(N)[None]   # row predicting token n
    logp_BNV = jnp.take_along_axis(logp_BWV, pred_idx_BN[..., None], 1)
    logp_BN = jnp.take_along_axis(logp_BNV, jnp.maximum(tokens_BN, 0)[..., None], 2)[..., 0]
    return jnp.where(jnp.arange(N)[None] < num_B[:, None], logp_BN, 0.0)


def rewards(tokens_BN, num_B):
    """Fraction of generated tokens in ``GOOD``."""
    valid = jnp.arange(tokens_BN.shape[1])[None] < num_B[:, None]
    good = valid & (tokens_BN >= 0) & (tokens_BN < GOOD)
    return good.sum(1) / jnp.maximum(num_B, 1)


def main(steps: int = 30, lr: float = 3e-3, verbose: bool = True) -> dict:
    tcfg, dcfg, target, drafter = tiny_models()
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method="dominotree", max_new_tokens=MAX_NEW,
                       temperature=1.0, budget=8, node_topk=4, top_m=16, return_logprobs=True)
    traces = []

    def traced_decode(params, prompt_BT, lengths_B, key, *, config):
        traces.append(config)  # runs once per trace, never per call
        return decode(params, prompt_BT, config=config, key=key, prompt_lengths=lengths_B)

    rollout = jax.jit(traced_decode, static_argnames="config")
    opt = optax.adam(lr)
    opt_state = opt.init(target)

    @jax.jit
    def update(target, opt_state, prompt_BT, lengths_B, out):
        r_B = rewards(out.tokens, out.num_tokens)
        r_PG = r_B.reshape(PROMPTS, GROUP)
        adv_B = ((r_PG - r_PG.mean(1, keepdims=True)) / (r_PG.std(1, keepdims=True) + 1e-4)
                 ).reshape(-1)

        def loss_fn(target):
            logp_BN = sequence_logprobs(target, tcfg, prompt_BT, lengths_B, out.tokens,
                                        out.num_tokens)
            ratio_BN = jnp.exp(logp_BN - out.logprobs)  # == 1 on policy; gradient = d logp
            per_row = (ratio_BN * adv_B[:, None]).sum(1) / jnp.maximum(out.num_tokens, 1)
            return -per_row.mean(), logp_BN

        (loss, logp_BN), grads = jax.value_and_grad(loss_fn, has_aux=True)(target)
        updates, opt_state = opt.update(grads, opt_state, target)
        gap = jnp.abs(logp_BN - out.logprobs).max()
        return optax.apply_updates(target, updates), opt_state, loss, r_B.mean(), gap

    key = jax.random.key(0)
    history = {"reward": [], "rollout_s": [], "update_s": [], "logprob_gap": [], "tau": []}
    for step in range(steps):
        prompt_BT, lengths_B = rollout_batch(step)
        key, sub = jax.random.split(key)
        t0 = time.perf_counter()
        out = rollout({"target": target, "drafter": drafter}, prompt_BT, lengths_B, sub,
                      config=cfg)
        jax.block_until_ready(out)
        t1 = time.perf_counter()
        target, opt_state, loss, reward, gap = update(target, opt_state, prompt_BT, lengths_B,
                                                      out)
        jax.block_until_ready(target)
        t2 = time.perf_counter()
        tau = float(out.mean_tau())
        for name, v in zip(history, (reward, t1 - t0, t2 - t1, gap, tau)):
            history[name].append(float(v))
        if verbose:
            print(f"step {step:3d}  rollout {1e3 * (t1 - t0):7.1f} ms  update "
                  f"{1e3 * (t2 - t1):7.1f} ms  mean reward {float(reward):.3f}  "
                  f"mean tau {tau:.2f}  |logp gap| {float(gap):.1e}  "
                  f"decode compilations {len(traces)}")
    history["compilations"] = len(traces)
    if verbose:
        print(f"decode compilations: {len(traces)}; reward {history['reward'][0]:.3f} -> "
              f"{np.mean(history['reward'][-5:]):.3f} (mean of the last 5 steps)")
    return history


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()
    main(args.steps, args.lr)
