"""Top-M expansion of one popped DominoTree node (SPEC §4, conditional children).

For a node at depth ``d`` with GRU state ``s``, given the depth's candidate logits
``base_C = base_d[C_d]`` ``[M]`` and gathered projection rows ``W2_C = W2[C_d]`` ``[M, E]``:

    h  = SiLU(W1 · [z_d ; s])            [E]
    c  = base_C + W2_C · h               [M]
    lp = log_softmax(c)                  [M]
    (idx, lp_k) = top-k(lp)              [k]  (equal values: lower index first)

``idx`` indexes into ``C_d``; the caller maps it to token ids.

The product ``W1 · [z ; s]`` is evaluated split as ``a + W1s · s`` with ``a = W1[:, :H] · z`` and
``W1s = W1[:, H:]``: ``a`` depends only on the depth, so the tree builder computes it once per
round for all depths, and each pop only pays the ``E x G`` and ``M x E`` matvecs. Every path in
this module (jnp twin, Pallas kernel) and the NumPy reference use the same split.

Entry points:
- ``topm_expand(z_H, s_G, w1_EHG, base_M, w2_ME, k, *, use_pallas="auto", interpret=False)``
- ``topm_expand_jnp`` / ``topm_expand_pallas``: the two twins with the same signature.
- ``split_projection``, ``pad_operands``, ``expand_split``: the split form used by the builder
  (which pads the per-round operands once instead of once per pop).

The Pallas kernel is a single program (grid of 1; a vmapped call gets one program per batch
row): it loops over ``E`` in blocks (a ``[BE, G]`` tile of W1s and an ``[M, BE]`` tile of W2_C per
step; the matvecs are elementwise products + row sums in float32, not ``dot``, which on GPU
needs >= 16-row tiles and may use TF32), then does the log-softmax and ``k`` rounds of
max-and-mask for the top-k (``k <= 16``). All dims are padded to powers of two (>= 16) as Triton
requires: ``M`` with ``-inf`` logits and zero rows, ``E`` and ``G`` with zeros (``SiLU(0) = 0``,
so padded ``E`` lanes contribute nothing). The call passes Triton ``CompilerParams``, which
selects the Pallas-Triton backend (jax's GPU default is Mosaic GPU). The Pallas->Triton lowering
is exercised on CPU by lowering for ``cuda`` (tests/test_pallas_topm.py); compiling and running
it needs a GPU (``pallas_kernels/gpu_check.py``).

Numerics: the kernel and the jnp twin agree to float rounding (different summation order and a
``1/(1+exp(-x))`` sigmoid on Triton); indices agree unless two candidates are within rounding.
The jnp twin uses ``Precision.HIGHEST`` so that GPU runs do not silently use TF32.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

_HIGHEST = jax.lax.Precision.HIGHEST
_MIN_DIM = 16          # smallest padded extent of any kernel dim
_TILE_ELEMS = 8192     # elements per loaded tile (~64 f32 registers per thread at 4 warps)
MAX_KERNEL_TOPK = 16   # the kernel's top-k is k unrolled rounds of max-and-mask
MAX_KERNEL_M = 1024    # one program holds all M logits; "auto" uses jnp beyond this


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _padded(n: int) -> int:
    return max(_MIN_DIM, _next_pow2(n))


def _matvec(w_OI: jax.Array, x_I: jax.Array) -> jax.Array:
    """``w @ x`` over the last axis of ``x`` (leading dims of ``w`` kept)."""
    return jnp.einsum("...oi,i->...o", w_OI, x_I, precision=_HIGHEST)


def resolve_use_pallas(use_pallas) -> tuple[bool, bool]:
    """Map ``"auto" | True | False | "interpret"`` to ``(use_kernel, interpret)``."""
    if use_pallas == "auto":
        return jax.default_backend() == "gpu", False
    if use_pallas == "interpret":
        return True, True
    if use_pallas in (True, False):
        return bool(use_pallas), False
    raise ValueError(f"use_pallas must be 'auto', True, False or 'interpret', got {use_pallas!r}")


# ----------------------------------------------------------------------------- split form

def split_projection(z_sH: jax.Array, w1_EHG: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(a = W1[:, :H] · z  [..., E], W1s = W1[:, H:]  [E, G])`` in float32."""
    H = z_sH.shape[-1]
    w1 = w1_EHG.astype(jnp.float32)
    a_sE = jnp.einsum("eh,...h->...e", w1[:, :H], z_sH.astype(jnp.float32), precision=_HIGHEST)
    return a_sE, w1[:, H:]


def expand_split_jnp(a_E, s_G, w1s_EG, base_M, w2_ME, k: int):
    """jnp twin of the kernel on split operands → ``(idx [k] int32, lp [k] float32)``."""
    h_E = jax.nn.silu(a_E + _matvec(w1s_EG, s_G))
    c_M = base_M + _matvec(w2_ME, h_E)
    lp_k, idx_k = jax.lax.optimization_barrier(jax.lax.top_k(jax.nn.log_softmax(c_M), k))
    return idx_k.astype(jnp.int32), lp_k


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
    Ep = a_ref.shape[0]
    Mp = base_ref.shape[0]
    Kp = idx_ref.shape[0]
    s_G = s_ref[...]

    def e_block(j, c_M):
        e0 = pl.multiple_of(j * block_e, block_e)
        w1_BG = w1s_ref[pl.ds(e0, block_e), :]
        pre_B = a_ref[pl.ds(e0, block_e)] + jnp.sum(w1_BG * s_G[None, :], axis=1)
        h_B = pre_B * jax.nn.sigmoid(pre_B)
        w2_MB = w2_ref[:, pl.ds(e0, block_e)]
        return c_M + jnp.sum(w2_MB * h_B[None, :], axis=1)

    c_M = jax.lax.fori_loop(0, Ep // block_e, e_block, jnp.zeros((Mp,), jnp.float32))
    c_M = base_ref[...] + c_M
    shifted = c_M - jnp.max(c_M)
    lp_M = shifted - jnp.log(jnp.sum(jnp.exp(shifted)))

    iota_M = jax.lax.broadcasted_iota(jnp.int32, (Mp,), 0)
    iota_K = jax.lax.broadcasted_iota(jnp.int32, (Kp,), 0)
    taken_M = iota_M < 0
    idx_K = jnp.zeros((Kp,), jnp.int32)
    val_K = jnp.full((Kp,), -jnp.inf, jnp.float32)
    for r in range(k):  # k <= 16 rounds of max-and-mask; lowest index wins ties
        best = jnp.max(jnp.where(taken_M, -jnp.inf, lp_M))
        pick = jnp.min(jnp.where((lp_M == best) & ~taken_M, iota_M, Mp))
        taken_M = taken_M | (iota_M == pick)
        idx_K = jnp.where(iota_K == r, pick, idx_K)
        val_K = jnp.where(iota_K == r, best, val_K)
    idx_ref[...] = idx_K
    lp_ref[...] = val_K


def expand_padded_pallas(a_E, s_G, w1s_EG, base_M, w2_ME, k: int, *, interpret: bool = False):
    """Run the kernel on operands already padded by ``pad_operands`` (``s`` padded here)."""
    Ep, Gp = w1s_EG.shape
    Mp = base_M.shape[-1]
    if not 1 <= k <= MAX_KERNEL_TOPK:
        raise ValueError(f"kernel supports 1 <= k <= {MAX_KERNEL_TOPK}, got {k}")
    s_G = jnp.pad(s_G.astype(jnp.float32), (0, Gp - s_G.shape[-1]))
    block_e = min(Ep, max(_MIN_DIM, _next_pow2(_TILE_ELEMS // max(Gp, Mp) + 1) // 2))
    Kp = _padded(k)
    idx_K, lp_K = pl.pallas_call(
        functools.partial(_kernel, k=k, block_e=block_e),
        out_shape=(jax.ShapeDtypeStruct((Kp,), jnp.int32),
                   jax.ShapeDtypeStruct((Kp,), jnp.float32)),
        # explicit Triton params select the Triton backend (not Mosaic GPU, jax's GPU default)
        compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
    )(a_E, s_G, w1s_EG, base_M, w2_ME)
    return idx_K[:k], lp_K[:k]


def expand_split(a_E, s_G, w1s_EG, base_M, w2_ME, k: int, *, use_pallas="auto",
                 interpret: bool = False, prepadded: bool = False):
    """Split-form expansion; ``prepadded`` says the operands came from ``pad_operands``."""
    use_kernel, interp = resolve_use_pallas(use_pallas)
    if not use_kernel:
        if prepadded:
            raise ValueError("prepadded operands are only for the Pallas path")
        return expand_split_jnp(a_E, s_G, w1s_EG, base_M, w2_ME, k)
    if k > base_M.shape[-1]:
        raise ValueError("k must not exceed M")
    if not prepadded:
        a_E, w1s_EG, base_M, w2_ME = pad_operands(a_E, w1s_EG, base_M, w2_ME)
    return expand_padded_pallas(a_E, s_G, w1s_EG, base_M, w2_ME, k, interpret=interpret or interp)


# ----------------------------------------------------------------------------- public twins

def topm_expand_jnp(z_H, s_G, w1_EHG, base_M, w2_ME, k: int):
    """jnp reference path → ``(idx [k] int32 into C, lp [k] float32)``."""
    a_E, w1s_EG = split_projection(z_H, w1_EHG)
    return expand_split_jnp(a_E, s_G.astype(jnp.float32), w1s_EG, base_M.astype(jnp.float32),
                            w2_ME.astype(jnp.float32), k)


def topm_expand_pallas(z_H, s_G, w1_EHG, base_M, w2_ME, k: int, *, interpret: bool = False):
    """Pallas path, same signature and result as ``topm_expand_jnp``."""
    a_E, w1s_EG = split_projection(z_H, w1_EHG)
    a_E, w1s_EG, base_M, w2_ME = pad_operands(a_E, w1s_EG, base_M, w2_ME)
    return expand_padded_pallas(a_E, s_G, w1s_EG, base_M, w2_ME, k, interpret=interpret)


def topm_expand(z_H, s_G, w1_EHG, base_M, w2_ME, k: int, *, use_pallas="auto",
                interpret: bool = False):
    """Top-M expansion of one node; Pallas on GPU (``"auto"``) or when asked, jnp otherwise."""
    use_kernel, interp = resolve_use_pallas(use_pallas)
    if use_kernel:
        return topm_expand_pallas(z_H, s_G, w1_EHG, base_M, w2_ME, k, interpret=interpret or interp)
    return topm_expand_jnp(z_H, s_G, w1_EHG, base_M, w2_ME, k)
