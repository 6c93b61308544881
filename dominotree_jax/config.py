"""Static, hashable model configurations.

``TargetConfig`` describes the target decoder (Qwen3 / Llama / Qwen2 families). It is built
from an HF ``config.json`` dict or from GGUF metadata by ``convert/``; every field is a plain
Python value so that configs can be ``jax.jit`` static arguments.
"""

from __future__ import annotations

import dataclasses
from typing import Any

SUPPORTED_ARCHITECTURES = {
    # HF architecture name -> (qk_norm, attention_bias)
    "Qwen3ForCausalLM": (True, False),
    "LlamaForCausalLM": (False, False),
    "Qwen2ForCausalLM": (False, True),
    "MistralForCausalLM": (False, False),
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class ConfigError(ValueError):
    """A checkpoint's configuration is invalid or unsupported."""


@dataclasses.dataclass(frozen=True)
class TargetConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # Hashable rope scaling description: (("rope_type", "llama3"), ("factor", 8.0), ...) or None.
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    tie_word_embeddings: bool = False
    qk_norm: bool = False
    attention_bias: bool = False
    max_position_embeddings: int = 32768
    architecture: str = "LlamaForCausalLM"

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}")
        rope_type = self.rope_type
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ConfigError(f"unsupported rope scaling type {rope_type!r}; "
                              f"supported: {SUPPORTED_ROPE_TYPES}")

    @property
    def rope_type(self) -> str:
        if not self.rope_scaling:
            return "default"
        d = dict(self.rope_scaling)
        return d.get("rope_type", d.get("type", "default"))

    @classmethod
    def from_hf_dict(cls, cfg: dict) -> "TargetConfig":
        archs = cfg.get("architectures") or []
        arch = archs[0] if archs else {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM",
                                       "qwen2": "Qwen2ForCausalLM"}.get(cfg.get("model_type"), "?")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ConfigError(f"unsupported architecture {arch!r} (model_type="
                              f"{cfg.get('model_type')!r}); supported: {sorted(SUPPORTED_ARCHITECTURES)}")
        qk_norm, qkv_bias = SUPPORTED_ARCHITECTURES[arch]
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
        rope_scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters")
        rope_theta = cfg.get("rope_theta")
        if isinstance(rope_scaling, dict):
            rope_theta = rope_scaling.get("rope_theta", rope_theta)
            rs = {k: v for k, v in rope_scaling.items() if k != "rope_theta"}
            if rs.get("rope_type", rs.get("type", "default")) == "default":
                rs = None
            rope_scaling = tuple(sorted((k, _freeze(v)) for k, v in rs.items())) if rs else None
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qk_norm=qk_norm,
            attention_bias=bool(cfg.get("attention_bias", qkv_bias)) or qkv_bias,
            max_position_embeddings=cfg.get("max_position_embeddings", 32768),
            architecture=arch,
        )


def _freeze(v):
    if isinstance(v, list):
        return tuple(v)
    if isinstance(v, dict):
        return tuple(sorted(v.items()))
    return v


# --------------------------------------------------------------------------- drafter

PROJECTOR_TYPES = (None, "domino")


def default_tap_layers(num_target_layers: int, num_drafter_layers: int) -> tuple[int, ...]:
    """SPEC §2 default ``target_layer_ids``: ``[L // 2]`` for one drafter layer, else evenly
    spaced ``round(1 + i*(L-4)/(n-1))`` (Python rounding, as the released helper)."""
    if num_drafter_layers == 1:
        return (num_target_layers // 2,)
    span = num_target_layers - 4
    return tuple(int(round(1 + i * span / (num_drafter_layers - 1)))
                 for i in range(num_drafter_layers))


@dataclasses.dataclass(frozen=True)
class DrafterConfig:
    """A DFlash / Domino drafter (SPEC §2–3): Qwen3 layers at the target's hidden size.

    ``target_layer_ids=None`` means the SPEC default for ``num_target_layers``. Structural
    problems that only show against a target (hidden/vocab mismatch, tap layers, mask id,
    block size) are reported by ``dominotree_jax.model.drafter.check_pair``.
    """
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
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

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"drafter num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}")
        if self.projector_type not in PROJECTOR_TYPES:
            raise ConfigError(f"unsupported drafter projector_type {self.projector_type!r}; "
                              f"supported: {PROJECTOR_TYPES}")
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
        if self.rope_type not in SUPPORTED_ROPE_TYPES:
            raise ConfigError(f"unsupported drafter rope scaling type {self.rope_type!r}; "
                              f"supported: {SUPPORTED_ROPE_TYPES}")

    rope_type = TargetConfig.rope_type  # the same property: same rope vocabulary as the target

    @property
    def num_draft_positions(self) -> int:
        """``K``: drafted depths per block (``B`` with ``shift_label``, else ``B - 1``)."""
        return self.block_size if self.shift_label else self.block_size - 1

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    @property
    def is_domino(self) -> bool:
        return self.projector_type == "domino"

    @classmethod
    def from_hf_dict(cls, cfg: dict) -> "DrafterConfig":
        """From a drafter ``config.json``: Qwen3 fields, ``block_size``, ``num_target_layers``
        and ``dflash_config`` (whose Domino fields may also sit at the top level)."""
        dflash = dict(cfg.get("dflash_config") or {})

        def field(name, default=None):
            return dflash[name] if dflash.get(name) is not None else cfg.get(name, default)

        missing = [n for n in ("vocab_size", "hidden_size", "intermediate_size",
                               "num_hidden_layers", "num_attention_heads", "block_size")
                   if cfg.get(n) is None]
        if field("mask_token_id") is None:
            missing.append("dflash_config.mask_token_id")
        if missing:
            raise ConfigError(f"drafter config.json lacks {', '.join(missing)}")
        heads = cfg["num_attention_heads"]
        rope_scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters")
        rope_theta = cfg.get("rope_theta")
        if isinstance(rope_scaling, dict):
            rope_theta = rope_scaling.get("rope_theta", rope_theta)
            rs = {k: v for k, v in rope_scaling.items() if k != "rope_theta"}
            if rs.get("rope_type", rs.get("type", "default")) == "default":
                rs = None
            rope_scaling = tuple(sorted((k, _freeze(v)) for k, v in rs.items())) if rs else None
        taps = field("target_layer_ids")
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            block_size=int(cfg["block_size"]),
            mask_token_id=int(field("mask_token_id")),
            num_target_layers=cfg.get("num_target_layers"),
            target_layer_ids=tuple(taps) if taps is not None else None,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta if rope_theta is not None else 1_000_000.0),
            rope_scaling=rope_scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 40960),
            shift_label=bool(field("shift_label", False)),
            projector_type=field("projector_type"),
            gru_hidden_dim=int(field("gru_hidden_dim", 0) or 0),
            emb_dim=int(field("emb_dim", 0) or 0),
            pure_draft_prefix_len=int(field("pure_draft_prefix_len", 1)),
        )

    def to_hf_dict(self) -> dict:
        """A ``config.json`` dict that ``from_hf_dict`` reads back to an equal config."""
        dflash = {"mask_token_id": self.mask_token_id,
                  "target_layer_ids": list(self.target_layer_ids),
                  "shift_label": self.shift_label}
        if self.is_domino:
            dflash.update(projector_type=self.projector_type, gru_hidden_dim=self.gru_hidden_dim,
                          emb_dim=self.emb_dim, pure_draft_prefix_len=self.pure_draft_prefix_len)
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
        if self.num_target_layers is not None:
            out["num_target_layers"] = self.num_target_layers
        return out
