"""A tiny random target and its greedy answers to random prompts, stored as shards: the data
the trainer, the campaign and the mesh tests train on."""

from __future__ import annotations

import numpy as np

import dominotree_jax as dj
from dominotree_jax.config import DrafterConfig, LinearAttentionShape, TargetConfig
from dominotree_jax.model.target import init_target_params
from dominotree_jax.train.data.generate import generate_answers
from dominotree_jax.train.data.shards import ShardStore

TCFG = TargetConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    rope_theta=10000.0, architecture="LlamaForCausalLM")
TAPS = (0, 1)
DCFG = DrafterConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, block_size=4,
                     mask_token_id=127, num_target_layers=3, target_layer_ids=TAPS,
                     rope_theta=10000.0, shift_label=True, projector_type="domino",
                     gru_hidden_dim=16, emb_dim=16, pure_draft_prefix_len=1)


# a Qwen3.5-style hybrid of TCFG's shapes: Gated DeltaNet, gated attention, Gated DeltaNet
HYBRID_TCFG = TargetConfig(
    vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=10000.0,
    qk_norm=True, architecture="Qwen3_5ForCausalLM",
    layer_types=("linear_attention", "full_attention", "linear_attention"),
    linear_attention=LinearAttentionShape(conv_kernel=4, num_key_heads=2, num_value_heads=4,
                                          key_head_dim=8, value_head_dim=8),
    attn_output_gate=True, partial_rotary_factor=0.5, norm_offset=1.0)


def tiny_target_and_answers(data_dir: str, prompts: int = 24, tcfg: TargetConfig = TCFG):
    """``(target, store, stats)``: a sharpened random ``tcfg`` target (greedy continuations are
    not constant) and a shard store in ``data_dir`` holding its answers to ``prompts`` random
    prompts (20 new tokens each, batches of 8)."""
    params = init_target_params(tcfg, seed=0)
    params["embed_tokens"]["weight"][...] = params["embed_tokens"]["weight"][...] * 50.0
    target = dj.Target(tcfg, params, None)
    rng = np.random.default_rng(0)
    items = [(list(rng.integers(1, 120, size=int(rng.integers(4, 20)))), "test")
             for _ in range(prompts)]
    store = ShardStore(data_dir, vocab_size=tcfg.vocab_size)
    stats = generate_answers(target, store, items, batch=8, max_new=20, seed=0,
                             log=lambda m: None)
    return target, store, stats
