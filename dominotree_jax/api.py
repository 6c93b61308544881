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
from dominotree_jax.model.target import bind_target, causal_mask, teacher_forced_forward
from dominotree_jax.decoding.decode import decode
from dominotree_jax.decoding.config import DecodeConfig
from dominotree_jax.decoding.costs import load_calibrated_costs
from dominotree_jax.precision import Precision, PrecisionError, cast_params, params_precision

class _Unset:
    """The default of a keyword whose older alias may be given instead (``precision=`` /
    ``dtype=``): tells "not given" from any value."""

    def __repr__(self) -> str:
        return "<default>"


_UNSET: Any = _Unset()


@dataclasses.dataclass
class Target:
    """A loaded target model: static config, parameter pytree, tokenizer (or None), and the
    precision its parameters are held in (``precision.Precision``, drafter = target; read from
    the parameters when not given, and refused when given but not theirs)."""
    config: TargetConfig
    params: Any
    tokenizer: Any = None
    precision: Precision | None = None

    def __post_init__(self):
        if self.precision is None:
            self.precision = Precision.of_params(self.params)
        else:
            self.precision = Precision.of(self.precision).only_target
            self.precision.check_params(self.params, what="target's precision")

    def with_precision(self, precision) -> "Target":
        """This target with its parameters cast to ``precision`` (``cast_params``)."""
        precision = Precision.of(precision).only_target
        return dataclasses.replace(self, params=cast_params(self.params, precision),
                                   precision=precision)

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


def _one_keyword(precision, dtype, default):
    """``precision=`` or its older alias ``dtype=`` (not both), else ``default``."""
    if dtype is not _UNSET:
        if precision is not _UNSET:
            raise TypeError("give precision= or its alias dtype=, not both")
        return dtype
    return default if precision is _UNSET else precision


def load_target(path: str, *, precision: Precision | str | None = _UNSET,
                tokenizer: bool = True, dtype: Precision | str | None = _UNSET) -> Target:
    """Load an HF checkpoint directory, a ``.gguf`` file (Llama architecture) or an orbax
    directory written by ``python -m convert target``.

    ``precision`` (default ``"float32"``; ``dtype=`` is its older alias): the precision the
    weights are held in (a ``precision.Precision`` or its text, docs/precision.md; of a
    target+drafter one, the target's), whatever the checkpoint stores; ``None`` keeps the
    stored one (float32 for a GGUF, dequantized). An unknown name is refused before anything
    loads. ``Target.precision`` is what was loaded.
    """
    from convert.target import load_target_checkpoint
    precision = _one_keyword(precision, dtype, "float32")
    if precision is not None:
        precision = Precision.of(precision).only_target
    name = None if precision is None else precision.target
    cfg, params, tokenizer_source = load_target_checkpoint(os.fspath(path), name)
    tok = load_tokenizer(tokenizer_source) if tokenizer and tokenizer_source else None
    return Target(cfg, params, tok, precision)


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
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    out = teacher_forced_forward(model, tokens_BT, pos, causal_mask(B, T, T))
    return model.logits(out.hidden)


def target_logits(target: Target, tokens) -> jax.Array:
    """float32 ``[B, T, V]`` logits of a plain causal forward at positions ``0..T-1``."""
    tokens = token_ids(tokens, "tokens")
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [B, T], got shape {tokens.shape}")
    return _plain_forward(target.params, tokens, target.config)


def generate(target: Target, prompt_ids, *, max_new_tokens: int, temperature: float = 0.0,
             key=None, top_k: int = 0, top_p: float = 1.0, stop_ids=None):
    """Autoregressive decoding (``decode``: one compiled program for every temperature);
    returns the generated ids ``[length]`` (or ``[B, length]``, ``length`` = the longest row's
    token count)."""
    stop = tuple(target.eos_ids if stop_ids is None else stop_ids)
    cfg = DecodeConfig(target=target.config, method="ar", max_new_tokens=max_new_tokens,
                       temperature=temperature, top_k=top_k, top_p=top_p, stop_ids=stop)
    prompt = token_ids(prompt_ids)
    out = decode({"target": target.params, "drafter": None}, prompt, config=cfg, key=key)
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

    @property
    def precision(self) -> Precision:
        """The pair's precision: the target's (``Target.precision``) and the drafter's
        (read from its parameters), a pairing the policy runs (refused by name otherwise)."""
        drafter = (None if self.drafter_params is None
                   else params_precision(self.drafter_params, "drafter parameters"))
        return Precision(self.target.precision.target, drafter)

    def with_precision(self, precision) -> "Pair":
        """This pair with target and drafter parameters cast to ``precision`` (one name for
        both, or ``"target+drafter"``)."""
        precision = Precision.of(precision)
        return dataclasses.replace(
            self, target=self.target.with_precision(precision.target),
            drafter_params=cast_params(self.drafter_params, precision.drafter))

    def config(self, method: str = "dominotree", **kw) -> DecodeConfig:
        """A ``DecodeConfig`` for this pair (stop ids default to the tokenizer's end tokens).

        ``budget="auto"`` without ``auto_costs``: this machine's calibrated cost table is read
        here (``costs.load_calibrated_costs``; the default cost model when there is none).
        ``DecodeConfig`` itself never reads a file. The config carries the pair's precision
        (``DecodeConfig.precision``: ``decode`` refuses parameters held in another)."""
        kw.setdefault("stop_ids", self.target.eos_ids)
        kw.setdefault("precision", self.precision)
        if kw.get("budget") == "auto" and method != "ar" and kw.get("auto_costs") is None:
            kw["auto_costs"] = load_calibrated_costs(
                self.target.config, self.drafter_config,
                precision=self.target.precision.target)
        return DecodeConfig(target=self.target.config, drafter=self.drafter_config,
                            method=method, **kw)


def pair_precision(precision=_UNSET, dtype=_UNSET, drafter_dtype=_UNSET) -> Precision | None:
    """``load_pair``'s precision from its keywords: ``precision`` (a ``Precision`` or its
    text, ``None`` = as stored), or the older ``dtype`` (target, and drafter unless given) and
    ``drafter_dtype``; not both forms. Refused by name before anything loads."""
    if dtype is not _UNSET or drafter_dtype is not _UNSET:
        if precision is not _UNSET:
            raise TypeError("give precision= or the older dtype=/drafter_dtype=, not both")
        target = "float32" if dtype is _UNSET else dtype
        drafter = None if drafter_dtype is _UNSET else drafter_dtype
        return Precision(target, drafter)
    return Precision() if precision is _UNSET else (
        None if precision is None else Precision.of(precision))


def load_pair(target_path: str, drafter_path: str, *, precision: Precision | str | None = _UNSET,
              dtype: str = _UNSET, drafter_dtype: str | None = _UNSET) -> Pair:
    """Load a target (HF dir, ``.gguf`` or orbax dir) and a DFlash/Domino drafter directory;
    the drafter is checked against the target (hidden size, vocab, tap layers, mask id).

    ``precision`` (default ``"float32"``): the pair's ``precision.Precision`` or its text, one
    name for both models or ``"target+drafter"``: ``"float32+bfloat16"`` is the exact mode
    (bf16 drafting, float32 verification); ``None`` keeps what the files store. The older
    ``dtype=`` (target) and ``drafter_dtype=`` (default: the target's) build the same.
    Unknown names and pairings the policy cannot run (``precision.check_pair``) are refused,
    naming both, before anything loads; ``Pair.precision`` is what was loaded.
    """
    from convert.drafter import load_drafter
    precision = pair_precision(precision, dtype, drafter_dtype)
    target = load_target(target_path,
                         precision=None if precision is None else precision.target)
    dcfg, dparams = load_drafter(os.fspath(drafter_path),
                                 dtype=None if precision is None else precision.drafter,
                                 target_cfg=target.config, target_params=target.params)
    pair = Pair(target, dcfg, dparams)
    loaded = pair.precision   # an impossible pairing of what the files store is refused here
    if precision is not None and loaded != precision:
        raise PrecisionError(f"loaded {loaded}, asked for {precision}")
    return pair
