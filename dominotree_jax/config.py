"""Static, hashable model configurations.

``TargetConfig`` describes the target decoder (Qwen3 / Llama / Qwen2 families). It is built
from an HF ``config.json`` dict or from GGUF metadata by ``convert/``; every field is a plain
Python value so that configs can be ``jax.jit`` static arguments.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dominotree_jax.config_fields import (COUNT, FLAG, NUMBER, POSITIVE, POSITIVE_NUMBER, TEXT,
                                          Field, field_problems)

SUPPORTED_ARCHITECTURES = {
    # HF architecture name -> (qk_norm, attention_bias)
    "Qwen3ForCausalLM": (True, False),
    "LlamaForCausalLM": (False, False),
    "Qwen2ForCausalLM": (False, True),
    "MistralForCausalLM": (False, False),
    # Gated DeltaNet hybrids (linear-attention layers beside gated full attention)
    "Qwen3_5ForCausalLM": (True, False),
    "Qwen3_5ForConditionalGeneration": (True, False),   # its text model; no vision tower
    "Qwen3_5MoeForCausalLM": (True, False),
    "Qwen3_5MoeForConditionalGeneration": (True, False),
    "Qwen3NextForCausalLM": (True, False),
    # mixture-of-experts
    "Qwen3MoeForCausalLM": (True, False),
    # sliding-window / full layers, attention sinks, clamped SwiGLU experts
    "GptOssForCausalLM": (False, True),
}
# hybrid architectures: config fields of their text model, norms scaled by (1 + weight)
HYBRID_ARCHITECTURES = ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration",
                        "Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration",
                        "Qwen3NextForCausalLM")
# multimodal releases whose text model sits under ``text_config`` / ``model.language_model``
MULTIMODAL_ARCHITECTURES = ("Qwen3_5ForConditionalGeneration",
                            "Qwen3_5MoeForConditionalGeneration")
# layers a target may hold (``TargetConfig.layer_types``)
TARGET_LAYER_TYPES = ("full_attention", "linear_attention", "sliding_attention")
# known architectures this package cannot run, refused by name before anything loads
REFUSED_ARCHITECTURES = {
    "DeepseekV3ForCausalLM": "multi-head latent attention (MLA) is not implemented",
    "KimiK25ForConditionalGeneration": "Kimi-K2.5 uses DeepSeek-V3's multi-head latent "
                                       "attention (MLA), which is not implemented",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class ConfigError(ValueError):
    """A checkpoint's configuration is invalid or unsupported."""


# every field an HF ``config.json`` (its ``text_config``, a drafter's ``dflash_config``) may
# give that is read here, and what it must be: checked before any value is used
ROTARY_FACTOR = Field("number", above=0.0, most=1.0)
HF_FIELDS = {
    **{name: POSITIVE for name in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
        "sliding_window", "full_attention_interval", "num_experts", "num_local_experts",
        "num_experts_per_tok", "moe_intermediate_size", "linear_conv_kernel_dim",
        "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
        "linear_value_head_dim", "num_target_layers", "block_size", "draft_vocab_size",
        "markov_rank", "conv_kernel_size", "conv_group_size", "selector_rank",
        "selector_top_k")},
    **{name: COUNT for name in (
        "max_window_layers", "decoder_sparse_step", "shared_expert_intermediate_size",
        "mask_token_id", "gru_hidden_dim", "emb_dim", "pure_draft_prefix_len")},
    **{name: FLAG for name in ("tie_word_embeddings", "attention_bias", "use_sliding_window",
                               "norm_topk_prob", "shift_label", "enable_confidence_head",
                               "confidence_head_with_markov")},
    "rms_norm_eps": POSITIVE_NUMBER, "rope_theta": POSITIVE_NUMBER,
    "partial_rotary_factor": ROTARY_FACTOR, "swiglu_alpha": NUMBER,
    "swiglu_limit": POSITIVE_NUMBER, "model_type": TEXT, "projector_type": TEXT,
    "markov_head_type": TEXT, "speculators_model_type": TEXT, "architectures": Field("strs"),
    "layer_types": Field("strs"),
    "mlp_only_layers": Field("ints"), "target_layer_ids": Field("ints"),
    "rope_scaling": Field("object"), "rope_parameters": Field("object"),
    "text_config": Field("object"), "dflash_config": Field("object"),
}
# the fields of a ``rope_scaling`` / ``rope_parameters`` object
ROPE_FIELDS = {
    "rope_type": TEXT, "type": TEXT, "rope_theta": POSITIVE_NUMBER, "factor": POSITIVE_NUMBER,
    "original_max_position_embeddings": POSITIVE, "low_freq_factor": POSITIVE_NUMBER,
    "high_freq_factor": POSITIVE_NUMBER, "beta_fast": POSITIVE_NUMBER,
    "beta_slow": POSITIVE_NUMBER, "attention_factor": POSITIVE_NUMBER, "mscale": NUMBER,
    "mscale_all_dim": NUMBER, "truncate": FLAG, "partial_rotary_factor": ROTARY_FACTOR,
}


def check_hf_fields(cfg: dict, what: str, prefix: str = "") -> None:
    """Raise ``ConfigError`` naming every field of an HF config dict (and of its rope object)
    whose type or range is wrong (``HF_FIELDS``, ``ROPE_FIELDS``)."""
    problems = field_problems(cfg, HF_FIELDS, prefix)
    for name in ("rope_scaling", "rope_parameters"):
        if isinstance(cfg.get(name), dict):
            problems += field_problems(cfg[name], ROPE_FIELDS, f"{prefix}{name}.")
    if problems:
        raise ConfigError(f"invalid {what} config: " + "; ".join(problems))


@dataclasses.dataclass(frozen=True)
class MoeShape:
    """A target's mixture-of-experts layers (``model/moe.py``): ``layers`` are sparse, the
    others dense SwiGLU MLPs of ``intermediate_size``. ``kind``: "qwen" (softmax, top-k,
    renormalised when ``norm_topk_prob``; a sigmoid-gated shared expert when
    ``shared_intermediate``) or "gpt_oss" (top-k logits then softmax; clamped experts with
    biases, a router bias)."""
    num_experts: int
    top_k: int
    intermediate: int
    layers: tuple[int, ...]
    norm_topk_prob: bool = True
    shared_intermediate: int = 0
    kind: str = "qwen"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    def problems(self, num_layers: int) -> list[str]:
        out = [f"{name}={getattr(self, name)!r} must be a positive integer"
               for name in ("num_experts", "top_k", "intermediate")
               if not isinstance(getattr(self, name), int) or getattr(self, name) < 1]
        if not out and self.top_k > self.num_experts:
            out.append(f"num_experts_per_tok={self.top_k} exceeds num_experts="
                       f"{self.num_experts}")
        if self.kind not in ("qwen", "gpt_oss"):
            out.append(f"unknown mixture-of-experts kind {self.kind!r}")
        bad = [i for i in self.layers if not 0 <= i < num_layers]
        if bad:
            out.append(f"mixture-of-experts layer(s) {bad} outside the {num_layers} layers")
        return out


def moe_layers(cfg: dict, num_layers: int) -> tuple[int, ...]:
    """The sparse layers of an HF MoE config: every ``decoder_sparse_step``-th layer not in
    ``mlp_only_layers``."""
    step = cfg.get("decoder_sparse_step", 1) or 1
    dense = set(cfg.get("mlp_only_layers") or ())
    return tuple(i for i in range(num_layers) if i not in dense and (i + 1) % step == 0)


def hf_moe_shape(cfg: dict, num_layers: int, *, shared: bool) -> MoeShape:
    """A Qwen-family ``MoeShape`` from an HF config (its text config for multimodal ones;
    releases name the expert count ``num_experts``, transformers 5 saves
    ``num_local_experts``)."""
    cfg = {"num_experts": cfg.get("num_local_experts"), **{k: v for k, v in cfg.items()
                                                           if v is not None}}
    _require(cfg, "mixture-of-experts", ("num_experts", "num_experts_per_tok",
                                         "moe_intermediate_size"))
    return MoeShape(num_experts=cfg["num_experts"], top_k=cfg["num_experts_per_tok"],
                    intermediate=cfg["moe_intermediate_size"],
                    layers=moe_layers(cfg, num_layers),
                    norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
                    shared_intermediate=(cfg.get("shared_expert_intermediate_size") or 0
                                         if shared else 0))


@dataclasses.dataclass(frozen=True)
class LinearAttentionShape:
    """The shape of a Gated DeltaNet layer (HF ``linear_*`` config fields)."""
    conv_kernel: int = 4
    num_key_heads: int = 16
    num_value_heads: int = 32
    key_head_dim: int = 128
    value_head_dim: int = 128

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def problems(self) -> list[str]:
        out = [f"linear_{name}={getattr(self, attr)!r} must be a positive integer"
               for name, attr in (("conv_kernel_dim", "conv_kernel"),
                                  ("num_key_heads", "num_key_heads"),
                                  ("num_value_heads", "num_value_heads"),
                                  ("key_head_dim", "key_head_dim"),
                                  ("value_head_dim", "value_head_dim"))
               if not isinstance(getattr(self, attr), int) or getattr(self, attr) < 1]
        if not out and self.num_value_heads % self.num_key_heads:
            out.append(f"linear_num_value_heads={self.num_value_heads} is not a multiple of "
                       f"linear_num_key_heads={self.num_key_heads}")
        return out

    def state_bytes(self) -> int:
        """float32 bytes of one sequence's state in one layer."""
        return 4 * (self.conv_dim * (self.conv_kernel - 1)
                    + self.num_value_heads * self.key_head_dim * self.value_head_dim)


@dataclasses.dataclass(frozen=True)
class DecoderShape:
    """The layer-shape fields every decoder config (target and drafter) has."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int

    # what each field must be (``config_fields``), checked before any is used
    FIELDS = {name: POSITIVE for name in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "head_dim")}
    KIND = "decoder"

    def __post_init__(self):
        optional = [f.name for f in dataclasses.fields(self) if f.default is None]
        problems = field_problems(self, type(self).FIELDS, none_ok=optional)
        if problems:
            raise ConfigError(f"invalid {self.KIND} config: " + "; ".join(problems))
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}")
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise ConfigError(f"unsupported rope scaling type {self.rope_type!r}; "
                              f"supported: {SUPPORTED_ROPE_TYPES}")

    @property
    def rope_type(self) -> str:
        scaling = getattr(self, "rope_scaling", None)
        if not scaling:
            return "default"
        d = dict(scaling)
        return d.get("rope_type", d.get("type", "default"))


@dataclasses.dataclass(frozen=True)
class TargetConfig(DecoderShape):
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # Hashable rope scaling description: (("rope_type", "llama3"), ("factor", 8.0), ...) or None.
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    tie_word_embeddings: bool = False
    qk_norm: bool = False
    attention_bias: bool = False
    max_position_embeddings: int = 32768
    architecture: str = "LlamaForCausalLM"
    # How decode/verify forwards read the cache (``layers.attend_cached``): "auto" (dense on a
    # GPU, buckets elsewhere), "bucket" or "dense". A runtime choice, not part of the model.
    attention_impl: str = "auto"
    # hybrids: each layer's kind (None: every layer full attention) and the linear layers' shape
    layer_types: tuple[str, ...] | None = None
    linear_attention: LinearAttentionShape | None = None
    attn_output_gate: bool = False       # attention output times sigmoid(gate) (q_proj's 2nd half)
    partial_rotary_factor: float = 1.0   # RoPE on the first factor * head_dim dims only
    norm_offset: float = 0.0             # RMSNorms scale by (norm_offset + weight)
    moe: MoeShape | None = None          # mixture-of-experts layers (None: dense MLPs)
    sliding_window: int | None = None    # "sliding_attention" layers see this many positions
    attention_sinks: bool = False        # a learned logit per head in every softmax (gpt-oss)
    output_bias: bool = False            # o_proj has a bias (gpt-oss)

    FIELDS = {**DecoderShape.FIELDS, "rms_norm_eps": POSITIVE_NUMBER,
              "rope_theta": POSITIVE_NUMBER, "max_position_embeddings": POSITIVE,
              "architecture": TEXT, "partial_rotary_factor": ROTARY_FACTOR,
              "norm_offset": NUMBER, "layer_types": Field("strs"),
              **{name: FLAG for name in ("tie_word_embeddings", "qk_norm", "attention_bias",
                                         "attn_output_gate", "attention_sinks",
                                         "output_bias")}}
    KIND = "target"

    def __post_init__(self):
        super().__post_init__()
        if self.attention_impl not in ("auto", "bucket", "dense"):
            raise ConfigError(f"attention_impl must be 'auto', 'bucket' or 'dense', got "
                              f"{self.attention_impl!r}")
        if self.layer_types is not None:
            types = checked_layer_types(self, TARGET_LAYER_TYPES, "target")
            if "sliding_attention" in types and (not isinstance(self.sliding_window, int)
                                                 or self.sliding_window < 1):
                raise ConfigError(f"sliding_attention layers need a positive integer "
                                  f"sliding_window, got {self.sliding_window!r}")
            if "linear_attention" in types:
                if self.linear_attention is None:
                    raise ConfigError("linear_attention layers need the linear_* shape fields")
                problems = self.linear_attention.problems()
                if problems:
                    raise ConfigError("; ".join(problems))
        if self.moe is not None:
            problems = self.moe.problems(self.num_hidden_layers)
            if problems:
                raise ConfigError("; ".join(problems))
        if not 0.0 < self.partial_rotary_factor <= 1.0 or self.rotary_dim % 2:
            raise ConfigError(f"partial_rotary_factor={self.partial_rotary_factor!r} must lie "
                              f"in (0, 1] and give an even rotary width (head_dim "
                              f"{self.head_dim})")

    @property
    def rotary_dim(self) -> int:
        """The leading head dims RoPE rotates."""
        return int(self.head_dim * self.partial_rotary_factor)

    def is_linear(self, layer: int) -> bool:
        """Whether layer ``layer`` is a Gated DeltaNet (linear-attention) layer."""
        return self.layer_types is not None and self.layer_types[layer] == "linear_attention"

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_hidden_layers) if not self.is_linear(i))

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.num_hidden_layers) if self.is_linear(i))

    def layer_window(self, layer: int) -> int | None:
        """The positions an attention layer sees (itself included), None: all."""
        if self.layer_types is not None and self.layer_types[layer] == "sliding_attention":
            return self.sliding_window
        return None

    def is_moe(self, layer: int) -> bool:
        """Whether layer ``layer``'s MLP is a mixture of experts."""
        return self.moe is not None and layer in self.moe.layers

    @property
    def is_hybrid(self) -> bool:
        """Whether some layer carries a recurrent state instead of a KV cache."""
        return self.layer_types is not None and "linear_attention" in self.layer_types

    @classmethod
    def from_hf_dict(cls, cfg: dict) -> "TargetConfig":
        check_hf_fields(cfg, "target")
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM",
                                       "qwen2": "Qwen2ForCausalLM",
                                       "qwen3_5": "Qwen3_5ForConditionalGeneration",
                                       "qwen3_5_text": "Qwen3_5ForCausalLM",
                                       "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
                                       "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
                                       "qwen3_next": "Qwen3NextForCausalLM",
                                       "qwen3_moe": "Qwen3MoeForCausalLM",
                                       "gpt_oss": "GptOssForCausalLM",
                                       }.get(cfg.get("model_type"), "?")
        if arch in REFUSED_ARCHITECTURES:
            raise ConfigError(f"unsupported architecture {arch!r}: "
                              f"{REFUSED_ARCHITECTURES[arch]}")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ConfigError(f"unsupported architecture {arch!r} (model_type="
                              f"{cfg.get('model_type')!r}); "
                              f"supported: {sorted(SUPPORTED_ARCHITECTURES)}")
        if arch in HYBRID_ARCHITECTURES:
            return cls._hybrid_from_hf_dict(cfg, arch)
        if arch == "GptOssForCausalLM":
            return cls._gpt_oss_from_hf_dict(cfg)
        _require(cfg, "target", ("vocab_size", "hidden_size", "intermediate_size",
                                 "num_hidden_layers", "num_attention_heads"))
        if cfg.get("use_sliding_window") and cfg.get("sliding_window"):
            raise ConfigError(f"sliding-window targets are not supported (use_sliding_window="
                              f"true, sliding_window={cfg['sliding_window']})")
        qk_norm, qkv_bias = SUPPORTED_ARCHITECTURES[arch]
        rope_theta, rope_scaling = hf_rope_fields(cfg, 10000.0)
        moe = (hf_moe_shape(cfg, cfg["num_hidden_layers"], shared=False)
               if arch == "Qwen3MoeForCausalLM" else None)
        return cls(
            **_decoder_fields(cfg, (rope_theta, rope_scaling), cfg.get("tie_word_embeddings")),
            qk_norm=qk_norm,
            attention_bias=bool(cfg.get("attention_bias", qkv_bias)) or qkv_bias,
            architecture=arch,
            moe=moe,
        )

    @classmethod
    def _gpt_oss_from_hf_dict(cls, cfg: dict) -> "TargetConfig":
        """gpt-oss: alternating sliding-window / full attention with sinks and biases, YaRN,
        every layer a mixture of clamped SwiGLU experts with biases."""
        _require(cfg, "target", ("vocab_size", "hidden_size", "intermediate_size",
                                 "num_hidden_layers", "num_attention_heads",
                                 "num_local_experts", "num_experts_per_tok"))
        L = cfg["num_hidden_layers"]
        types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else
                                           "full_attention" for i in range(L)]
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {
            "rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": False, "original_max_position_embeddings": 4096}
        rope_theta, rope_scaling = hf_rope_fields({**cfg, "rope_parameters": rope}, 150000.0)
        return cls(
            **_decoder_fields({"head_dim": 64, "rms_norm_eps": 1e-5,
                               "max_position_embeddings": 131072, **cfg},
                              (rope_theta, rope_scaling), cfg.get("tie_word_embeddings")),
            qk_norm=False,
            attention_bias=bool(cfg.get("attention_bias", True)),
            output_bias=bool(cfg.get("attention_bias", True)),
            architecture="GptOssForCausalLM",
            layer_types=tuple(types),
            sliding_window=cfg.get("sliding_window") or 128,
            attention_sinks=True,
            moe=MoeShape(num_experts=cfg["num_local_experts"], top_k=cfg["num_experts_per_tok"],
                         intermediate=cfg["intermediate_size"], layers=tuple(range(L)),
                         kind="gpt_oss", swiglu_alpha=cfg.get("swiglu_alpha", 1.702),
                         swiglu_limit=cfg.get("swiglu_limit", 7.0)),
        )

    @classmethod
    def _hybrid_from_hf_dict(cls, cfg: dict, arch: str) -> "TargetConfig":
        """Qwen3.5: the text model's fields (under ``text_config`` in the multimodal layout,
        whose vision tower is not loaded), Gated DeltaNet layers beside gated attention."""
        text = cfg
        if arch in MULTIMODAL_ARCHITECTURES or "text_config" in cfg:
            text = cfg.get("text_config")
            if not isinstance(text, dict):
                raise ConfigError(f"{arch} config.json lacks its text_config object")
            check_hf_fields(text, "target text", "text_config.")
        moe = None
        if "Moe" in arch or arch == "Qwen3NextForCausalLM":
            moe = hf_moe_shape(text, text.get("num_hidden_layers") or 0, shared=True)
            # a model whose every layer is sparse may give no dense width
            text = {"intermediate_size": text.get("moe_intermediate_size"), **text}
        _require(text, "target text", ("vocab_size", "hidden_size", "intermediate_size",
                                       "num_hidden_layers", "num_attention_heads"))
        L = text["num_hidden_layers"]
        types = text.get("layer_types")
        if types is None:
            every = text.get("full_attention_interval", 4)
            types = ["linear_attention" if (i + 1) % every else "full_attention"
                     for i in range(L)]
        rope_theta, rope_scaling = hf_rope_fields(text, 10000.0)
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
        partial = rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
        if rope_scaling is not None:   # text-only positions make M-RoPE plain RoPE
            rope_scaling = tuple((k, v) for k, v in rope_scaling
                                 if k not in ("mrope_section", "mrope_interleaved",
                                              "partial_rotary_factor"))
            if dict(rope_scaling).get("rope_type", dict(rope_scaling).get("type")) in (
                    None, "default"):
                rope_scaling = None
        tie = cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        return cls(
            **_decoder_fields({"head_dim": 256, **text}, (rope_theta, rope_scaling), tie),
            qk_norm=True,
            attention_bias=bool(text.get("attention_bias", False)),
            architecture=arch,
            layer_types=tuple(types),
            linear_attention=LinearAttentionShape(
                conv_kernel=text.get("linear_conv_kernel_dim", 4),
                num_key_heads=text.get("linear_num_key_heads", 16),
                num_value_heads=text.get("linear_num_value_heads", 32),
                key_head_dim=text.get("linear_key_head_dim", 128),
                value_head_dim=text.get("linear_value_head_dim", 128)),
            attn_output_gate=True,
            partial_rotary_factor=float(partial),
            norm_offset=1.0,
            moe=moe,
        )


def _decoder_fields(cfg: dict, rope: tuple, tie) -> dict:
    """The fields every target family reads alike: shapes, norm eps, RoPE, head tying and
    context length (``cfg``'s own defaults first, e.g. ``head_dim``)."""
    return dict(**hf_shape_fields(cfg), rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
                rope_theta=rope[0], rope_scaling=rope[1], tie_word_embeddings=bool(tie),
                max_position_embeddings=cfg.get("max_position_embeddings", 32768))


def checked_layer_types(cfg, supported: tuple[str, ...], what: str) -> tuple[str, ...]:
    """``cfg.layer_types`` as a tuple (set on the frozen ``cfg``), one known type per layer;
    a ``ConfigError`` naming the problem otherwise."""
    types = tuple(cfg.layer_types)
    object.__setattr__(cfg, "layer_types", types)
    if len(types) != cfg.num_hidden_layers:
        raise ConfigError(f"{what} layer_types has {len(types)} entries for "
                          f"{cfg.num_hidden_layers} layers")
    unknown = sorted(set(types) - set(supported))
    if unknown:
        raise ConfigError(f"unsupported {what} layer type(s) {unknown}; supported: "
                          f"{supported}")
    return types


def _require(cfg: dict, what: str, names) -> None:
    missing = [n for n in names if cfg.get(n) is None]
    if missing:
        raise ConfigError(f"{what} config.json lacks {', '.join(missing)}")


def hf_shape_fields(cfg: dict) -> dict:
    """The layer-shape fields shared by targets and drafters, from an HF ``config.json``."""
    heads = cfg["num_attention_heads"]
    return dict(vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                intermediate_size=cfg["intermediate_size"],
                num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=heads,
                num_key_value_heads=cfg.get("num_key_value_heads") or heads,
                head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads)


def hf_rope_fields(cfg: dict, default_theta: float):
    """``(rope_theta, rope_scaling)`` from ``rope_theta``/``rope_scaling`` or the newer
    ``rope_parameters`` (which carries ``rope_theta`` inside); the default rope type is
    ``None`` scaling, other types a hashable sorted tuple of items."""
    params = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    theta = cfg.get("rope_theta")
    scaling = None
    if isinstance(params, dict):
        theta = params.get("rope_theta", theta)
        rest = {k: v for k, v in params.items() if k != "rope_theta"}
        if rest.get("rope_type", rest.get("type", "default")) != "default":
            scaling = tuple(sorted((k, _freeze(v)) for k, v in rest.items()))
    return float(theta if theta is not None else default_theta), scaling


def _freeze(v):
    if isinstance(v, list):
        return tuple(v)
    if isinstance(v, dict):
        return tuple(sorted(v.items()))
    return v


# --------------------------------------------------------------------------- drafter

PROJECTOR_TYPES = (None, "domino")
# Older releases name the Domino projector by its experiment name.
PROJECTOR_ALIASES = {"causal_v5": "domino"}
DRAFTER_ARCHITECTURES = ("DFlashDraftModel", "Qwen3DSparkModel", "DFlash2DraftModel")
# DSpark (DeepSpec's layout): the one Markov head this package runs
MARKOV_HEAD_TYPES = ("vanilla",)
# Known drafter architectures this package cannot run, with the reason.
REFUSED_DRAFTER_ARCHITECTURES: dict[str, str] = {}
# DFlash2 options of other runtimes this package does not implement (refused by name)
DFLASH2_UNSUPPORTED = ("input_embedding_scale", "output_multiplier", "final_logit_softcapping")
LAYER_TYPES = ("full_attention", "sliding_attention")


def default_tap_layers(num_target_layers: int, num_drafter_layers: int) -> tuple[int, ...]:
    """Default ``target_layer_ids`` (docs/algorithm.md, target taps): ``[L // 2]`` for one
    drafter layer, else evenly spaced ``round(1 + i*(L-4)/(n-1))`` (Python rounding, as the
    released helper)."""
    if num_drafter_layers == 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 4
    return tuple(int(round(1 + i * span / (num_drafter_layers - 1)))
                 for i in range(num_drafter_layers))


@dataclasses.dataclass(frozen=True)
class DrafterConfig(DecoderShape):
    """A DFlash / Domino drafter: Qwen3 layers at the target's hidden size.

    ``target_layer_ids=None`` means the default for ``num_target_layers``. ``sliding_window``
    (with ``layer_types``; ``None`` types: every layer) lets a layer see only the last
    ``sliding_window`` committed context rows; ``draft_window`` (a decode setting, not a
    checkpoint field) does the same for every layer. Problems that only show against a target
    (hidden/vocab mismatch, tap layers, mask id) are reported by ``check_pair``.
    """
    block_size: int
    mask_token_id: int
    num_target_layers: int | None = None
    target_layer_ids: tuple[int, ...] | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    max_position_embeddings: int = 40960
    shift_label: bool = False
    projector_type: str | None = None
    gru_hidden_dim: int = 0
    emb_dim: int = 0
    pure_draft_prefix_len: int = 1
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    draft_window: int | None = None
    # the draft vocabulary D (docs/algorithm.md §3): the drafter proposes only these target ids
    # (the checkpoint's ``d2t`` tensor, ``draft_vocab_size`` entries); None: the full vocabulary
    draft_vocab_size: int | None = None
    # DSpark (docs/algorithm.md §3b): the Markov head's rank r (0: none) and the confidence
    # head (its input: the final-normed state, and the Markov row of the previous token when
    # ``confidence_with_markov``)
    markov_rank: int = 0
    confidence_head: bool = False
    confidence_with_markov: bool = True
    # DFlash2 (docs/algorithm.md §3c): the in-block convolution's taps (0: none) and group
    # width, the path selector's rank (0: none) and candidates per depth
    conv_kernel: int = 0
    conv_group: int = 16
    selector_rank: int = 0
    selector_top_k: int = 16

    # (mask id, block size, windows and draft vocabulary: ranges checked by drafter_problems
    # and _check_window, which name them against the target)
    FIELDS = {**DecoderShape.FIELDS, "block_size": Field("int", least=-2**63),
              "mask_token_id": Field("int", least=-2**63), "num_target_layers": POSITIVE,
              "target_layer_ids": Field("ints"), "rms_norm_eps": POSITIVE_NUMBER,
              "rope_theta": POSITIVE_NUMBER, "max_position_embeddings": POSITIVE,
              "shift_label": FLAG, "projector_type": TEXT, "gru_hidden_dim": COUNT,
              "emb_dim": COUNT, "pure_draft_prefix_len": COUNT,
              "draft_vocab_size": Field("int", least=-2**63), "layer_types": Field("strs"),
              "markov_rank": COUNT, "confidence_head": FLAG, "confidence_with_markov": FLAG,
              "conv_kernel": COUNT, "conv_group": POSITIVE, "selector_rank": COUNT,
              "selector_top_k": POSITIVE}
    KIND = "drafter"

    def __post_init__(self):
        super().__post_init__()
        projector = PROJECTOR_ALIASES.get(self.projector_type, self.projector_type)
        object.__setattr__(self, "projector_type", projector)
        if self.projector_type not in PROJECTOR_TYPES:
            raise ConfigError(f"unsupported drafter projector_type {self.projector_type!r}; "
                              f"supported: 'domino' (alias {sorted(PROJECTOR_ALIASES)}) or "
                              "none (DFlash)")
        if self.projector_type == "domino" and (self.gru_hidden_dim <= 0 or self.emb_dim <= 0):
            raise ConfigError("a Domino drafter needs positive gru_hidden_dim and emb_dim, got "
                              f"{self.gru_hidden_dim} and {self.emb_dim}")
        if self.target_layer_ids is None:
            if self.num_target_layers is None:
                raise ConfigError("drafter config has neither target_layer_ids nor "
                                  "num_target_layers")
            object.__setattr__(self, "target_layer_ids", default_tap_layers(
                self.num_target_layers, self.num_hidden_layers))
        else:
            object.__setattr__(self, "target_layer_ids",
                               tuple(int(i) for i in self.target_layer_ids))
        if not self.target_layer_ids:
            raise ConfigError("drafter target_layer_ids is empty")
        self._check_window()

    def _check_window(self):
        for name in ("sliding_window", "draft_window"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"drafter {name}={value!r} must be a positive integer")
        if self.layer_types is not None:
            checked_layer_types(self, LAYER_TYPES, "drafter")

    @property
    def num_draft_positions(self) -> int:
        """``K``: drafted depths per block (``B`` with ``shift_label``, else ``B - 1``)."""
        return self.block_size if self.shift_label else self.block_size - 1

    @classmethod
    def for_target(cls, target: "TargetConfig", *, layers: int, intermediate: int,
                   taps: tuple[int, ...], block_size: int, mask_token_id: int, gru: int = 256,
                   emb: int = 128, draft_vocab_size: int | None = None,
                   markov_rank: int = 0) -> "DrafterConfig":
        """A new Domino drafter (``shift_label``, prefix length 1) at ``target``'s shapes; with
        ``markov_rank`` a DSpark one instead (a Markov head and a confidence head)."""
        dspark = markov_rank > 0
        return cls(
            vocab_size=target.vocab_size, hidden_size=target.hidden_size,
            intermediate_size=intermediate, num_hidden_layers=layers,
            num_attention_heads=target.num_attention_heads,
            num_key_value_heads=target.num_key_value_heads, head_dim=target.head_dim,
            block_size=block_size, mask_token_id=mask_token_id,
            num_target_layers=target.num_hidden_layers, target_layer_ids=tuple(taps),
            rms_norm_eps=target.rms_norm_eps, rope_theta=target.rope_theta,
            max_position_embeddings=target.max_position_embeddings, shift_label=True,
            projector_type=None if dspark else "domino", gru_hidden_dim=0 if dspark else gru,
            emb_dim=0 if dspark else emb, pure_draft_prefix_len=1,
            draft_vocab_size=draft_vocab_size, markov_rank=markov_rank, confidence_head=dspark)

    @property
    def draft_vocab(self) -> int:
        """``|D|``: the columns of the base logits and rows of the correction's output."""
        return self.vocab_size if self.draft_vocab_size is None else self.draft_vocab_size

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    @property
    def is_domino(self) -> bool:
        return self.projector_type == "domino"

    @property
    def is_dspark(self) -> bool:
        """A DSpark drafter: a Markov head (rank ``markov_rank``) over the DFlash backbone."""
        return self.markov_rank > 0

    @property
    def is_dflash2(self) -> bool:
        """A DFlash2 drafter: a path selector (rank ``selector_rank``) over the DFlash block."""
        return self.selector_rank > 0

    @property
    def confidence_width(self) -> int:
        """The confidence head's input width: ``H`` (+ ``r`` with the Markov features)."""
        return self.hidden_size + (self.markov_rank if self.confidence_with_markov else 0)

    def layer_window(self, layer: int) -> int | None:
        """Committed context rows drafter layer ``layer`` sees (the last ones), ``None``: all.

        The smaller of the released ``sliding_window`` (on ``sliding_attention`` layers, or
        every layer when ``layer_types`` is None) and the ``draft_window`` setting.
        """
        sliding = (self.layer_types is None or self.layer_types[layer] == "sliding_attention")
        windows = [w for w in (self.sliding_window if sliding else None, self.draft_window)
                   if w is not None]
        return min(windows) if windows else None

    def context_slots(self, sequence_slots: int) -> int:
        """Slots of the drafter context ring for a sequence of ``sequence_slots``: the widest
        layer window when every layer has one, else the whole sequence."""
        windows = [self.layer_window(i) for i in range(self.num_hidden_layers)]
        if any(w is None for w in windows):
            return sequence_slots
        return min(sequence_slots, max(windows))

    @classmethod
    def from_hf_dict(cls, cfg: dict) -> "DrafterConfig":
        """From a drafter ``config.json``: Qwen3 fields, ``block_size`` (top level or in
        ``dflash_config``), ``num_target_layers`` and ``dflash_config`` (whose Domino fields may
        also sit at the top level)."""
        check_hf_fields(cfg, "drafter")
        if cfg.get("speculators_model_type") is not None:
            raise ConfigError(
                f"unsupported drafter layout: a speculators-format checkpoint "
                f"(speculators_model_type={cfg['speculators_model_type']!r}); its slots predict "
                "one position later than DeepSpec's and its names differ. Use the DeepSpec "
                "release (architectures ['Qwen3DSparkModel']) or a DFlash drafter")
        archs = cfg.get("architectures") or []
        for arch in archs:
            if arch in REFUSED_DRAFTER_ARCHITECTURES:
                raise ConfigError(f"unsupported drafter architecture {arch!r}: "
                                  f"{REFUSED_DRAFTER_ARCHITECTURES[arch]}")
            if arch not in DRAFTER_ARCHITECTURES:
                raise ConfigError(f"unsupported drafter architecture {arch!r}; supported: "
                                  f"{DRAFTER_ARCHITECTURES}")
        dflash = dict(cfg.get("dflash_config") or {})
        check_hf_fields(dflash, "drafter", "dflash_config.")

        def field(name, default=None):
            return dflash[name] if dflash.get(name) is not None else cfg.get(name, default)

        _require({**cfg, "block_size": field("block_size"),
                  "dflash_config.mask_token_id": field("mask_token_id")}, "drafter",
                 ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads", "block_size", "dflash_config.mask_token_id"))
        rope_theta, rope_scaling = hf_rope_fields(cfg, 1_000_000.0)
        taps = field("target_layer_ids")
        window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
        types = cfg.get("layer_types")
        if window is not None and types is None:  # Qwen3's default: layers from max_window_layers
            first = cfg.get("max_window_layers", cfg["num_hidden_layers"])
            types = ["sliding_attention" if i >= first else "full_attention"
                     for i in range(cfg["num_hidden_layers"])]
        dspark = "Qwen3DSparkModel" in archs
        heads = {}   # the fields of a DSpark or DFlash2 drafter's heads
        if dspark:
            heads = dspark_fields(cfg)
        if "DFlash2DraftModel" in archs:
            heads = dflash2_fields(cfg, dflash)
        return cls(
            **hf_shape_fields(cfg),
            **heads,
            block_size=int(field("block_size")),
            mask_token_id=int(field("mask_token_id")),
            num_target_layers=cfg.get("num_target_layers"),
            target_layer_ids=tuple(taps) if taps is not None else None,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 40960),
            shift_label=dspark or bool(field("shift_label", False)),
            projector_type=field("projector_type"),
            gru_hidden_dim=int(field("gru_hidden_dim", 0) or 0),
            emb_dim=int(field("emb_dim", 0) or 0),
            pure_draft_prefix_len=int(field("pure_draft_prefix_len", 1)),
            sliding_window=int(window) if window is not None else None,
            layer_types=tuple(types) if window is not None else None,
            draft_vocab_size=(int(field("draft_vocab_size")) if field("draft_vocab_size")
                              is not None else None),
        )

    def to_hf_dict(self) -> dict:
        """A ``config.json`` dict that ``from_hf_dict`` reads back to an equal config."""
        dflash = {"mask_token_id": self.mask_token_id,
                  "target_layer_ids": list(self.target_layer_ids),
                  "shift_label": self.shift_label}
        if self.is_domino:
            dflash.update(projector_type=self.projector_type, gru_hidden_dim=self.gru_hidden_dim,
                          emb_dim=self.emb_dim, pure_draft_prefix_len=self.pure_draft_prefix_len)
        if self.draft_vocab_size is not None:
            dflash["draft_vocab_size"] = self.draft_vocab_size
        out = {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": ({k: list(v) if isinstance(v, tuple) else v
                              for k, v in self.rope_scaling} if self.rope_scaling else None),
            "max_position_embeddings": self.max_position_embeddings,
            "attention_bias": False,
            "tie_word_embeddings": False,
            "block_size": self.block_size,
            "dflash_config": dflash,
        }
        if self.sliding_window is not None:
            out.update(use_sliding_window=True, sliding_window=self.sliding_window,
                       layer_types=list(self.layer_types or
                                        ("sliding_attention",) * self.num_hidden_layers))
        if self.num_target_layers is not None:
            out["num_target_layers"] = self.num_target_layers
        if self.is_dflash2:
            out["architectures"] = ["DFlash2DraftModel"]
            dflash.update(conv_kernel_size=self.conv_kernel, conv_group_size=self.conv_group,
                          selector_rank=self.selector_rank, selector_top_k=self.selector_top_k)
        if self.is_dspark:   # DeepSpec's layout: its fields at the top level
            del out["dflash_config"]
            out.update(architectures=["Qwen3DSparkModel"], mask_token_id=self.mask_token_id,
                       target_layer_ids=list(self.target_layer_ids),
                       markov_rank=self.markov_rank, markov_head_type="vanilla",
                       enable_confidence_head=self.confidence_head,
                       confidence_head_with_markov=self.confidence_with_markov)
            if self.draft_vocab_size is not None:
                out["draft_vocab_size"] = self.draft_vocab_size
        return out


def dflash2_fields(cfg: dict, dflash: dict) -> dict:
    """A DFlash2 ``config.json``'s fields (``dflash_config`` first, then the top level), with
    the defaults of the released drafters (two taps, groups of 16, rank 256, 16 candidates);
    options of other runtimes this package does not implement are refused by name."""
    bad = [k for k in DFLASH2_UNSUPPORTED if cfg.get(k) not in (None, 1, 1.0)]
    if bad:
        raise ConfigError(f"unsupported DFlash2 option(s) {bad}: this package runs DFlash2 "
                          "drafters without them")

    def field(name, default):
        v = dflash.get(name, cfg.get(name))
        return default if v is None else int(v)

    return dict(conv_kernel=field("conv_kernel_size", 2), conv_group=field("conv_group_size", 16),
                selector_rank=field("selector_rank", 256),
                selector_top_k=field("selector_top_k", 16))


def dspark_fields(cfg: dict) -> dict:
    """A DeepSpec DSpark ``config.json``'s head fields (``DrafterConfig``'s ``markov_rank``,
    ``confidence_head``, ``confidence_with_markov``); unknown Markov head types and a missing
    rank are refused by name."""
    head_type = cfg.get("markov_head_type", "vanilla")
    if head_type not in MARKOV_HEAD_TYPES:
        raise ConfigError(f"unsupported DSpark markov_head_type {head_type!r}; supported: "
                          f"{list(MARKOV_HEAD_TYPES)}")
    if not cfg.get("markov_rank"):
        raise ConfigError("a DSpark drafter config (Qwen3DSparkModel) needs markov_rank > 0")
    return dict(markov_rank=int(cfg["markov_rank"]),
                confidence_head=bool(cfg.get("enable_confidence_head", False)),
                confidence_with_markov=bool(cfg.get("confidence_head_with_markov", True)))


# --------------------------------------------------------------------------- pair checks

def drafter_problems(cfg: DrafterConfig, target_cfg: TargetConfig | None = None) -> list[str]:
    """Every reason ``cfg`` cannot draft (for ``target_cfg``, when given), one line each."""
    problems = []
    if target_cfg is not None:
        for what in ("hidden_size", "vocab_size"):
            d, t = getattr(cfg, what), getattr(target_cfg, what)
            if d != t:
                problems.append(f"{what.replace('_', ' ')} differs: drafter {d}, target {t}")
        L = target_cfg.num_hidden_layers
        if cfg.num_target_layers is not None and cfg.num_target_layers != L:
            problems.append(f"num_target_layers={cfg.num_target_layers}, but the target has "
                            f"{L} layers")
        bad = [i for i in cfg.target_layer_ids if not 0 <= i < L]
        if bad:
            problems.append(f"tap layer(s) {bad} outside the target's {L} layers "
                            f"(target_layer_ids={list(cfg.target_layer_ids)})")
    else:   # the taps against the layer count the drafter names, if any
        L = cfg.num_target_layers
        bad = [i for i in cfg.target_layer_ids if i < 0 or (L is not None and i >= L)]
        if bad:
            problems.append(f"tap layer(s) {bad} outside the target's "
                            f"{'layers' if L is None else f'{L} layers (num_target_layers)'} "
                            f"(target_layer_ids={list(cfg.target_layer_ids)})")
    vocab = min(cfg.vocab_size, target_cfg.vocab_size) if target_cfg else cfg.vocab_size
    if not 0 <= cfg.mask_token_id < vocab:
        problems.append(f"mask_token_id={cfg.mask_token_id} is outside the vocabulary "
                        f"[0, {vocab})")
    if cfg.draft_vocab_size is not None and not 1 <= cfg.draft_vocab_size <= cfg.vocab_size:
        problems.append(f"draft_vocab_size={cfg.draft_vocab_size} is outside [1, vocab_size="
                        f"{cfg.vocab_size}]")
    if sum((cfg.is_dspark, cfg.is_domino, cfg.is_dflash2)) > 1:
        problems.append("a drafter has one head: a Markov head (markov_rank), a Domino "
                        "projector or a path selector (selector_rank), not two")
    if cfg.conv_kernel and cfg.hidden_size % cfg.conv_group:
        problems.append(f"conv_group_size={cfg.conv_group} does not divide hidden_size="
                        f"{cfg.hidden_size}")
    if cfg.is_dflash2 and cfg.shift_label:
        problems.append("a DFlash2 drafter's slot 0 is the anchor (shift_label=False)")
    if cfg.is_dflash2 and cfg.draft_vocab_size is not None:
        problems.append("a DFlash2 drafter with a draft vocabulary is not supported")
    if cfg.is_dflash2 and cfg.selector_top_k > cfg.vocab_size:
        problems.append(f"selector_top_k={cfg.selector_top_k} exceeds the vocabulary "
                        f"({cfg.vocab_size})")
    if cfg.is_dspark and not cfg.shift_label:
        problems.append("a DSpark drafter's block slots predict from the anchor on "
                        "(shift_label=True)")
    if cfg.confidence_head and cfg.confidence_with_markov and not cfg.is_dspark:
        problems.append("a confidence head with Markov features needs markov_rank > 0")
    if cfg.block_size < 2:
        problems.append(f"block_size={cfg.block_size} is too small: a block needs t0 and at "
                        "least one MASK slot (block_size >= 2)")
    elif cfg.block_size > cfg.max_position_embeddings:
        problems.append(f"block_size={cfg.block_size} exceeds max_position_embeddings="
                        f"{cfg.max_position_embeddings}")
    if cfg.is_domino and not 0 <= cfg.pure_draft_prefix_len <= cfg.num_draft_positions:
        problems.append(f"pure_draft_prefix_len={cfg.pure_draft_prefix_len} is outside "
                        f"[0, {cfg.num_draft_positions}]")
    return problems


def check_drafter(cfg: DrafterConfig) -> None:
    """Raise ``ConfigError`` naming every reason the drafter cannot draft at all."""
    problems = drafter_problems(cfg)
    if problems:
        raise ConfigError("invalid drafter config:\n  " + "\n  ".join(problems))


def check_pair(target_cfg: TargetConfig, drafter_cfg: DrafterConfig) -> None:
    """Raise ``ConfigError`` naming every reason the drafter cannot serve this target."""
    problems = drafter_problems(drafter_cfg, target_cfg)
    if problems:
        raise ConfigError("drafter does not fit the target:\n  " + "\n  ".join(problems))
