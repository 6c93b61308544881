"""Grow a trained drafter by layers, or give it DSpark's heads, without changing what it
computes.

A warm start from a 1-layer drafter can still try 2 or 3 layers: every added layer copies the
last layer's weights (its attention and MLP see sensible inputs from the first step) but its two
output projections (``o_proj``, ``down_proj``) start at zero. A pre-norm residual layer whose
outputs are zero adds nothing to the residual stream, so the grown drafter's draft logits equal
the original's exactly at step 0, and training moves from there.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dominotree_jax.config import DrafterConfig

_ZEROED = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def grow_layers(cfg: DrafterConfig, flat: dict, num_layers: int) -> tuple[DrafterConfig, dict]:
    """``(config, {name: array})`` of the drafter with ``num_layers`` layers (≥ the current)."""
    have = cfg.num_hidden_layers
    if num_layers < have:
        raise ValueError(f"cannot grow a {have}-layer drafter to {num_layers} layers "
                         "(growing only adds layers)")
    if cfg.layer_types is not None:
        raise ValueError("growing a drafter with per-layer attention types (layer_types) is "
                         "not supported: the added layers' types would be a guess")
    last = f"layers.{have - 1}."
    donor = {k[len(last):]: v for k, v in flat.items() if k.startswith(last)}
    if not donor:
        raise ValueError(f"no parameters named {last}* in the drafter to grow from")
    out = dict(flat)
    for i in range(have, num_layers):
        for name, w in donor.items():
            w = np.asarray(w)
            out[f"layers.{i}.{name}"] = np.zeros_like(w) if name in _ZEROED else w.copy()
    return dataclasses.replace(cfg, num_hidden_layers=num_layers), out


def with_dspark_heads(cfg: DrafterConfig, flat: dict, rank: int,
                      seed: int = 0) -> tuple[DrafterConfig, dict]:
    """``(config, {name: array})`` of the drafter with DSpark's heads instead of any Domino
    head: a rank-``rank`` Markov head whose output ``W2`` starts at zero (the corrected logits
    equal the base ones, so the drafter drafts as its backbone did) and a zeroed confidence
    head over ``[z ; W1 row]``; the backbone and ``d2t`` are kept."""
    from dominotree_jax.config import check_drafter
    from dominotree_jax.model.drafter import init_drafter_params
    from dominotree_jax.model.state import state_to_flat
    if rank < 1:
        raise ValueError(f"a Markov head needs rank >= 1, got {rank}")
    new = dataclasses.replace(cfg, projector_type=None, gru_hidden_dim=0, emb_dim=0,
                              markov_rank=rank, confidence_head=True,
                              confidence_with_markov=True, shift_label=True)
    check_drafter(new)
    fresh = state_to_flat(init_drafter_params(new, seed))
    out = {k: v for k, v in flat.items() if not k.startswith(("prefix_gru.", "embed_proj."))}
    for name, w in fresh.items():
        if name.startswith(("markov_head.", "confidence_head.")):
            out[name] = np.zeros_like(np.asarray(w))
    # W1 ~ N(0, 1) (PyTorch's embedding init, DeepSpec's table): W2's gradient is read
    # through W1's rows, so a small W1 would keep the correction near zero for long
    w1 = "markov_head.markov_w1.weight"
    out[w1] = np.random.default_rng(seed).standard_normal(out[w1].shape).astype(np.float32)
    return new, out
