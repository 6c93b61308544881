"""The target decoder against transformers on tiny random models saved locally (no hub)."""

import numpy as np
import pytest
import torch

import dominotree_jax as dj
from hf_models import CONFIGS, build_and_save

T = 544  # >= 512 tokens


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def saved(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    model = build_and_save(request.param, str(d))
    return request.param, str(d), model


def test_logits_and_hidden_states_match_transformers(saved):
    name, path, model = saved
    target = dj.load_target(path)
    cfg = target.config
    toks = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, T))
    with torch.no_grad():
        ref = model(torch.tensor(toks), output_hidden_states=True)
    ours = np.asarray(dj.target_logits(target, toks))
    assert ours.shape == (2, T, cfg.vocab_size) and ours.dtype == np.float32
    assert _rel(ours, ref.logits.numpy()) <= 1e-5, name

    # tapped residual-stream outputs, HF convention hidden_states[i + 1]
    from dominotree_jax.model.target import bind_target, causal_mask
    from dominotree_jax.model.cache import KVCache
    import jax.numpy as jnp
    taps = tuple(range(cfg.num_hidden_layers))
    out = bind_target(cfg, target.params)(
        jnp.asarray(toks), jnp.broadcast_to(jnp.arange(T), (2, T)), causal_mask(2, T, T),
        KVCache.zeros(cfg.num_hidden_layers, 2, T, cfg.num_key_value_heads, cfg.head_dim),
        jnp.zeros(2, jnp.int32), tap_layers=taps)
    H = cfg.hidden_size
    for i in taps:
        got = np.asarray(out.taps[..., i * H:(i + 1) * H])
        assert _rel(got, ref.hidden_states[i + 1].numpy()) <= 1e-5, (name, i)


def test_config_fields_are_read(saved):
    name, path, model = saved
    cfg = dj.load_target(path, tokenizer=False).config
    hf = model.config
    assert cfg.num_key_value_heads == hf.num_key_value_heads
    assert cfg.head_dim == getattr(hf, "head_dim", hf.hidden_size // hf.num_attention_heads)
    assert cfg.tie_word_embeddings == hf.tie_word_embeddings
    assert cfg.qk_norm == name.startswith("qwen3")
    assert cfg.attention_bias == name.startswith("qwen2")
    if "rope_" in name:
        assert cfg.rope_type == name.split("rope_")[1].split("_")[0]
