"""Initialise a new drafter's decoder layers from the target's last decoder layers.

A drafter layer is a Qwen3 decoder layer at the target's hidden size (docs/algorithm.md §2).
``target_layer_init`` copies, for drafter layer ``i`` of ``n``, the weights of target layer
``L - n + i``: the attention projections (``q/k/v/o_proj``), the MLP (``gate/up/down_proj``) and
the two layer norms, plus the q/k head norms when the target has them (Qwen3). A Llama-family
target (SmolLM2) has no q/k norms: the drafter's stay at their initial value (ones). The
drafter's ``fc``, ``hidden_norm``, final ``norm`` and Domino head are left as they are.

Every copied weight must have exactly the drafter's shape; a mismatch (a different
``intermediate_size``, head count or head dimension) is an error naming the weight, and so is a
target layer with q/k/v biases (Qwen2), which a drafter layer cannot hold.
"""

from __future__ import annotations

import numpy as np

from dominotree_jax.model.state import state_to_flat
from dominotree_jax.config import DrafterConfig, TargetConfig

# Per-layer weights a drafter layer shares with a target decoder layer (names under
# ``layers.<i>.``, identical in both models).
COPIED = ("input_layernorm.weight", "post_attention_layernorm.weight",
          "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
          "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
          "mlp.down_proj.weight")
OPTIONAL = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")


def target_layer_init(dcfg: DrafterConfig, tcfg: TargetConfig, flat: dict, tparams) -> dict:
    """``flat`` (the drafter's ``{name: array}``) with its layers copied from the target's last
    ``dcfg.num_hidden_layers`` layers (see the module docstring). Returns a new dict."""
    n, L = dcfg.num_hidden_layers, tcfg.num_hidden_layers
    if n > L:
        raise ValueError(f"cannot initialise {n} drafter layers from a {L}-layer target")
    tflat = state_to_flat(tparams)
    out = dict(flat)
    for i in range(n):
        src, dst = f"layers.{L - n + i}.", f"layers.{i}."
        biases = [k for k in tflat if k.startswith(src) and k.endswith(".bias")]
        if biases:
            raise ValueError(f"target layer {L - n + i} has biases ({', '.join(biases)}); a "
                             "drafter layer has none, so it cannot be initialised from it")
        for name in COPIED + OPTIONAL:
            if src + name not in tflat:
                if name in OPTIONAL:
                    continue
                raise ValueError(f"the target has no weight {src + name}")
            if dst + name not in flat:
                raise ValueError(f"the drafter has no weight {dst + name}")
            w = np.asarray(tflat[src + name], np.float32)
            have = tuple(np.shape(flat[dst + name]))
            if w.shape != have:
                raise ValueError(f"shape mismatch: target {src + name} is {w.shape}, drafter "
                                 f"{dst + name} is {have} (the drafter's layers must match "
                                 "the target's: intermediate_size, heads, head_dim)")
            out[dst + name] = w.copy()
    return out
