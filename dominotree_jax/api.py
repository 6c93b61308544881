"""The public entry points: load a target, run a plain forward, generate autoregressively."""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.config import TargetConfig
from dominotree_jax.model.cache import KVCache
from dominotree_jax.model.target import bind_target, causal_mask
from dominotree_jax.decoding.decode import decode
from dominotree_jax.decoding.config import DecodeConfig
from dominotree_jax.decoding.costs import load_calibrated_costs
from dominotree_jax.precision import check_pair, params_precision, precision_name


@dataclasses.dataclass
class Target:
    """A loaded target model: static config, parameter pytree, tokenizer (or None)."""
    config: TargetConfig
    params: Any
    tokenizer: Any = None

    def chat_prompt(self, text: str, *, enable_thinking: bool | None = None,
                    system: str | None = None) -> list[int]:
        """Token ids of ``text`` as one user turn in the model's chat template.

        ``enable_thinking`` is passed to templates that read it (Qwen3: ``False`` appends an
        empty ``<think></think>`` block so the model answers directly); ``None`` leaves the
        template's default. ``system`` adds a system turn first.
        """
        if self.tokenizer is None:
            raise ValueError("this target was loaded without a tokenizer")
        return chat_token_ids(self.tokenizer, text, enable_thinking=enable_thinking,
                              system=system)

    @property
    def eos_ids(self) -> tuple[int, ...]:
        tok = self.tokenizer
        ids = {tok.eos_token_id} if tok is not None and tok.eos_token_id is not None else set()
        if tok is not None:
            im_end = tok.convert_tokens_to_ids("<|im_end|>")
            if isinstance(im_end, int) and im_end != tok.unk_token_id:
                ids.add(im_end)
        return tuple(sorted(ids))


def chat_token_ids(tokenizer, text: str, *, enable_thinking: bool | None = None,
                   system: str | None = None) -> list[int]:
    """``tokenizer``'s chat template over one user turn (see ``Target.chat_prompt``)."""
    turns = ([{"role": "system", "content": system}] if system is not None else [])
    turns.append({"role": "user", "content": text})
    extra = {} if enable_thinking is None else {"enable_thinking": bool(enable_thinking)}
    ids = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True,
                                        return_dict=False, **extra)
    return [int(i) for i in ids]


def load_target(path: str, *, dtype: str | None = "float32", tokenizer: bool = True) -> Target:
    """Load an HF checkpoint directory, a ``.gguf`` file (Llama architecture) or an orbax
    directory written by ``python -m convert target``.

    ``dtype``: the precision (``"float32"``, ``"bfloat16"``; docs/precision.md) the weights are
    held in; ``None`` keeps the stored dtype. An unknown name is refused before anything loads.
    """
    from convert.target import load_target_checkpoint
    if dtype is not None:
        dtype = precision_name(dtype, "target dtype")
    cfg, params, tokenizer_source = load_target_checkpoint(os.fspath(path), dtype)
    tok = load_tokenizer(tokenizer_source) if tokenizer and tokenizer_source else None
    return Target(cfg, params, tok)


def load_tokenizer(path: str):
    """The tokenizer stored with a checkpoint (GGUF vocabulary or HF files), or None."""
    if path.endswith(".gguf"):
        from convert.gguf import load_gguf_tokenizer
        return load_gguf_tokenizer(path)
    if any(os.path.exists(os.path.join(path, f))
           for f in ("tokenizer.json", "tokenizer_config.json")):
        from transformers import AutoTokenizer
        return AutoTokenizer.from_pretrained(path)
    return None


def token_ids(ids, what: str = "prompt") -> jax.Array:
    """``ids`` as int32, refusing floats, booleans and anything else that is not integer."""
    arr = np.asarray(ids)
    if arr.dtype == object or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{what} must hold integer token ids, got dtype {arr.dtype}")
    return jnp.asarray(arr, jnp.int32)


@functools.partial(jax.jit, static_argnames="cfg")
def _plain_forward(params, tokens_BT, cfg: TargetConfig):
    B, T = tokens_BT.shape
    model = bind_target(cfg, params)
    cache = KVCache.zeros(cfg.num_hidden_layers, B, T, cfg.num_key_value_heads, cfg.head_dim,
                          jax.tree.leaves(params)[0].dtype)
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    out = model(tokens_BT, pos, causal_mask(B, T, T), cache, jnp.zeros((B,), jnp.int32))
    return model.logits(out.hidden)


def target_logits(target: Target, tokens) -> jax.Array:
    """float32 ``[B, T, V]`` logits of a plain causal forward at positions ``0..T-1``."""
    tokens = token_ids(tokens, "tokens")
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [B, T], got shape {tokens.shape}")
    return _plain_forward(target.params, tokens, target.config)


_jit_decode = jax.jit(decode, static_argnames="config")


def generate(target: Target, prompt_ids, *, max_new_tokens: int, temperature: float = 0.0,
             key=None, top_k: int = 0, top_p: float = 1.0, stop_ids=None):
    """Autoregressive decoding (jitted); returns the generated ids ``[length]`` (or ``[B,
    length]``, ``length`` = the longest row's token count)."""
    stop = tuple(target.eos_ids if stop_ids is None else stop_ids)
    cfg = DecodeConfig(target=target.config, method="ar", max_new_tokens=max_new_tokens,
                       temperature=temperature, top_k=top_k, top_p=top_p, stop_ids=stop)
    prompt = token_ids(prompt_ids)
    out = _jit_decode({"target": target.params, "drafter": None}, prompt, config=cfg, key=key)
    n = int(jnp.max(out.num_tokens))
    toks = out.tokens[:, :n]
    return toks[0, :int(out.num_tokens[0])] if prompt.ndim == 1 else toks


@dataclasses.dataclass
class Pair:
    """A target and its drafter: ``params`` and ``config(...)`` are what ``decode`` needs."""
    target: Target
    drafter_config: Any
    drafter_params: Any

    @property
    def params(self) -> dict:
        return {"target": self.target.params, "drafter": self.drafter_params}

    def config(self, method: str = "dominotree", **kw) -> DecodeConfig:
        """A ``DecodeConfig`` for this pair (stop ids default to the tokenizer's end tokens).

        ``budget="auto"`` without ``auto_costs``: this machine's calibrated cost table is read
        here (``costs.load_calibrated_costs``; the default cost model when there is none).
        ``DecodeConfig`` itself never reads a file."""
        kw.setdefault("stop_ids", self.target.eos_ids)
        if kw.get("budget") == "auto" and method != "ar" and kw.get("auto_costs") is None:
            kw["auto_costs"] = load_calibrated_costs(
                self.target.config, self.drafter_config,
                precision=params_precision(self.target.params, "target parameters"))
        return DecodeConfig(target=self.target.config, drafter=self.drafter_config,
                            method=method, **kw)


def load_pair(target_path: str, drafter_path: str, *, dtype: str = "float32",
              drafter_dtype: str | None = None) -> Pair:
    """Load a target (HF dir, ``.gguf`` or orbax dir) and a DFlash/Domino drafter directory;
    the drafter is checked against the target (hidden size, vocab, tap layers, mask id).

    ``dtype``: the target's precision; ``drafter_dtype`` the drafter's (default: the same).
    ``dtype="float32", drafter_dtype="bfloat16"`` is the exact mode (bf16 drafting, float32
    verification). Unknown names and pairings the policy cannot run (``precision.check_pair``)
    are refused, naming both, before anything loads.
    """
    from convert.drafter import load_drafter
    drafter_dtype = dtype if drafter_dtype is None else drafter_dtype
    check_pair(dtype, drafter_dtype)
    target = load_target(target_path, dtype=dtype)
    dcfg, dparams = load_drafter(os.fspath(drafter_path), dtype=drafter_dtype,
                                 target_cfg=target.config)
    # orbax directories restore in their saved dtypes: check what was actually loaded
    check_pair(params_precision(target.params, "target parameters"),
               params_precision(dparams, "drafter parameters"))
    return Pair(target, dcfg, dparams)
