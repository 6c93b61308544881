"""Released tensor layouts that differ from the modules' parameters, rewritten by name before
the state is filled (``convert/hf.py``); every other tensor passes through unchanged.

- Experts stored one by one (``mlp.experts.{e}.gate_proj.weight``: Qwen3-MoE, Qwen3-Next) are
  stacked along a leading expert axis (``mlp.experts.gate_proj [experts, I, H]``); a fused
  ``mlp.experts.gate_up_proj [experts, 2I, H]`` (Qwen3.5-MoE, transformers' own saves) is split
  into its gate and up halves.
- gpt-oss's experts (``mlp.experts.gate_up_proj`` with gate and up interleaved, biases) as
  released in MXFP4 (``*_blocks`` / ``*_scales``, dequantised here) or as transformers saves
  them unquantised (``[experts, in, out]``) become the stacked ``Experts`` parameters.
- Qwen3-Next's Gated DeltaNet packs its projections per key head (``in_proj_qkvz``: for each
  key head its query, key, then its value heads' values and gates; ``in_proj_ba``: its value
  heads' betas then decays); they are regrouped into Qwen3.5's separate ``in_proj_qkv`` (all
  queries, all keys, all values: the conv's channel order), ``in_proj_z``, ``in_proj_b``,
  ``in_proj_a``.
"""

from __future__ import annotations

import re

import numpy as np

from dominotree_jax.model.moe import gpt_oss_expert_params, split_gate_up, stack_expert_tensors
from dominotree_jax.model.mxfp4 import dequantize_mxfp4

_FUSED_GATE_UP = re.compile(r"^(.*\.mlp\.experts\.)gate_up_proj$")
_QKVZ = re.compile(r"^(.*\.linear_attn\.)in_proj_qkvz\.weight$")
_BA = re.compile(r"^(.*\.linear_attn\.)in_proj_ba\.weight$")


def adapt_target_tensors(cfg, named: dict) -> dict:
    """``named`` (parameter names -> arrays) in the modules' layout for target ``cfg``."""
    if cfg.moe is None and not cfg.is_hybrid:
        return named
    if cfg.moe is not None and cfg.moe.kind == "gpt_oss":
        return _gpt_oss_experts(named)
    out = stack_expert_tensors(named) if cfg.moe is not None else dict(named)
    for name in list(out):
        if (m := _FUSED_GATE_UP.match(name)) and cfg.moe is not None and cfg.moe.kind == "qwen":
            gate, up = split_gate_up(np.asarray(out.pop(name)), axis=-2)
            out[m.group(1) + "gate_proj"], out[m.group(1) + "up_proj"] = gate, up
        elif (m := _QKVZ.match(name)) and cfg.is_hybrid:
            out.update(_split_qkvz(m.group(1), np.asarray(out.pop(name)), cfg.linear_attention))
        elif (m := _BA.match(name)) and cfg.is_hybrid:
            out.update(_split_ba(m.group(1), np.asarray(out.pop(name)), cfg.linear_attention))
    return out


_GPT_OSS_EXPERTS = re.compile(r"^(.*\.mlp\.experts\.)gate_up_proj(_blocks)?$")


def _gpt_oss_experts(named: dict) -> dict:
    out = dict(named)
    for name in list(out):
        m = _GPT_OSS_EXPERTS.match(name)
        if m is None:
            continue
        prefix, packed = m.group(1), m.group(2) is not None
        try:
            if packed:
                gate_up = dequantize_mxfp4(out.pop(prefix + "gate_up_proj_blocks"),
                                           out.pop(prefix + "gate_up_proj_scales"),
                                           layout="out_in")
                down = dequantize_mxfp4(out.pop(prefix + "down_proj_blocks"),
                                        out.pop(prefix + "down_proj_scales"), layout="out_in")
            else:
                gate_up, down = out.pop(prefix + "gate_up_proj"), out.pop(prefix + "down_proj")
            bias_up, bias_down = (out.pop(prefix + "gate_up_proj_bias"),
                                  out.pop(prefix + "down_proj_bias"))
        except KeyError as e:
            raise ValueError(f"{prefix[:-1]}: the expert tensor {e.args[0]} is missing") from None
        params = gpt_oss_expert_params(gate_up, bias_up, down, bias_down,
                                       transposed=not packed)
        out.update({prefix + k: v for k, v in params.items()})
    return out


def _split_qkvz(prefix: str, w, shape) -> dict:
    nk, dk, dv = shape.num_key_heads, shape.key_head_dim, shape.value_head_dim
    rep = shape.num_value_heads // nk
    per_head = 2 * dk + 2 * rep * dv
    if w.shape[0] != nk * per_head:
        return {prefix + "in_proj_qkvz.weight": w}   # reported by the shape check
    g = w.reshape(nk, per_head, -1)
    q, k = g[:, :dk], g[:, dk:2 * dk]
    v, z = g[:, 2 * dk:2 * dk + rep * dv], g[:, 2 * dk + rep * dv:]
    flat = [x.reshape(-1, w.shape[-1]) for x in (q, k, v, z)]
    return {prefix + "in_proj_qkv.weight": np.concatenate(flat[:3]),
            prefix + "in_proj_z.weight": flat[3]}


def _split_ba(prefix: str, w, shape) -> dict:
    nk = shape.num_key_heads
    rep = shape.num_value_heads // nk
    if w.shape[0] != 2 * shape.num_value_heads:
        return {prefix + "in_proj_ba.weight": w}
    g = w.reshape(nk, 2 * rep, -1)
    return {prefix + "in_proj_b.weight": g[:, :rep].reshape(-1, w.shape[-1]),
            prefix + "in_proj_a.weight": g[:, rep:].reshape(-1, w.shape[-1])}
