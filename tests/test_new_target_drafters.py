"""DFlash drafters for today's targets, written in the released drafter layout (block 16, the
mask token, ``target_layer_ids`` over the target's layers, sliding-window and full drafter
layers) at tiny size, load beside Qwen3.5, Qwen3-Next and gpt-oss targets (transformers'
layouts) and decode exactly like ``ar``; unsupported targets are refused by name."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

import dominotree_jax as dj
from dominotree_jax.config import ConfigError, DrafterConfig, TargetConfig
from dominotree_jax.model.drafter import drafter_graphdef

import released_layouts as rl
from hybrid_models import build_gpt_oss, build_qwen3_next, build_text

BUILDERS = {"qwen3_5": build_text, "qwen3_next": build_qwen3_next, "gpt_oss": build_gpt_oss}


def released_drafter_config(target_cfg: TargetConfig) -> dict:
    """The DFlash drafter ``config.json`` as released for a Qwen3.5 / gpt-oss target, at the
    target's width: five taps spread over its layers, a sliding-window layer beside a full one,
    block 16, the mask token the last vocabulary id."""
    cfg = copy.deepcopy(rl.dflash_config("tiny"))
    L = target_cfg.num_hidden_layers
    cfg.update(vocab_size=target_cfg.vocab_size, hidden_size=target_cfg.hidden_size,
               intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, num_target_layers=L, block_size=16,
               layer_types=["sliding_attention", "full_attention"], use_sliding_window=True,
               sliding_window=6, max_window_layers=1)
    cfg["dflash_config"] = {"mask_token_id": target_cfg.vocab_size - 1,
                            "target_layer_ids": [0, L // 2, L - 1]}
    return cfg


@pytest.mark.parametrize("arch", sorted(BUILDERS))
def test_released_drafter_layout_loads_and_decodes_like_ar(tmp_path, arch):
    tdir, ddir = tmp_path / "target", tmp_path / "drafter"
    BUILDERS[arch](str(tdir))
    tcfg = dj.load_target(str(tdir), tokenizer=False).config
    cfg = released_drafter_config(tcfg)
    dcfg = DrafterConfig.from_hf_dict(cfg)
    assert dcfg.block_size == 16 and dcfg.layer_window(0) == 6 and dcfg.layer_window(1) is None
    _, abstract = drafter_graphdef(dcfg, "float32")
    rl._write(str(ddir), cfg, rl._random_tensors(abstract, 3))
    pair = dj.load_pair(str(tdir), str(ddir))
    prompt = np.random.default_rng(0).integers(0, 200, 13)
    ref = dj.decode(pair.params | {"drafter": None}, prompt,
                    config=pair.config("ar", max_new_tokens=16, stop_ids=()))
    out = dj.decode(pair.params, prompt, config=pair.config("ddtree", max_new_tokens=16,
                                                            stop_ids=(), budget=8))
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))


@pytest.mark.parametrize("arch,why", [("DeepseekV3ForCausalLM", "MLA"),
                                      ("KimiK25ForConditionalGeneration", "MLA"),
                                      ("FancyNewForCausalLM", "supported:")])
def test_unsupported_targets_are_refused_by_name_before_loading(tmp_path, arch, why):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": [arch]}))
    with pytest.raises(ConfigError, match=why) as e:
        dj.load_target(str(tmp_path), tokenizer=False)
    assert arch in str(e.value)


@pytest.mark.parametrize("edit,why", [
    (dict(linear_num_value_heads=3), "not a multiple of linear_num_key_heads"),
    (dict(linear_key_head_dim=0), "linear_key_head_dim=0"),
    (dict(layer_types=["linear_attention"] * 3), "layer_types has 3 entries"),
    (dict(layer_types=["mamba"] * 4), "unsupported target layer type"),
])
def test_bad_hybrid_configs_are_refused_by_name(edit, why):
    from hybrid_models import TEXT
    cfg = {**TEXT, "architectures": ["Qwen3_5ForCausalLM"], **edit}
    with pytest.raises(ConfigError, match=why):
        TargetConfig.from_hf_dict(cfg)


def test_bad_moe_configs_are_refused_by_name():
    base = {"architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 64, "hidden_size": 32,
            "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}
    assert TargetConfig.from_hf_dict(base).moe.layers == (0, 1)
    with pytest.raises(ConfigError, match="exceeds num_experts"):
        TargetConfig.from_hf_dict({**base, "num_experts_per_tok": 5})
    with pytest.raises(ConfigError, match="lacks moe_intermediate_size"):
        TargetConfig.from_hf_dict({k: v for k, v in base.items()
                                   if k != "moe_intermediate_size"})
