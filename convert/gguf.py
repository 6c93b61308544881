"""GGUF file of the Llama architecture (e.g. SmolLM2-135M-Instruct Q4_1) → target params.

Quantized tensors are dequantized with the ``gguf`` package. llama.cpp's converter permutes
the rows of ``attn_q``/``attn_k`` (interleaved RoPE pairs); we undo it so the weights use HF's
rotate-half layout.
"""

from __future__ import annotations

import mmap
import os

import jax.numpy as jnp
import numpy as np

from convert.errors import CheckpointError
from convert.gguf_header import check_gguf_layout
from convert.params import check_layer_count, fill_state
from dominotree_jax.config import ConfigError, TargetConfig
from dominotree_jax.config_fields import POSITIVE, POSITIVE_NUMBER, field_problems
from dominotree_jax.model.target import target_graphdef

SUPPORTED_GGUF_ARCHITECTURES = ("llama",)
SUPPORTED_TENSOR_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                          "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd.weight": "embed_tokens.weight", "output_norm.weight": "norm.weight",
              "output.weight": "lm_head.weight"}


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


# the metadata a Llama GGUF's config is read from (``<arch>.`` + key), what each must be, and
# the ``TargetConfig`` field it gives
GGUF_FIELDS = {
    "vocab_size": ("vocab_size", POSITIVE),
    "embedding_length": ("hidden_size", POSITIVE),
    "feed_forward_length": ("intermediate_size", POSITIVE),
    "block_count": ("num_hidden_layers", POSITIVE),
    "attention.head_count": ("num_attention_heads", POSITIVE),
    "attention.head_count_kv": ("num_key_value_heads", POSITIVE),
    "rope.dimension_count": ("head_dim", POSITIVE),
    "attention.layer_norm_rms_epsilon": ("rms_norm_eps", POSITIVE_NUMBER),
    "rope.freq_base": ("rope_theta", POSITIVE_NUMBER),
    "context_length": ("max_position_embeddings", POSITIVE),
}


def gguf_target_config(reader, path: str = "gguf") -> TargetConfig:
    """The ``TargetConfig`` of a Llama GGUF; metadata of the wrong type or range is refused,
    naming the file, the key and the value, before anything is built."""
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise CheckpointError(path, other=[f"unsupported GGUF architecture {arch!r}; "
                                           f"supported: {SUPPORTED_GGUF_ARCHITECTURES}"])
    meta = {k: _field(reader, f"{arch}.{k}") for k in GGUF_FIELDS}
    required = ("embedding_length", "attention.head_count", "feed_forward_length",
                "block_count")
    absent = [f"metadata key {arch}.{k} is missing" for k in required if meta[k] is None]
    if absent:
        raise CheckpointError(path, other=absent)
    if meta["vocab_size"] is None and "tokenizer.ggml.tokens" in reader.fields:
        meta["vocab_size"] = len(reader.fields["tokenizer.ggml.tokens"].data)
    if meta["vocab_size"] is None:
        raise CheckpointError(path, other=[f"neither {arch}.vocab_size nor "
                                           "tokenizer.ggml.tokens gives the vocabulary size"])
    bad = field_problems(meta, {k: check for k, (_, check) in GGUF_FIELDS.items()},
                         f"metadata {arch}.")
    if bad:
        raise CheckpointError(path, other=bad)
    fields = {name: meta[k] for k, (name, _) in GGUF_FIELDS.items() if meta[k] is not None}
    heads = fields["num_attention_heads"]
    fields = {"num_key_value_heads": heads, "head_dim": fields["hidden_size"] // heads,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 8192,
              **{k: v.item() if hasattr(v, "item") else v for k, v in fields.items()}}
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    try:
        return TargetConfig(**fields, tie_word_embeddings=not has_output,
                            architecture="LlamaForCausalLM")
    except ConfigError as e:
        raise CheckpointError(path, other=[str(e)]) from None


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's q/k row permutation (interleaved pairs → rotate-half halves)."""
    rows = w.shape[0]
    return (w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def read_gguf(path: str):
    """A ``gguf.GGUFReader`` over ``path`` after a bounds-checked walk of its header (the
    magic, every metadata entry, every tensor's bytes inside the file)."""
    import gguf

    if not os.path.isfile(path):
        raise CheckpointError(path, other=["the path does not exist" if not os.path.exists(path)
                                           else "not a file"])
    with open(path, "rb") as f:
        if os.path.getsize(path) == 0:
            raise CheckpointError(path, other=["empty file"])
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            check_gguf_layout(path, data)
    try:
        return gguf.GGUFReader(path)
    except Exception as e:  # anything the walk above did not foresee
        raise CheckpointError(path, other=[f"damaged GGUF file: {type(e).__name__}: "
                                           f"{e}"]) from None


def load_gguf_target(path: str, dtype: str = "float32"):
    """(TargetConfig, params) from a Llama-architecture GGUF file, dequantized to ``dtype``."""
    import gguf

    reader = read_gguf(path)
    cfg = gguf_target_config(reader, path)
    bad = [f"tensor {t.name}: unsupported quantization type {t.tensor_type.name}"
           for t in reader.tensors if t.tensor_type.name not in SUPPORTED_TENSOR_TYPES]
    if bad:
        raise CheckpointError(path, other=bad)
    tensors = {}
    for t in reader.tensors:
        name = _hf_name(t.name)
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = w.reshape(tuple(int(d) for d in reversed(t.shape)))
        if name.endswith("self_attn.q_proj.weight"):
            w = _unpermute(w, cfg.num_attention_heads)
        elif name.endswith("self_attn.k_proj.weight"):
            w = _unpermute(w, cfg.num_key_value_heads)
        tensors[name] = w
    check_layer_count(cfg.num_hidden_layers, tensors, path)
    _, abstract = target_graphdef(cfg, dtype)
    return cfg, fill_state(abstract, tensors, path, jnp.dtype(dtype))


def _hf_name(gguf_name: str) -> str:
    if gguf_name in _TOP_NAMES:
        return _TOP_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return gguf_name  # reported as unexpected by fill_state


def load_gguf_tokenizer(path: str):
    """The GGUF's own vocabulary and chat template as a transformers tokenizer."""
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)),
                                         gguf_file=os.path.basename(path))
