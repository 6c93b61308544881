"""Checkpoint directories in the layouts of the released Qwen3 targets and DFlash / Domino
drafters, ``config.json`` key for key, with small random weights (or none: config only).

Sizes: ``SIZES["4B"]`` / ``SIZES["8B"]`` are the released numbers (used config-only, checked
abstractly); ``SIZES["tiny"]`` keeps every structural quirk (heads x head_dim != hidden, a mask
id beyond the base vocabulary, five drafter layers tapping a deeper target) at a size that runs
in milliseconds.
"""

from __future__ import annotations

import copy
import json
import os

import numpy as np

from convert.safetensors_io import write_safetensors
from dominotree_jax.config import DrafterConfig, TargetConfig
from dominotree_jax.model.drafter import drafter_graphdef
from dominotree_jax.model.state import flat_names
from dominotree_jax.model.target import target_graphdef

SIZES = {
    # vocab, base vocab (mask id), hidden, intermediate, target layers, heads, kv, head_dim,
    # drafter intermediate, tied target, drafter layers, taps, block, gru, emb
    "4B": dict(vocab=151936, mask=151669, hidden=2560, inter=9728, layers=36, heads=32, kv=8,
               head_dim=128, d_inter=9728, tied=True, d_layers=5, taps=[1, 9, 17, 25, 33],
               block=16, gru=1024, emb=256),
    "8B": dict(vocab=151936, mask=151669, hidden=4096, inter=12288, layers=36, heads=32, kv=8,
               head_dim=128, d_inter=12288, tied=False, d_layers=5, taps=[1, 9, 17, 25, 33],
               block=16, gru=1024, emb=256),
    # 9 target layers: the released tap rule round(1 + i*(L-4)/(n-1)) gives [1, 2, 4, 5, 6]
    "tiny": dict(vocab=160, mask=151, hidden=32, inter=48, layers=9, heads=4, kv=2,
                 head_dim=16, d_inter=48, tied=True, d_layers=5, taps=[1, 3, 4, 6, 8],
                 block=4, gru=16, emb=8),
}


def qwen3_target_config(size: str, rope_parameters: bool = False) -> dict:
    """A Qwen3 target ``config.json`` as released (``rope_parameters``: the newer form)."""
    s = SIZES[size]
    cfg = {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
        "head_dim": s["head_dim"], "hidden_act": "silu", "hidden_size": s["hidden"],
        "initializer_range": 0.02, "intermediate_size": s["inter"],
        "max_position_embeddings": 40960, "max_window_layers": s["layers"],
        "model_type": "qwen3", "num_attention_heads": s["heads"],
        "num_hidden_layers": s["layers"], "num_key_value_heads": s["kv"],
        "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": s["tied"], "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False,
        "vocab_size": s["vocab"],
    }
    if rope_parameters:
        del cfg["rope_scaling"], cfg["rope_theta"]
        cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 1000000}
    return cfg


def dflash_config(size: str) -> dict:
    """The older DFlash drafter ``config.json`` (Qwen3-4B-DFlash-b16 layout)."""
    s = SIZES[size]
    return {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False, "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": s["block"],
        "bos_token_id": 151643,
        "dflash_config": {"mask_token_id": s["mask"], "target_layer_ids": list(s["taps"])},
        "dtype": "bfloat16", "eos_token_id": 151645,
        "head_dim": s["head_dim"], "hidden_act": "silu", "hidden_size": s["hidden"],
        "initializer_range": 0.02, "intermediate_size": s["d_inter"],
        "layer_types": ["full_attention"] * s["d_layers"],
        "max_position_embeddings": 40960, "max_window_layers": s["d_layers"],
        "model_type": "qwen3", "num_attention_heads": s["heads"],
        "num_hidden_layers": s["d_layers"], "num_key_value_heads": s["kv"],
        "num_target_layers": s["layers"], "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
        "transformers_version": "4.57.1", "use_cache": True, "use_sliding_window": False,
        "vocab_size": s["vocab"],
    }


def domino_config(size: str) -> dict:
    """The Domino drafter ``config.json`` (Qwen3-8B-Domino-b16 training config)."""
    s = SIZES[size]
    cfg = dflash_config(size)
    cfg["dflash_config"].update(projector_type="domino", pure_draft_prefix_len=1,
                                emb_dim=s["emb"], gru_hidden_dim=s["gru"], shift_label=True)
    cfg["emb_dim"] = s["emb"]
    return cfg


def dspark_config(size: str) -> dict:
    """A DSpark drafter ``config.json`` in DeepSpec's layout (``Qwen3DSparkModel``, block 7 at
    the released sizes): the target's config with the drafter's fields at the top level."""
    s = SIZES[size]
    cfg = qwen3_target_config(size)
    cfg.update(architectures=["Qwen3DSparkModel"], num_target_layers=s["layers"],
               num_hidden_layers=s["d_layers"], intermediate_size=s["d_inter"],
               block_size=s["block"] if size == "tiny" else 7, tie_word_embeddings=False,
               layer_types=["full_attention"] * s["d_layers"], mask_token_id=s["mask"],
               target_layer_ids=list(s["taps"]), num_anchors=512, enable_confidence_head=True,
               confidence_head_with_markov=True, markov_rank=s["emb"],
               markov_head_type="vanilla")
    return cfg


def dspark_gated_markov(cfg):
    cfg["markov_head_type"] = "gated"


def dspark_speculators(cfg):
    cfg["speculators_model_type"] = "dspark"


def _variant(edit):
    def make(size):
        base = {"domino": domino_config, "dspark": dspark_config,
                "dflash2": dflash2_config}.get(
            edit.__name__.split("_")[0], dflash_config)
        cfg = copy.deepcopy(base(size))
        edit(cfg)
        return cfg
    return make


def _pop(d, *keys):
    for k in keys:
        d.pop(k)


def domino_block_in_dflash_config(cfg):
    cfg["dflash_config"]["block_size"] = cfg.pop("block_size")


def domino_emb_dim_top_level_only(cfg):
    cfg["dflash_config"].pop("emb_dim")


def domino_causal_v5(cfg):
    cfg["dflash_config"]["projector_type"] = "causal_v5"


def dflash_taps_absent(cfg):
    cfg["dflash_config"].pop("target_layer_ids")


def dflash_rope_parameters(cfg):
    _pop(cfg, "rope_theta", "rope_scaling")
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": 1000000}


def dflash_sliding_window(cfg):
    """Newer layout: sliding layers (``sliding_window`` below the tiny prompts' length)."""
    n = cfg["num_hidden_layers"]
    cfg.update(use_sliding_window=True, sliding_window=6,
               layer_types=["sliding_attention"] * (n - 1) + ["full_attention"])


def dflash2_config(size: str) -> dict:
    """A DFlash2 drafter ``config.json`` (NeMo Automodel's ``DFlash2DraftModel``): DFlash's
    fields with the convolution's and selector's in ``dflash_config``."""
    cfg = dflash_config(size)
    cfg["architectures"] = ["DFlash2DraftModel"]
    cfg["is_causal"] = False
    cfg["dflash_config"].update(conv_kernel_size=2, conv_group_size=16, selector_rank=s_rank(size),
                                selector_top_k=16)
    return cfg


def s_rank(size: str) -> int:
    return 8 if size == "tiny" else 256


def dflash2_output_multiplier(cfg):
    cfg["output_multiplier"] = 0.5


def domino_unknown_projector(cfg):
    cfg["dflash_config"]["projector_type"] = "mlp_v9"


# name -> (config.json writer, tensor-name edit). The first entries all describe the same
# drafter as their base layout, only written differently.
DRAFTER_VARIANTS = {
    "dflash_4b_older": (dflash_config, None),
    "domino_8b": (domino_config, None),
    "domino_block_in_dflash_config": (_variant(domino_block_in_dflash_config), None),
    "domino_emb_dim_top_level_only": (_variant(domino_emb_dim_top_level_only), None),
    "domino_causal_v5": (_variant(domino_causal_v5), None),
    "domino_logit_head_prefix": (domino_config, "logit_head"),
    "domino_model_prefix": (domino_config, "model"),
    "dflash_rope_parameters": (_variant(dflash_rope_parameters), None),
    "dflash_taps_absent": (_variant(dflash_taps_absent), None),
    "dflash_sliding_window": (_variant(dflash_sliding_window), None),
    # DeepSpec's release also stores copies of the target's embed_tokens and lm_head
    "dspark_qwen3": (dspark_config, None),
    "dflash2": (dflash2_config, None),
}
REFUSED_VARIANTS = {
    "dflash2_output_multiplier": (_variant(dflash2_output_multiplier), "'output_multiplier'"),
    "domino_unknown_projector": (_variant(domino_unknown_projector), "'mlp_v9'"),
    "dspark_gated_markov": (_variant(dspark_gated_markov), "markov_head_type 'gated'"),
    "dspark_speculators": (_variant(dspark_speculators), "speculators-format"),
}
# the base layout whose parameters each variant must reproduce
SAME_AS = {"domino_block_in_dflash_config": "domino_8b",
           "domino_emb_dim_top_level_only": "domino_8b", "domino_causal_v5": "domino_8b",
           "domino_logit_head_prefix": "domino_8b", "domino_model_prefix": "domino_8b",
           "dflash_rope_parameters": "dflash_4b_older"}


def _random_tensors(abstract, seed: int) -> dict[str, np.ndarray]:
    """Matrices ~ N(0, 1/fan_in) (embedding rows larger), norms ~ 1 + 0.1 N(0, 1)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in sorted(flat_names(abstract).items()):
        if len(shape) == 1:
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) / np.sqrt(shape[1])
            a *= 4.0 if "embed_tokens" in name or "lm_head" in name else 1.0
        out[name] = a.astype(np.float32)
    return out


def _write(path: str, cfg: dict, tensors: dict | None) -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    if tensors is not None:
        write_safetensors(os.path.join(path, "model.safetensors"), tensors, {"format": "pt"})
    return path


def write_target(path: str, size: str = "tiny", rope_parameters: bool = False,
                 weights: bool = True, seed: int = 0) -> str:
    """A Qwen3 target directory: ``model.``-prefixed tensors, ``lm_head.weight`` unless tied."""
    cfg = qwen3_target_config(size, rope_parameters)
    tensors = None
    if weights:
        _, abstract = target_graphdef(TargetConfig.from_hf_dict(cfg), "float32")
        tensors = {("" if n == "lm_head.weight" else "model.") + n: a
                   for n, a in _random_tensors(abstract, seed).items()}
    return _write(path, cfg, tensors)


def _tensor_name(name: str, prefix: str | None) -> str:
    if prefix == "model":
        return "model." + name
    if prefix == "logit_head" and name.startswith(("prefix_gru.", "embed_proj.")):
        return "logit_head." + name
    return name


def write_drafter(path: str, variant: str, size: str = "tiny", weights: bool = True,
                  seed: int = 1) -> str:
    """A drafter directory in ``variant``'s layout (``DRAFTER_VARIANTS``/``REFUSED_VARIANTS``)."""
    if variant in REFUSED_VARIANTS:
        return _write(path, REFUSED_VARIANTS[variant][0](size), None)
    make_cfg, prefix = DRAFTER_VARIANTS[variant]
    cfg = make_cfg(size)
    tensors = None
    if weights:
        _, abstract = drafter_graphdef(DrafterConfig.from_hf_dict(cfg), "float32")
        tensors = {_tensor_name(n, prefix): a for n, a in _random_tensors(abstract, seed).items()}
        if cfg["architectures"] == ["Qwen3DSparkModel"]:   # the copies of write_target's
            tensors.update(target_copies(size))
    return _write(path, cfg, tensors)


def target_copies(size: str = "tiny", seed: int = 0) -> dict:
    """``embed_tokens.weight`` and ``lm_head.weight`` of ``write_target(size, seed=seed)`` (its
    head: the embedding when tied), as a DSpark release stores them."""
    cfg = TargetConfig.from_hf_dict(qwen3_target_config(size))
    _, abstract = target_graphdef(cfg, "float32")
    t = _random_tensors(abstract, seed)
    embed = t["embed_tokens.weight"]
    return {"embed_tokens.weight": embed, "lm_head.weight": t.get("lm_head.weight", embed)}
