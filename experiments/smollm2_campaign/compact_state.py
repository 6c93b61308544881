"""A drafter training state small enough to commit to git at the end of every work window.

A float32 drafter and its AdamW moments take 12 bytes a parameter (~130 MB for the SmolLM2
drafter with a 16k draft vocabulary). Committed each window they would swamp the repository, so
a campaign (``campaign.py``) commits this form instead, ~3.5 bytes a parameter:

- **parameters** in bfloat16 (round to nearest);
- **first moment** ``mu``: int8, one float32 absmax scale per block of ``BLOCK`` values;
- **second moment** ``nu`` (>= 0): 4 bits per value on a log scale, each block spanning its
  own ``[min, max]`` of ``log nu`` (float32 bounds); code 0 is an exact zero.

Everything else in the optimizer state (step counters) is kept exactly. ``compress`` and
``restore`` are pure functions of the state, so ``restore(compress(s))`` is what a resumed run
continues from, and an unbroken run that applies ``roundtrip`` at the same step computes the
same parameters bit for bit (tests/test_campaign.py here). With AdamW's short memories
(``b1 = 0.9``, ``b2 = 0.95``: ~10 and ~20 steps) the moments' rounding fades within a few dozen
steps; the ablation in benchmarks/results/drafter_v5/ measures what it costs the curve.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

BLOCK = 64
LOG_LEVELS = 15      # codes 1..15 span a block's log range; 0 = an exact zero
_TINY = 1e-30        # below this a second moment is stored as zero


def _blocks(x: np.ndarray) -> np.ndarray:
    flat = np.asarray(x, np.float32).reshape(-1)
    pad = (-len(flat)) % BLOCK
    return np.concatenate([flat, np.zeros(pad, np.float32)]).reshape(-1, BLOCK)


def quantize_int8(x: np.ndarray) -> dict:
    """Blockwise absmax int8: ``{"q": int8 [n], "scale": float32 [blocks]}``."""
    b = _blocks(x)
    scale = np.abs(b).max(axis=1) / 127.0
    q = np.rint(b / np.where(scale > 0, scale, 1.0)[:, None]).astype(np.int8)
    return {"q": q.reshape(-1)[:np.size(x)], "scale": scale.astype(np.float32)}


def dequantize_int8(d: dict, shape) -> np.ndarray:
    n = int(np.prod(shape))
    q = np.concatenate([d["q"].astype(np.float32), np.zeros((-n) % BLOCK, np.float32)])
    return (q.reshape(-1, BLOCK) * d["scale"][:, None]).reshape(-1)[:n].reshape(shape)


def quantize_log4(v: np.ndarray) -> dict:
    """Non-negative ``v`` as 4-bit log codes, two per byte: ``{"q": uint8 [ceil(n/2)],
    "lo": float32 [blocks], "hi": float32 [blocks]}``."""
    b = _blocks(np.maximum(v, 0.0))
    nz = b >= _TINY
    logv = np.log(np.where(nz, b, 1.0))
    lo = np.where(nz, logv, np.inf).min(axis=1)
    hi = np.where(nz, logv, -np.inf).max(axis=1)
    lo = np.where(np.isfinite(lo), lo, 0.0)
    hi = np.where(np.isfinite(hi), hi, 0.0)
    span = np.where(hi > lo, hi - lo, 1.0)
    codes = 1 + np.rint((logv - lo[:, None]) / span[:, None] * (LOG_LEVELS - 1))
    codes = np.where(nz, np.clip(codes, 1, LOG_LEVELS), 0).astype(np.uint8).reshape(-1)
    codes = codes[:np.size(v)]
    if len(codes) % 2:
        codes = np.concatenate([codes, np.zeros(1, np.uint8)])
    return {"q": (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8),
            "lo": lo.astype(np.float32), "hi": hi.astype(np.float32)}


def dequantize_log4(d: dict, shape) -> np.ndarray:
    n = int(np.prod(shape))
    codes = np.stack([d["q"] & 15, d["q"] >> 4], axis=1).reshape(-1)[:n].astype(np.float32)
    codes = np.concatenate([codes, np.zeros((-n) % BLOCK, np.float32)]).reshape(-1, BLOCK)
    lo, hi = d["lo"][:, None], d["hi"][:, None]
    span = np.where(hi > lo, hi - lo, 1.0)
    v = np.exp(lo + (codes - 1) / (LOG_LEVELS - 1) * span)
    return np.where(codes > 0, v, 0.0).astype(np.float32).reshape(-1)[:n].reshape(shape)


def _moment(path) -> str | None:
    """``"mu"``/``"nu"`` for a leaf inside an Adam moment, else None."""
    for p in path:
        name = getattr(p, "name", None)
        if name in ("mu", "nu"):
            return name
    return None


def _key(path) -> str:
    return jax.tree_util.keystr(path)


def compress(flat: dict, opt_state) -> dict[str, np.ndarray]:
    """The committed form of ``(flat parameters, optimizer state)``: a flat dict of NumPy
    arrays (``np.savez``-able; names ``p/…``, ``mu/…``, ``nu/…``, ``x/…``)."""
    out: dict[str, np.ndarray] = {}
    for name, a in flat.items():
        out[f"p/{name}"] = np.asarray(np.asarray(a, np.float32).astype(ml_dtypes.bfloat16)
                                      ).view(np.uint16)
    for path, leaf in jax.tree_util.tree_flatten_with_path(opt_state)[0]:
        key, kind, a = _key(path), _moment(path), np.asarray(leaf)
        if kind == "mu" and np.issubdtype(a.dtype, np.floating):
            d = quantize_int8(a)
        elif kind == "nu" and np.issubdtype(a.dtype, np.floating):
            d = quantize_log4(a)
        else:
            out[f"x/{key}"] = a
            continue
        for part, arr in d.items():
            out[f"{kind}/{key}/{part}"] = arr
    return out


def restore(arrays: dict, flat_template: dict, opt_template):
    """``(flat float32 parameters, optimizer state)`` from ``compress``'s arrays, shaped like
    the templates (names and shapes checked, every array consumed)."""
    used = set()

    def take(name):
        if name not in arrays:
            raise KeyError(f"compact training state lacks {name}")
        used.add(name)
        return np.asarray(arrays[name])

    flat = {}
    for name, t in flat_template.items():
        bits = take(f"p/{name}")
        if bits.shape != tuple(np.shape(t)):
            raise ValueError(f"compact state: {name} has shape {bits.shape}, the run's drafter "
                             f"{tuple(np.shape(t))}")
        flat[name] = jnp.asarray(bits.view(ml_dtypes.bfloat16).astype(np.float32))
    leaves = []
    paths, treedef = jax.tree_util.tree_flatten_with_path(opt_template)
    for path, t in paths:
        key, kind = _key(path), _moment(path)
        shape, dtype = np.shape(t), np.asarray(t).dtype
        if kind and np.issubdtype(dtype, np.floating):
            parts = ("q", "scale") if kind == "mu" else ("q", "lo", "hi")
            d = {p: take(f"{kind}/{key}/{p}") for p in parts}
            a = (dequantize_int8 if kind == "mu" else dequantize_log4)(d, shape)
        else:
            a = take(f"x/{key}")
        leaves.append(jnp.asarray(a, dtype))
    extra = sorted(set(arrays) - used)
    if extra:
        raise ValueError(f"compact state has arrays the run does not: {extra[:5]}")
    return flat, jax.tree_util.tree_unflatten(treedef, leaves)


def roundtrip(flat: dict, opt_state):
    """``restore(compress(...))``: the state a run resumed from committed files holds."""
    return restore(compress(flat, opt_state), flat, opt_state)


def nbytes(arrays: dict) -> int:
    return int(sum(np.asarray(a).nbytes for a in arrays.values()))
