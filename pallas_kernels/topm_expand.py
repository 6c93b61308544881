"""Pallas kernel for the top-M expansion of one popped DominoTree node (docs/algorithm.md §4).

For a node at depth ``d`` with GRU state ``s``, given the depth's split projection
``a = W1[:, :H]·z_d`` ``[E]``, ``W1s = W1[:, H:]`` ``[E, G]``, the candidate logits
``base_C = base_d[C_d]`` ``[M]`` and the gathered rows ``W2_C = W2[C_d]`` ``[M, E]``:

    h  = SiLU(a + W1s · s)               [E]
    c  = base_C + W2_C · h               [M]
    lp = log_softmax(c)                  [M]
    (idx, lp_k) = top-k(lp)              [k]  (equal values: lower index first)

``idx`` indexes into ``C_d``; the caller maps it to token ids. This package is a leaf: it
imports nothing from ``dominotree_jax``; the head's pieces (``split_projection``) and the jnp
twin live in ``dominotree_jax/domino_head.py``.

Entry points: ``expand_pallas`` (split operands, padded here or by ``pad_operands`` once per
round; ``kernel=`` one of ``KERNELS``), ``pad_operands``, ``resolve_use_pallas`` (``True``
forces the kernel; ``"auto"`` takes the jnp twin everywhere: on an H200 the one-program kernel
measured slower, see ``resolve_use_pallas``), ``kernel_compiles_on`` (CUDA compute capability
>= 8.0: where ``True`` can run).

Two kernels (``KERNELS``), the same arithmetic:

- ``"grid"`` (the default): two launches. The first runs one program per block of ``E``
  (``block_e`` rows of W1s and columns of W2_C: the weights' reads spread over the chip's
  multiprocessors) and writes each block's share of ``W2_C · h`` ``[M]``; the second, one
  program, sums the shares, adds ``base_C`` and does the log-softmax and top-k.
- ``"single"``: one program (grid of 1) looping over ``E`` in blocks, then the log-softmax and
  top-k. On an H200 it measured slower than the jnp twin (``resolve_use_pallas``): one
  streaming multiprocessor reads every weight.

A vmapped call adds a leading grid axis over the batch rows. The matvecs are elementwise
products + row sums in float32, not ``dot``, which on GPU needs >= 16-row tiles and may use
TF32; the top-k is ``k`` rounds of max-and-mask (``k <= 16``). All dims are padded to powers
of two (>= 16) as Triton requires: ``M`` with ``-inf`` logits and zero rows, ``E`` and ``G``
with zeros (``SiLU(0) = 0``, so padded ``E`` lanes contribute nothing). The calls pass Triton
``CompilerParams``, which selects the Pallas-Triton backend (jax's GPU default is Mosaic GPU).
The Pallas->Triton lowering is exercised on CPU by lowering for ``cuda``
(tests/test_pallas_topm.py); compiling and running it needs a GPU (``benchmarks/gpu/kernel.py``).

Numerics: the kernel and the jnp twin agree to float rounding (different summation order and a
``1/(1+exp(-x))`` sigmoid on Triton); indices agree unless two candidates are within rounding.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

_MIN_DIM = 16          # smallest padded extent of any kernel dim
_TILE_ELEMS = 8192     # elements per loaded tile (~64 f32 registers per thread at 4 warps)
MAX_KERNEL_TOPK = 16   # the kernel's top-k is k unrolled rounds of max-and-mask


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _padded(n: int) -> int:
    return max(_MIN_DIM, _next_pow2(n))


# XLA hands Triton kernels only to CUDA devices of compute capability >= 8.0 (Ampere); on a T4
# (7.5), as on Colab, the kernel does not compile (use_pallas=True fails there).
MIN_COMPUTE_CAPABILITY = (8, 0)


def kernel_compiles_on(platform: str, compute_capability) -> bool:
    """Whether the Triton kernel compiles on a device of ``platform`` (``"cuda"``, ``"rocm"``,
    ``"cpu"``, ``"tpu"``, ...) and CUDA ``compute_capability`` (``"9.0"``, ``(8, 6)``, None):
    CUDA with capability >= 8.0 only (ROCm is untested: the jnp twin)."""
    if platform != "cuda" or compute_capability is None:
        return False
    parts = (compute_capability if isinstance(compute_capability, tuple)
             else str(compute_capability).split("."))
    try:
        major, minor = int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except (ValueError, IndexError):
        return False
    return (major, minor) >= MIN_COMPUTE_CAPABILITY


def device_platform(device) -> str:
    """``"cuda"`` / ``"rocm"`` for a jax GPU device (jax calls both ``"gpu"``), else its
    platform."""
    if device.platform != "gpu":
        return device.platform
    version = str(getattr(device.client, "platform_version", "")).lower()
    return "rocm" if "rocm" in version or "hip" in version else "cuda"


def default_device_compiles_kernel() -> bool:
    """``kernel_compiles_on`` for jax's default device."""
    device = jax.devices()[0]
    return kernel_compiles_on(device_platform(device),
                              getattr(device, "compute_capability", None))


def resolve_use_pallas(use_pallas) -> tuple[bool, bool]:
    """Map ``"auto" | True | False | "interpret"`` to ``(use_kernel, interpret)``.

    ``"auto"`` is the jnp twin on every device. Measured on an H200 (jax 0.11.2, 2026-12-04,
    ``benchmarks/results/gpu/``): at the Qwen3-4B Domino head's shapes (M 64, k 8) one pop took
    67.8 us with the one-program kernel (now ``kernel="single"``) and 48.5 us with the twin, a
    whole tree build 1.70 vs 1.04 ms, and DominoTree's round 7.20 vs 6.57 ms; the 8B and
    SmolLM2 heads' pops and builds were slower with it too. The grid kernel that ``True`` now
    runs (CUDA compute capability >= 8.0, ``kernel_compiles_on``) has not been timed on a GPU
    yet; ``"interpret"`` runs it anywhere, slowly."""
    if use_pallas == "auto":
        return False, False
    if use_pallas == "interpret":
        return True, True
    if use_pallas in (True, False):
        return bool(use_pallas), False
    raise ValueError(f"use_pallas must be 'auto', True, False or 'interpret', got {use_pallas!r}")


def pad_operands(a_sE, w1s_EG, base_sM, w2_sME):
    """Pad the kernel operands' trailing dims to powers of two (>= 16); leading dims kept.

    ``M`` padding uses ``-inf`` logits (never chosen before a real candidate) and zero W2 rows;
    ``E`` and ``G`` padding uses zeros.
    """
    E, G = w1s_EG.shape
    M = base_sM.shape[-1]
    Ep, Gp, Mp = _padded(E), _padded(G), _padded(M)
    f32 = jnp.float32

    def pad_last(x, sizes, value=0.0):
        tail = x.shape[x.ndim - len(sizes):]
        widths = [(0, 0)] * (x.ndim - len(sizes)) + [(0, p - n) for n, p in zip(tail, sizes)]
        return jnp.pad(x.astype(f32), widths, constant_values=value)

    return (pad_last(a_sE, (Ep,)), pad_last(w1s_EG, (Ep, Gp)),
            pad_last(base_sM, (Mp,), -jnp.inf), pad_last(w2_sME, (Mp, Ep)))


def _kernel(a_ref, s_ref, w1s_ref, base_ref, w2_ref, idx_ref, lp_ref, *, k: int, block_e: int):
    """The ``"single"`` kernel: one program over every block of ``E``."""
    Ep = a_ref.shape[0]
    Mp = base_ref.shape[0]
    s_G = s_ref[...]

    def e_block(j, c_M):   # one tile of ``block_e`` entries of E
        e0 = pl.multiple_of(j * block_e, block_e)
        w1_EG = w1s_ref[pl.ds(e0, block_e), :]
        pre_E = a_ref[pl.ds(e0, block_e)] + jnp.sum(w1_EG * s_G[None, :], axis=1)
        h_E = pre_E * jax.nn.sigmoid(pre_E)
        w2_ME = w2_ref[:, pl.ds(e0, block_e)]
        return c_M + jnp.sum(w2_ME * h_E[None, :], axis=1)

    c_M = jax.lax.fori_loop(0, Ep // block_e, e_block, jnp.zeros((Mp,), jnp.float32))
    _log_softmax_top_k(base_ref[...] + c_M, k, idx_ref, lp_ref)


def _log_softmax_top_k(c_M, k: int, idx_ref, lp_ref):
    """Write the top ``k`` of ``log_softmax(c_M)`` (lowest index first among equals) to
    ``idx_ref`` / ``lp_ref`` (``kp >= k`` entries; the rest index 0 with ``-inf``)."""
    Mp = c_M.shape[0]
    kp = idx_ref.shape[0]
    shifted = c_M - jnp.max(c_M)
    lp_M = shifted - jnp.log(jnp.sum(jnp.exp(shifted)))

    iota_M = jax.lax.broadcasted_iota(jnp.int32, (Mp,), 0)
    iota_kp = jax.lax.broadcasted_iota(jnp.int32, (kp,), 0)
    taken_M = iota_M < 0
    idx_kp = jnp.zeros((kp,), jnp.int32)
    val_kp = jnp.full((kp,), -jnp.inf, jnp.float32)
    for r in range(k):  # k <= 16 rounds of max-and-mask; lowest index wins ties
        best = jnp.max(jnp.where(taken_M, -jnp.inf, lp_M))
        pick = jnp.min(jnp.where((lp_M == best) & ~taken_M, iota_M, Mp))
        taken_M = taken_M | (iota_M == pick)
        idx_kp = jnp.where(iota_kp == r, pick, idx_kp)
        val_kp = jnp.where(iota_kp == r, best, val_kp)
    idx_ref[...] = idx_kp
    lp_ref[...] = val_kp


def _share_kernel(a_ref, s_ref, w1s_ref, w2_ref, share_ref, *, block_g: int):
    """The ``"grid"`` kernel's first launch, one program per block of ``E``: its rows' share
    ``W2_C[:, block] · SiLU(a[block] + W1s[block] · s)`` ``[1, M]``; ``W1s · s`` in tiles of
    ``block_g`` columns."""
    block_e, Gp = w1s_ref.shape

    def g_block(j, pre_E):
        g0 = pl.multiple_of(j * block_g, block_g)
        return pre_E + jnp.sum(w1s_ref[:, pl.ds(g0, block_g)] * s_ref[pl.ds(g0, block_g)][None, :],
                               axis=1)

    pre_E = jax.lax.fori_loop(0, Gp // block_g, g_block, a_ref[...])
    h_E = pre_E * jax.nn.sigmoid(pre_E)
    share_ref[...] = jnp.sum(w2_ref[...] * h_E[None, :], axis=1)[None, :]


def _top_k_kernel(share_ref, base_ref, idx_ref, lp_ref, *, k: int):
    """The ``"grid"`` kernel's second launch (one program): the shares summed, then
    log-softmax and top-k."""
    _log_softmax_top_k(base_ref[...] + jnp.sum(share_ref[...], axis=0), k, idx_ref, lp_ref)


KERNELS = ("grid", "single")
NUM_WARPS, NUM_STAGES = 4, 1  # Triton launch settings (the GPU suite's kernel check times others)


def _block(limit: int, other: int) -> int:
    """The largest power of two <= ``limit`` whose tile with ``other`` stays within
    ``_TILE_ELEMS`` elements, at least ``_MIN_DIM``."""
    return min(limit, max(_MIN_DIM, _next_pow2(_TILE_ELEMS // other + 1) // 2))


def expand_padded_pallas(a_E, s_G, w1s_EG, base_M, w2_ME, k: int, *, interpret: bool = False,
                         kernel: str = "grid", num_warps: int = NUM_WARPS,
                         num_stages: int = NUM_STAGES):
    """Run ``kernel`` (``KERNELS``) on operands already padded by ``pad_operands`` (``s``
    padded here)."""
    Ep, Gp = w1s_EG.shape
    Mp = base_M.shape[-1]
    if not 1 <= k <= MAX_KERNEL_TOPK:
        raise ValueError(f"kernel supports 1 <= k <= {MAX_KERNEL_TOPK}, got {k}")
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    s_G = jnp.pad(s_G.astype(jnp.float32), (0, Gp - s_G.shape[-1]))
    kp = _padded(k)
    # explicit Triton params select the Triton backend (not Mosaic GPU, jax's GPU default)
    params = pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)
    top_k_shapes = (jax.ShapeDtypeStruct((kp,), jnp.int32),
                    jax.ShapeDtypeStruct((kp,), jnp.float32))
    if kernel == "single":
        idx_kp, lp_kp = pl.pallas_call(
            functools.partial(_kernel, k=k, block_e=_block(Ep, max(Gp, Mp))),
            out_shape=top_k_shapes, compiler_params=params, interpret=interpret,
        )(a_E, s_G, w1s_EG, base_M, w2_ME)
        return idx_kp[:k], lp_kp[:k]
    block_e = min(Ep, _MIN_DIM)         # rows of E per program: as many programs as possible
    block_g = _block(Gp, block_e)       # W1s read in [block_e, block_g] tiles
    blocks = Ep // block_e              # both powers of two
    share_NM = pl.pallas_call(
        functools.partial(_share_kernel, block_g=block_g),
        grid=(blocks,),
        in_specs=[pl.BlockSpec((block_e,), lambda j: (j,)),
                  pl.BlockSpec((Gp,), lambda j: (0,)),
                  pl.BlockSpec((block_e, Gp), lambda j: (j, 0)),
                  pl.BlockSpec((Mp, block_e), lambda j: (0, j))],
        out_specs=pl.BlockSpec((1, Mp), lambda j: (j, 0)),
        out_shape=jax.ShapeDtypeStruct((blocks, Mp), jnp.float32),
        compiler_params=params, interpret=interpret,
    )(a_E, s_G, w1s_EG, w2_ME)
    idx_kp, lp_kp = pl.pallas_call(
        functools.partial(_top_k_kernel, k=k), out_shape=top_k_shapes, compiler_params=params,
        interpret=interpret,
    )(share_NM, base_M)
    return idx_kp[:k], lp_kp[:k]


def expand_pallas(a_E, s_G, w1s_EG, base_M, w2_ME, k: int, *, interpret: bool = False,
                  prepadded: bool = False, kernel: str = "grid", num_warps: int = NUM_WARPS,
                  num_stages: int = NUM_STAGES):
    """``kernel`` (``KERNELS``) on split operands → ``(idx [k] int32, lp [k] float32)``;
    ``prepadded`` says the operands already came from ``pad_operands`` (the tree builder pads
    once per round)."""
    if k > base_M.shape[-1]:
        raise ValueError(f"k={k} must not exceed M={base_M.shape[-1]}")
    if not prepadded:
        a_E, w1s_EG, base_M, w2_ME = pad_operands(a_E, w1s_EG, base_M, w2_ME)
    return expand_padded_pallas(a_E, s_G, w1s_EG, base_M, w2_ME, k, interpret=interpret,
                                kernel=kernel, num_warps=num_warps, num_stages=num_stages)
