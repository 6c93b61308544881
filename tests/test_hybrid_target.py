"""Qwen3.5 hybrid targets (Gated DeltaNet + gated attention) against transformers: logits of a
multi-chunk prefill, greedy continuations of a batch of unequal prompts, both released
layouts, float32 and bfloat16."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import dominotree_jax as dj
from hybrid_models import build_multimodal, build_text


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen3_5_text")
    return str(d), build_text(str(d))


def test_logits_match_transformers_across_prefill_chunks(text_model):
    path, model = text_model
    target = dj.load_target(path, tokenizer=False)
    cfg = target.config
    assert cfg.is_hybrid and cfg.linear_layers == (0, 1, 3) and cfg.rotary_dim == 4
    toks = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 150))
    with torch.no_grad():
        ref = model(torch.tensor(toks)).logits.numpy()
    ours = np.asarray(dj.target_logits(target, toks))
    assert _rel(ours, ref) <= 1e-5

    # the chunked prefill (64-row chunks, the last one padded) gives the same last logits
    from dominotree_jax.model.target import bind_target, prefill
    lengths = jnp.asarray([150, 97])
    _, last = prefill(bind_target(cfg, target.params), jnp.asarray(toks), lengths, 160)
    assert _rel(np.asarray(last[0]), ref[0, 149]) <= 1e-5
    with torch.no_grad():
        ref_short = model(torch.tensor(toks[1:, :97])).logits.numpy()
    assert _rel(np.asarray(last[1]), ref_short[0, 96]) <= 1e-5


def test_greedy_ar_equals_transformers_generate_for_a_batch_of_unequal_prompts(text_model):
    path, model = text_model
    target = dj.load_target(path, tokenizer=False)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, 256, n) for n in (23, 9)]
    for p in prompts:
        with torch.no_grad():
            want = model.generate(torch.tensor(p[None]), max_new_tokens=12, do_sample=False,
                                  eos_token_id=None, pad_token_id=0)[0, len(p):].numpy()
        got = np.asarray(dj.generate(target, p, max_new_tokens=12, stop_ids=()))
        np.testing.assert_array_equal(got, want)
    batch = np.zeros((2, 23), np.int64)
    batch[0], batch[1, :9] = prompts[0], prompts[1]
    cfg = dj.DecodeConfig(target=target.config, method="ar", max_new_tokens=12)
    out = dj.decode({"target": target.params, "drafter": None}, jnp.asarray(batch),
                    config=cfg, prompt_lengths=jnp.asarray([23, 9]))
    for b, p in enumerate(prompts):
        single = np.asarray(dj.generate(target, p, max_new_tokens=12, stop_ids=()))
        np.testing.assert_array_equal(np.asarray(out.tokens[b, :12]), single)


def test_the_multimodal_release_loads_its_text_model_without_the_vision_tower(tmp_path):
    model = build_multimodal(str(tmp_path))
    target = dj.load_target(str(tmp_path), tokenizer=False)
    assert target.config.architecture == "Qwen3_5ForConditionalGeneration"
    from dominotree_jax.model.state import flat_names
    assert not any("visual" in k for k in flat_names(target.params))
    toks = np.random.default_rng(3).integers(0, 256, (1, 40))
    with torch.no_grad():
        ref = model(input_ids=torch.tensor(toks)).logits.numpy()
    assert _rel(np.asarray(dj.target_logits(target, toks)), ref) <= 1e-5


def test_bfloat16_weights_stay_close(tmp_path):
    model = build_text(str(tmp_path), dtype="bfloat16")
    target = dj.load_target(str(tmp_path), tokenizer=False, precision="bfloat16")
    toks = np.random.default_rng(4).integers(0, 256, (1, 70))
    with torch.no_grad():
        ref = model(torch.tensor(toks)).logits.numpy()
    # bf16 weights, float32 activations and states: stated bound
    assert _rel(np.asarray(dj.target_logits(target, toks)), ref) <= 2e-2


def test_every_new_parameter_declares_its_sharding():
    """Hybrid, expert and gpt-oss weights name their logical axes, so the sharding rules place
    them (a 4-way model axis splits the experts' units, the GDN channels stay whole)."""
    from jax.sharding import PartitionSpec as P

    from dominotree_jax.model.target import init_target_params
    from dominotree_jax.sharding import ShardingRules, flat_param_specs
    from spec_fixtures import tiny_pair
    for kw in (dict(hybrid=True, moe=True), dict(gpt_oss=True)):
        tcfg, _, params = tiny_pair(**kw)
        specs = flat_param_specs(init_target_params(tcfg), 4)
        assert specs["layers.0.mlp.experts.gate_proj"] == P(None, "model", None)
        if tcfg.is_hybrid:
            assert specs["layers.0.linear_attn.in_proj_qkv.weight"] == P()
            by_channel = flat_param_specs(params["target"], 2,
                                          ShardingRules(("heads", "kv_heads", "mlp",
                                                         "linear_channels")))
            assert by_channel["layers.0.linear_attn.in_proj_qkv.weight"] == P("model", None)
        else:
            assert specs["layers.0.self_attn.sinks"] == P("model")
