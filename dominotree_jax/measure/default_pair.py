"""The default pair the benchmarks and the calibration run: SmolLM2-135M-Instruct and a drafter.

The drafter is the shipped ``dominotree_jax/assets/smollm2-domino`` when present, a checkpoint
directory when given, or a random-init Domino drafter with SmolLM2 shapes (τ ≈ 1: it exercises
the code paths and their costs, not the speedup).
"""

from __future__ import annotations

import os
import sys

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # dominotree_jax/
DEFAULT_DRAFTER = os.path.join(PACKAGE, "assets", "smollm2-domino")
RANDOM = "random"


def shipped_drafter() -> str | None:
    """The shipped drafter directory, or None while it is not there."""
    from dominotree_jax.assets import smollm2_drafter_path
    try:
        return smollm2_drafter_path()
    except FileNotFoundError:
        return None


def random_smollm2_drafter(target_cfg, seed: int = 0, dtype="float32"):
    """(DrafterConfig, params): a random-init Domino drafter shaped for ``target_cfg``
    (one Qwen3 layer, block 8, taps (1, L/2, L-3), GRU 256, embedding 128), in ``dtype`` (a
    name or a one-model ``Precision``)."""
    from dominotree_jax.config import DrafterConfig, check_pair
    from dominotree_jax.model.drafter import init_drafter_params
    from dominotree_jax.precision import precision_name

    L = target_cfg.num_hidden_layers
    cfg = DrafterConfig(
        vocab_size=target_cfg.vocab_size, hidden_size=target_cfg.hidden_size,
        intermediate_size=1536, num_hidden_layers=1, num_attention_heads=9,
        num_key_value_heads=3, head_dim=64, block_size=8, mask_token_id=0,
        num_target_layers=L, target_layer_ids=(1, L // 2, L - 3), shift_label=True,
        projector_type="domino", gru_hidden_dim=256, emb_dim=128, pure_draft_prefix_len=1)
    check_pair(target_cfg, cfg)
    return cfg, init_drafter_params(cfg, seed, dtype=precision_name(dtype, "drafter dtype"))


def load_models(target_path: str | None = None, drafter: str | None = None,
                precision="float32"):
    """(Pair, target path, drafter description). ``drafter``: a directory, ``"random"``, or
    None for the shipped drafter (random when it is not there, with a warning). ``precision``:
    the pair's (a ``precision.Precision`` or its text: one name for both models, or
    ``"float32+bfloat16"``; docs/precision.md)."""
    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_gguf_path
    from dominotree_jax.precision import Precision

    precision = Precision.of(precision)
    target_path = target_path or smollm2_gguf_path()
    target = dj.load_target(target_path, precision=precision.target)
    if drafter is None:
        drafter = shipped_drafter() or RANDOM
    if drafter == RANDOM:
        print("WARNING: no trained drafter: using a random-init Domino drafter (tau ~ 1: this "
              "measures the plumbing and its costs, not the speedup)", file=sys.stderr)
        dcfg, dparams = random_smollm2_drafter(target.config, dtype=precision.drafter)
        name = "random-init Domino (SmolLM2 shapes)"
    else:
        from convert.drafter import load_drafter
        dcfg, dparams = load_drafter(drafter, dtype=precision.drafter, target_cfg=target.config)
        name = _portable(drafter)
    return dj.Pair(target, dcfg, dparams), _portable(target_path), name


def usable_methods(methods, drafter_cfg) -> tuple[str, ...]:
    """``methods`` without those that read a head the drafter lacks (the Domino head's, the
    Markov head's; warns)."""
    from dominotree_jax.decoding.config import missing_head
    dropped = [m for m in methods if missing_head(m, drafter_cfg)]
    if dropped:
        print(f"WARNING: the drafter lacks their head: skipping {dropped}", file=sys.stderr)
    return tuple(m for m in methods if m not in dropped)


def _portable(path: str) -> str:
    """A path as it reads on any machine: relative to the repository or to site-packages."""
    path = os.path.abspath(path)
    repo = os.path.dirname(PACKAGE)
    if path.startswith(repo + os.sep):
        return os.path.relpath(path, repo)
    marker = os.sep + "site-packages" + os.sep
    return "<site-packages>/" + path.split(marker, 1)[1] if marker in path else path
