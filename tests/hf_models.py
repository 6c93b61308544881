"""Tiny random-init transformers models saved locally (no hub), for parity tests."""

from __future__ import annotations

import torch

# name -> (config class, model class, config kwargs, save kwargs)
BASE = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
            max_position_embeddings=4096)


def _qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM
    return Qwen3Config, Qwen3ForCausalLM


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaConfig, LlamaForCausalLM


def _qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    return Qwen2Config, Qwen2ForCausalLM


CONFIGS = {
    # GQA, head_dim != hidden/heads, untied, theta 1e6
    "qwen3_gqa_headdim": (_qwen3, dict(num_attention_heads=4, num_key_value_heads=2,
                                       head_dim=24, rope_theta=1e6, tie_word_embeddings=False),
                          {}),
    # MQA, tied, theta 1e4, sharded save
    "llama_mqa_tied_sharded": (_llama, dict(num_attention_heads=4, num_key_value_heads=1,
                                            rope_theta=1e4, tie_word_embeddings=True),
                               dict(max_shard_size="100KB")),
    # qkv bias, GQA, untied, bf16 save
    "qwen2_bias_bf16": (_qwen2, dict(num_attention_heads=4, num_key_value_heads=2,
                                     rope_theta=1e6, tie_word_embeddings=False),
                        dict(dtype="bfloat16")),
    # llama3 rope scaling
    "llama_rope_llama3": (_llama, dict(num_attention_heads=4, num_key_value_heads=2,
                                       rope_theta=5e5, rope_scaling=dict(
                                           rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                           high_freq_factor=4.0,
                                           original_max_position_embeddings=128)), {}),
    # yarn rope scaling, MQA, tied
    "qwen3_rope_yarn_mqa": (_qwen3, dict(num_attention_heads=4, num_key_value_heads=1,
                                         head_dim=16, rope_theta=1e6, tie_word_embeddings=True,
                                         rope_scaling=dict(rope_type="yarn", factor=4.0,
                                                           original_max_position_embeddings=256)),
                            {}),
}


def build_and_save(name: str, out_dir: str, seed: int = 0):
    """Create the named tiny model, save it with ``save_pretrained``; return the fp32 torch model
    whose weights equal what was saved (rounded to bf16 and back for bf16 saves)."""
    classes, kwargs, save = CONFIGS[name]
    cfg_cls, model_cls = classes()
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**BASE, **kwargs)).eval()
    with torch.no_grad():  # larger than default init so that errors are visible
        for p in model.parameters():
            if p.ndim == 2:
                p.normal_(0.0, 0.08)
            else:
                p.uniform_(0.5, 1.5)
    if save.get("dtype") == "bfloat16":
        rounded = {k: v.to(torch.bfloat16).to(torch.float32)
                   for k, v in model.named_parameters()}
        model.to(torch.bfloat16).save_pretrained(out_dir)
        # a fresh fp32 model with the rounded weights (casting back would also round the
        # rotary inv_freq buffer, which the checkpoint does not carry)
        model = model_cls(cfg_cls(**BASE, **kwargs)).eval()
        model.load_state_dict(rounded, strict=False)
    else:
        model.save_pretrained(out_dir, **{k: v for k, v in save.items() if k != "dtype"})
    return model
