"""Tiny random target/drafter pairs and oracle drafters for speculative-decoding tests."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp

from dominotree_jax.config import DrafterConfig, LinearAttentionShape, MoeShape, TargetConfig
from dominotree_jax.model.drafter import Drafter, init_drafter_params
from dominotree_jax.model.target import init_target_params


# a Qwen3.5-style hybrid: Gated DeltaNet layers around one gated full-attention layer
HYBRID = dict(layer_types=("linear_attention", "full_attention", "linear_attention"),
              linear_attention=LinearAttentionShape(conv_kernel=4, num_key_heads=2,
                                                    num_value_heads=4, key_head_dim=8,
                                                    value_head_dim=8),
              attn_output_gate=True, partial_rotary_factor=0.5, norm_offset=1.0, qk_norm=True,
              architecture="Qwen3_5ForCausalLM")


# gpt-oss's mix: a 5-position sliding-window layer, then a full one; sinks, biases, experts
GPT_OSS = dict(layer_types=("sliding_attention", "full_attention"), sliding_window=5,
               attention_sinks=True, attention_bias=True, output_bias=True,
               moe=MoeShape(num_experts=6, top_k=2, intermediate=16, layers=(0, 1),
                            kind="gpt_oss"),
               rope_scaling=(("beta_fast", 32.0), ("beta_slow", 1.0), ("factor", 32.0),
                             ("original_max_position_embeddings", 64), ("rope_type", "yarn"),
                             ("truncate", False)),
               architecture="GptOssForCausalLM")


def tiny_pair(vocab=64, block_size=4, shift_label=True, domino=True, seed=0, layers=2,
              hybrid=False, moe=False, gpt_oss=False, dspark=False, dflash2=False):
    """``dspark``: the drafter is a DSpark one (a rank-8 Markov head and a confidence head with
    Markov features; no Domino head) with larger Markov weights, so the correction matters;
    ``dflash2``: a DFlash2 one (two-tap convolutions in groups of 8, a rank-8 selector over 6
    candidates) whose convolution and selector weights are large enough to change the draft;
    ``hybrid``: the target is a 3-layer ``HYBRID`` (linear, full, linear attention);
    ``moe``: its layers but the second are mixtures of 6 experts (top 2, a shared expert);
    ``gpt_oss``: a 2-layer ``GPT_OSS``."""
    layers = 3 if hybrid else layers
    extra = dict(HYBRID if hybrid else GPT_OSS if gpt_oss else {})
    if moe:
        extra["moe"] = MoeShape(num_experts=6, top_k=2, intermediate=16,
                                layers=tuple(i for i in range(layers) if i != 1),
                                shared_intermediate=24)
    tcfg = TargetConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=8, rope_theta=1e4, **extra)
    dcfg = DrafterConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, block_size=block_size, mask_token_id=vocab - 1,
                         num_target_layers=layers, target_layer_ids=(0, layers - 1),
                         shift_label=(shift_label or dspark) and not dflash2,
                         projector_type="domino" if domino and not (dspark or dflash2) else None,
                         gru_hidden_dim=16 if domino and not (dspark or dflash2) else 0,
                         emb_dim=8 if domino and not (dspark or dflash2) else 0,
                         markov_rank=8 if dspark else 0, confidence_head=dspark,
                         **(dict(conv_kernel=2, conv_group=8, selector_rank=8,
                                 selector_top_k=min(6, vocab)) if dflash2 else {}))
    tp = init_target_params(tcfg, seed)
    # larger weights than the default init so the target's distribution is far from uniform
    tp = jax.tree.map(lambda x: x * 6.0 if x.ndim == 2 else x, tp)
    dp = init_drafter_params(dcfg, seed + 1)
    if dspark:
        dp["markov_head"] = jax.tree.map(lambda x: x * 40.0, dp["markov_head"])
    if dflash2:
        keys = iter(jax.random.split(jax.random.key(seed + 7), 8))
        sel = dp["candidate_selector"]
        sel["successor_codebook"] = nnx_like(sel["successor_codebook"], 2.0, next(keys))
        sel["predecessor_codebook"] = nnx_like(sel["predecessor_codebook"], 1.0, next(keys))
        sel["hidden_projection"]["weight"] = nnx_like(sel["hidden_projection"]["weight"], 0.5,
                                                      next(keys))
        for layer in dp["layers"].values():
            for conv in (layer["attention_conv"], layer["mlp_conv"]):
                conv["kernel_projection"]["weight"] = nnx_like(
                    conv["kernel_projection"]["weight"], 0.3, next(keys))
                conv["base_kernel"] = nnx_like(conv["base_kernel"], 0.3, next(keys), 1.0)
    return tcfg, dcfg, {"target": tp, "drafter": dp}


def nnx_like(param, scale: float, key, mean: float = 0.0):
    """``param`` (an ``nnx`` variable) holding ``mean + scale · N(0, 1)`` values of its shape."""
    return param.replace(mean + scale * jax.random.normal(key, param[...].shape,
                                                          param[...].dtype))


@contextlib.contextmanager
def scripted_drafter(continuation, wrong: bool = False, sign_of=None):
    """Replace ``Drafter.draft`` so that depth ``d`` of a block at ``start`` strongly predicts
    ``continuation[start + 1 + d]`` (``continuation`` = prompt + AR output, absolute positions):
    an oracle. ``wrong=True`` gives the true token the lowest logit instead, so no draft (chain
    or any top-k child) is ever right. ``sign_of(drafter)``: +1 (oracle) or -1 (wrong) read
    from the drafter's own weights, so an update of them switches the compiled program."""
    seq = jnp.asarray(continuation, jnp.int32)
    original = Drafter.draft

    def draft(self, target, ctx, t0_B, start_B, head_rows_CH=None):
        z, base = original(self, target, ctx, t0_B, start_B, head_rows_CH)
        J, V = base.shape[1], base.shape[2]
        idx = jnp.clip(start_B[:, None] + 1 + jnp.arange(J)[None], 0, seq.shape[0] - 1)
        sign = sign_of(self) if sign_of is not None else -1.0 if wrong else 1.0
        return z, base * 0.01 + sign * 30.0 * jax.nn.one_hot(seq[idx], V)

    Drafter.draft = draft
    try:
        yield
    finally:
        Drafter.draft = original


def exact_joint(tcfg, target_params, prompt, n_tok: int = 3, temperature: float = 1.0):
    """``[V] * n_tok``: P(first ``n_tok`` tokens after ``prompt``) of the target at
    ``temperature``, by enumerating every prefix (one causal forward per prefix; float64
    products)."""
    import itertools

    import numpy as np

    from dominotree_jax.api import _plain_forward
    V = tcfg.vocab_size
    probs = np.zeros((V,) * n_tok)
    seqs = np.array(list(itertools.product(range(V), repeat=n_tok - 1)))
    toks = np.concatenate([np.tile(prompt, (len(seqs), 1)), seqs], axis=1)
    lp = np.asarray(jax.nn.log_softmax(
        _plain_forward(target_params, jnp.asarray(toks), tcfg) / temperature, -1), np.float64)
    T = len(prompt)
    for row, s in enumerate(seqs):
        p = 1.0
        for j in range(n_tok - 1):
            p *= np.exp(lp[row, T - 1 + j, s[j]])
        probs[tuple(s)] = p * np.exp(lp[row, T + n_tok - 2])
    return probs


def sampling_case(hybrid: bool = False, dspark: bool = False, dflash2: bool = False):
    """What the sampling tests draw against: ``(tcfg, dcfg, params, prompt, exact)``, a tiny
    pair with a 6-token vocabulary, the prompt ``[1, 4, 2]`` and the target's exact joint of the
    first three tokens after it (flattened, ``[V ** 3]``); ``dspark``: a DSpark drafter."""
    import numpy as np

    tcfg, dcfg, params = tiny_pair(vocab=6, block_size=4, seed=3, hybrid=hybrid, dspark=dspark,
                                   dflash2=dflash2)
    prompt = np.array([1, 4, 2])
    return tcfg, dcfg, params, prompt, exact_joint(tcfg, params["target"], prompt).reshape(-1)


def first_tokens_chi_square_p(tokens_BY, exact_joint, vocab: int) -> float:
    """Chi-square p-value of the first three tokens of every run against the exact joint
    distribution ``exact_joint [V, V, V]`` (cells expecting < 5 counts pooled into one)."""
    import numpy as np
    from scipy import stats

    toks = np.asarray(tokens_BY)
    cells = (toks[:, 0] * vocab + toks[:, 1]) * vocab + toks[:, 2]
    observed = np.bincount(cells, minlength=vocab ** 3)
    expected = np.asarray(exact_joint).reshape(-1) * len(toks)
    big = expected >= 5
    obs, exp = observed[big], expected[big]
    if (~big).any():
        obs, exp = np.append(obs, observed[~big].sum()), np.append(exp, expected[~big].sum())
    return stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


class IntTokenizer:
    """Token ids written as space-separated integers (tunix's encode/decode/*_id protocol);
    id 0 is both the end and the padding token."""

    def encode(self, text, **kw):
        return [int(t) for t in text.split()]

    def decode(self, ids, **kw):
        return " ".join(str(int(i)) for i in ids)

    def bos_id(self):
        return None

    def eos_id(self):
        return 0

    def pad_id(self):
        return 0
