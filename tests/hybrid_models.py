"""Tiny random-init transformers Qwen3.5 hybrids (Gated DeltaNet + gated attention) saved
locally in the released layouts, for parity and decoding tests."""

from __future__ import annotations

import torch

TEXT = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
            linear_num_key_heads=2, linear_num_value_heads=4, max_position_embeddings=4096,
            rope_parameters=dict(rope_type="default", rope_theta=1e4,
                                 partial_rotary_factor=0.25),
            layer_types=["linear_attention", "linear_attention", "full_attention",
                         "linear_attention"])


def _randomise(model, seed: int):
    """Weights large enough that errors show; decays (A_log, dt_bias) in a realistic range."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.uniform_(-1.0, 1.0)
            elif name.endswith("dt_bias"):
                p.uniform_(-1.0, 1.0)
            elif p.ndim >= 2:
                p.normal_(0.0, 0.1 if "conv1d" in name else 0.08)
            else:
                p.uniform_(-0.3, 0.3)   # zero-centred norms: scale 1 + w
    return model


def build_text(out_dir: str, seed: int = 0, tie: bool = False, dtype=None):
    """A ``Qwen3_5ForCausalLM`` saved to ``out_dir``; returns the float32 torch model."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    cfg = Qwen3_5TextConfig(**TEXT, tie_word_embeddings=tie)
    model = _randomise(Qwen3_5ForCausalLM(cfg).eval(), seed)
    if dtype == "bfloat16":
        rounded = {k: v.to(torch.bfloat16).to(torch.float32)
                   for k, v in model.state_dict().items()}
        model.to(torch.bfloat16).save_pretrained(out_dir)
        model = Qwen3_5ForCausalLM(cfg).eval()
        model.load_state_dict(rounded, strict=False)
    else:
        model.save_pretrained(out_dir)
    return model


def build_multimodal(out_dir: str, seed: int = 0):
    """A ``Qwen3_5ForConditionalGeneration`` (the released layout: the text model under
    ``model.language_model``, a vision tower beside it) saved to ``out_dir``; returns it."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
    cfg = Qwen3_5Config(text_config=dict(TEXT), vision_config=dict(
        depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
        patch_size=4, temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16),
        tie_word_embeddings=False)
    model = _randomise(Qwen3_5ForConditionalGeneration(cfg).eval(), seed)
    model.save_pretrained(out_dir)
    return model


MOE = dict(num_experts=6, num_experts_per_tok=2, moe_intermediate_size=32)


def build_qwen3_moe(out_dir: str, seed: int = 0):
    """A ``Qwen3MoeForCausalLM`` (layer 1 dense through ``mlp_only_layers``) saved to
    ``out_dir``; returns it."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    cfg = Qwen3MoeConfig(vocab_size=256, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, rope_theta=1e6, norm_topk_prob=True, mlp_only_layers=[1],
                         tie_word_embeddings=False, **MOE)
    model = _randomise(Qwen3MoeForCausalLM(cfg).eval(), seed)
    model.save_pretrained(out_dir)
    return model


def build_qwen3_next(out_dir: str, seed: int = 0):
    """A ``Qwen3NextForCausalLM`` (fused per-key-head GDN projections, MoE with a shared
    expert, the last layer dense) saved to ``out_dir``; returns it."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    text = {k: v for k, v in TEXT.items()}
    cfg = Qwen3NextConfig(**text, shared_expert_intermediate_size=48, decoder_sparse_step=1,
                          mlp_only_layers=[3], norm_topk_prob=True, **MOE)
    model = _randomise(Qwen3NextForCausalLM(cfg).eval(), seed)
    model.save_pretrained(out_dir)
    return model


def build_qwen3_5_moe(out_dir: str, seed: int = 0):
    """A ``Qwen3_5MoeForConditionalGeneration`` (every layer sparse, a shared expert, the text
    model under ``model.language_model``) saved to ``out_dir``; returns it."""
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration
    text = {k: v for k, v in TEXT.items() if k != "intermediate_size"}
    cfg = Qwen3_5MoeConfig(text_config=dict(text, shared_expert_intermediate_size=48, **MOE),
                           vision_config=dict(depth=1, hidden_size=32, intermediate_size=64,
                                              num_heads=2, out_hidden_size=64, patch_size=4,
                                              temporal_patch_size=2, spatial_merge_size=2,
                                              num_position_embeddings=16),
                           tie_word_embeddings=False)
    model = _randomise(Qwen3_5MoeForConditionalGeneration(cfg).eval(), seed)
    model.save_pretrained(out_dir)
    return model


def build_gpt_oss(out_dir: str, seed: int = 0):
    """A ``GptOssForCausalLM`` (sliding-window and full layers, sinks, YaRN, biased clamped
    experts) saved unquantised to ``out_dir``; returns it."""
    from transformers import GptOssConfig, GptOssForCausalLM
    cfg = GptOssConfig(vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       num_local_experts=6, num_experts_per_tok=2, sliding_window=8,
                       max_position_embeddings=4096,
                       rope_parameters=dict(rope_type="yarn", rope_theta=150000.0, factor=32.0,
                                            beta_fast=32.0, beta_slow=1.0, truncate=False,
                                            original_max_position_embeddings=128))
    model = _randomise(GptOssForCausalLM(cfg).eval(), seed)
    model.save_pretrained(out_dir)
    return model
