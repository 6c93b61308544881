"""Dequantisation of the MXFP4 expert weights gpt-oss is released with (NumPy, no torch).

A released gpt-oss checkpoint stores each expert projection ``P`` (``gate_up_proj``,
``down_proj``) of layer ``l`` as two uint8 tensors:

- ``model.layers.{l}.mlp.experts.{P}_blocks`` ``[experts, rows, cols / 32, 16]``: FP4 (e2m1)
  codes, two per byte, the low nibble first (value ``2j`` of a block is ``byte[j] & 0xF``,
  value ``2j + 1`` is ``byte[j] >> 4``);
- ``model.layers.{l}.mlp.experts.{P}_scales`` ``[experts, rows, cols / 32]``: one E8M0 scale
  per block of 32 values, the exponent biased by 127 (a block's values are multiplied by
  ``2 ** (scale - 127)``).

``rows x cols`` is the projection's ``[out, in]`` matrix: ``[2I, H]`` for ``gate_up_proj`` (gate
and up rows interleaved: gate = even rows, up = odd rows), ``[H, I]`` for ``down_proj``.
transformers' dequantised model (``convert_moe_packed_tensors``) keeps the transposed
``[experts, in, out]``; ``dequantize_mxfp4(..., layout="out_in")`` gives our modules' layout
(``model/moe.py``) without the transpose.

The whole tensor is dequantised at once: float32 scratch of ``4 x rows x cols`` bytes per
expert tensor (gpt-oss-120b's ``gate_up_proj``: 8.5 GB a layer); convert a layer at a time.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

# The 16 FP4 e2m1 values by code: sign bit 3, then 2 exponent bits and 1 mantissa bit.
FP4_E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                            -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)
SCALE_BIAS = 127      # E8M0: 2 ** (scale - 127)
BLOCK_SIZE = 32       # values per scale (16 bytes)
LAYOUTS = ("transformers", "out_in")


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray, dtype=np.float32,
                     layout: str = "transformers") -> np.ndarray:
    """The real-valued matrices of MXFP4 ``blocks [..., rows, G, 16]`` (uint8) and
    ``scales [..., rows, G]`` (uint8), ``cols = 32 G``.

    ``layout="transformers"``: ``[..., cols, rows]``, what ``convert_moe_packed_tensors`` returns
    and ``GptOssExperts`` holds (``gate_up_proj [experts, H, 2I]``, ``down_proj [experts, I,
    H]``); ``"out_in"``: ``[..., rows, cols]`` as stored (``[experts, 2I, H]``, ``[experts, H,
    I]``), what ``moe.gpt_oss_expert_params(..., transposed=False)`` takes. ``dtype``: float32
    or bfloat16 (``ml_dtypes.bfloat16`` = ``jnp.bfloat16``); each value is
    ``FP4 x 2 ** (scale - 127)``, exact in float32, then rounded to ``dtype``."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    blocks = np.asarray(blocks)
    scales = np.asarray(scales)
    if blocks.dtype != np.uint8 or scales.dtype != np.uint8:
        raise ValueError(f"MXFP4 blocks and scales are uint8, got {blocks.dtype} and "
                         f"{scales.dtype}")
    if blocks.ndim < 3 or blocks.shape[-1] != BLOCK_SIZE // 2 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"blocks {blocks.shape} and scales {scales.shape} are not an MXFP4 "
                         f"pair [..., rows, G, {BLOCK_SIZE // 2}] / [..., rows, G]")
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)):
        raise ValueError(f"dtype must be float32 or bfloat16, got {dtype}")
    *lead, rows, groups, nbytes = blocks.shape
    values = np.empty((*lead, rows, groups, 2 * nbytes), np.float32)
    values[..., 0::2] = FP4_E2M1_VALUES[blocks & 0x0F]
    values[..., 1::2] = FP4_E2M1_VALUES[blocks >> 4]
    exponent = scales.astype(np.int32) - SCALE_BIAS
    with np.errstate(over="ignore"):   # |value| >= 2 at scale 254: inf, as in torch
        out = np.ldexp(values, exponent[..., None]).reshape(*lead, rows, groups * 2 * nbytes)
    if layout == "transformers":
        out = np.swapaxes(out, -1, -2)
    return np.ascontiguousarray(out.astype(dtype, copy=False))
