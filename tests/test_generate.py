"""Jitted autoregressive decode: token-identical to transformers' greedy generate."""

import jax
import numpy as np
import pytest
import torch

import dominotree_jax as dj
from hf_models import build_and_save


@pytest.mark.parametrize("name", ["qwen3_gqa_headdim", "llama_mqa_tied_sharded",
                                  "qwen2_bias_bf16"])
def test_greedy_matches_transformers_generate(name, tmp_path):
    model = build_and_save(name, str(tmp_path))
    target = dj.load_target(str(tmp_path))
    prompt = np.random.default_rng(0).integers(0, target.config.vocab_size, 23)
    model.generation_config.eos_token_id = None  # no stop: compare all 40 tokens
    with torch.no_grad():
        ref = model.generate(torch.tensor(prompt[None]), max_new_tokens=40, do_sample=False,
                             pad_token_id=0)[0, len(prompt):].numpy()
    assert len(ref) == 40
    ours = np.asarray(dj.generate(target, prompt, max_new_tokens=40, stop_ids=()))
    np.testing.assert_array_equal(ours, ref)


def test_stop_tokens_and_batches(tmp_path):
    build_and_save("llama_mqa_tied_sharded", str(tmp_path))
    target = dj.load_target(str(tmp_path))
    prompt = np.arange(1, 12)
    full = np.asarray(dj.generate(target, prompt, max_new_tokens=30, stop_ids=()))
    stop = int(full[7])
    first = int(np.argmax(full == stop))
    cut = np.asarray(dj.generate(target, prompt, max_new_tokens=30, stop_ids=(stop,)))
    np.testing.assert_array_equal(cut, full[:first + 1])
    batch = np.asarray(dj.generate(target, np.stack([prompt, prompt]), max_new_tokens=30,
                                   stop_ids=()))
    np.testing.assert_array_equal(batch[1], full)


def test_sampling_is_seeded_and_respects_top_k(tmp_path):
    build_and_save("llama_mqa_tied_sharded", str(tmp_path))
    target = dj.load_target(str(tmp_path))
    prompt = np.arange(1, 12)
    a = dj.generate(target, prompt, max_new_tokens=20, temperature=1.0,
                    key=jax.random.key(3), stop_ids=())
    b = dj.generate(target, prompt, max_new_tokens=20, temperature=1.0,
                    key=jax.random.key(3), stop_ids=())
    c = dj.generate(target, prompt, max_new_tokens=20, temperature=1.0,
                    key=jax.random.key(4), stop_ids=())
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    # top_k=1 is greedy whatever the temperature
    g = dj.generate(target, prompt, max_new_tokens=20, stop_ids=())
    k1 = dj.generate(target, prompt, max_new_tokens=20, temperature=2.0, top_k=1,
                     key=jax.random.key(5), stop_ids=())
    np.testing.assert_array_equal(g, k1)


def test_target_logits_shape_and_errors(tmp_path):
    build_and_save("qwen3_gqa_headdim", str(tmp_path))
    target = dj.load_target(str(tmp_path))
    assert dj.target_logits(target, np.zeros((2, 5), np.int32)).shape == (2, 5, 512)
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        dj.target_logits(target, np.zeros(5, np.int32))
    with pytest.raises(ValueError, match="needs an explicit PRNG key"):
        dj.generate(target, [1, 2], max_new_tokens=3, temperature=0.7)
