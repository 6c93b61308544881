"""Building blocks shared by the target and the drafter: Linear, RMSNorm, RoPE, attention, MLP.

Weights keep the checkpoints' ``[out, in]`` layout: on CPU ``x @ W.T`` with ``W [V, H]`` is up
to 1.7x faster than the transposed layout for the few-row products of verification
(``shared/MEASUREMENTS.md``), and converters need no transposes.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dominotree_jax.linalg import matmul_t
from dominotree_jax.model.cache import value_dtype, view_layer
from dominotree_jax.sharding import declare

_INIT_STD = 0.02


class Linear(nnx.Module):
    def __init__(self, in_features: int, out_features: int, *, axes: tuple[str, str],
                 bias: bool = False, dtype=jnp.float32, operand_dtype: str | None = None,
                 rngs: nnx.Rngs):
        """``axes``: the logical axes (``sharding.LOGICAL_AXES``) of the ``[out, in]``
        weight, e.g. ``("heads", "embed")``; the bias takes the first."""
        out_axis, in_axis = axes
        self.weight = nnx.Param(
            _INIT_STD * jax.random.normal(rngs.params(), (out_features, in_features), dtype),
            **declare(out_axis, in_axis))
        self.bias = (nnx.Param(jnp.zeros((out_features,), dtype), **declare(out_axis))
                     if bias else None)
        self.operand_dtype = operand_dtype   # static; None: the weight's dtype

    def __call__(self, x):
        """float32 ``x @ W.T (+ b)``: ``x`` cast to the weight's dtype (or ``operand_dtype``,
        on a float32 view of 16-bit weights) at the product only."""
        y = matmul_t(x, self.weight[...], operand_dtype=self.operand_dtype)
        return y if self.bias is None else y + self.bias[...].astype(y.dtype)


class Embedding(nnx.Module):
    def __init__(self, vocab: int, dim: int, *, dtype=jnp.float32, rngs: nnx.Rngs):
        self.weight = nnx.Param(_INIT_STD * jax.random.normal(rngs.params(), (vocab, dim), dtype),
                                **declare("vocab", "embed"))


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, *, axis: str = "embed", dtype=jnp.float32,
                 offset: float = 0.0):
        """``offset`` (static): the scale is ``offset + weight`` (Qwen3.5's zero-centred
        norms store ``weight`` around 0 and scale by ``1 + weight``)."""
        self.weight = nnx.Param(jnp.full((dim,), 1.0 - offset, dtype), **declare(axis))
        self.eps = eps
        self.offset = offset

    def __call__(self, x):
        """Normalised in float32, returned in float32 (the weight is upcast)."""
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        scale = self.weight[...].astype(jnp.float32)
        return (scale + self.offset if self.offset else scale) * x32


class SwiGLU(nnx.Module):
    def __init__(self, hidden: int, intermediate: int, *, dtype, operand_dtype=None,
                 rngs: nnx.Rngs):
        lin = functools.partial(Linear, dtype=dtype, operand_dtype=operand_dtype, rngs=rngs)
        self.gate_proj = lin(hidden, intermediate, axes=("mlp", "embed"))
        self.up_proj = lin(hidden, intermediate, axes=("mlp", "embed"))
        self.down_proj = lin(intermediate, hidden, axes=("embed", "mlp"))

    def __call__(self, x):
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


# --------------------------------------------------------------------------- RoPE

def rope_inv_freq(head_dim: int, theta: float, rope_scaling, max_position_embeddings: int):
    """Inverse frequencies ``[head_dim // 2]`` (float32) and the cos/sin scale, as HF computes
    them."""
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    pos_freqs = np.float32(theta) ** exponent
    inv_freq = (np.float32(1.0) / pos_freqs).astype(np.float32)
    scale = 1.0
    rs = dict(rope_scaling or ())
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "linear":
        inv_freq = inv_freq / np.float32(rs["factor"])
    elif kind == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old_ctx = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        lo_wavelen, hi_wavelen = old_ctx / lo, old_ctx / hi
        scaled = np.where(wavelen > lo_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < hi_wavelen) & ~(wavelen > lo_wavelen)
        inv_freq = np.where(medium, smoothed, scaled).astype(np.float32)
    elif kind == "yarn":
        factor = rs["factor"]
        old_ctx = rs.get("original_max_position_embeddings") or max_position_embeddings
        beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

        def mscale(f, m=1.0):
            return 0.1 * m * math.log(f) + 1.0 if f > 1 else 1.0

        scale = rs.get("attention_factor")
        if scale is None:
            if rs.get("mscale") and rs.get("mscale_all_dim"):
                scale = mscale(factor, rs["mscale"]) / mscale(factor, rs["mscale_all_dim"])
            else:
                scale = mscale(factor)

        def corr_dim(n_rot):
            return (head_dim * math.log(old_ctx / (n_rot * 2 * math.pi))) / (2 * math.log(theta))

        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if rs.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(head_dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
        extrapolation = 1.0 - ramp
        inv_freq = ((1.0 / (factor * pos_freqs)) * (1 - extrapolation)
                    + (1.0 / pos_freqs) * extrapolation).astype(np.float32)
    elif kind != "default":
        raise ValueError(f"unsupported rope scaling type {kind!r}")
    return inv_freq, float(scale)


def rope_cos_sin(positions, inv_freq, scale: float):
    """cos/sin ``[..., head_dim]`` for integer positions, always in float32."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq, jnp.float32)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb) * scale, jnp.sin(emb) * scale


def apply_rope(x, cos_BTD, sin_BTD):
    """Rotate-half RoPE of ``x [B, T, heads, D]`` (query or kv heads; pairs are (first half,
    second half)), computed and returned in float32. cos/sin narrower than ``D`` (partial
    rotary) rotate the leading dims and pass the rest through."""
    x32 = x.astype(jnp.float32)
    rot = cos_BTD.shape[-1]
    x_rot, x_pass = x32[..., :rot], x32[..., rot:]
    x1, x2 = jnp.split(x_rot, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    out = x_rot * cos_BTD[:, :, None, :] + rotated * sin_BTD[:, :, None, :]
    return out if rot == x32.shape[-1] else jnp.concatenate([out, x_pass], axis=-1)


# --------------------------------------------------------------------------- attention

def attend(q_BTQD, k_BSKD, v_BSKD, mask_BTS, sinks_Q=None):
    """Grouped-query attention of ``T`` queries over ``S`` keys with a boolean mask.

    ``Q`` query heads share ``K`` key/value heads (``Q % K == 0``). Softmax in float32.
    Rows whose mask is all False produce zeros instead of NaN. Products in the keys' dtype
    (queries and probabilities are cast to it), accumulated in float32; float32 output.
    ``sinks_Q``: a logit per query head that joins each softmax's denominator and attends to
    nothing (gpt-oss's attention sinks).
    """
    B, T, Q, D = q_BTQD.shape
    K = k_BSKD.shape[2]
    q = q_BTQD.astype(k_BSKD.dtype).reshape(B, T, K, Q // K, D)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k_BSKD,
                        preferred_element_type=jnp.float32) * (D ** -0.5)
    scores = jnp.where(mask_BTS[:, None, None, :, :], scores, -jnp.inf)
    m = jnp.max(scores, axis=-1, keepdims=True)
    sink = None
    if sinks_Q is not None:
        sink = sinks_Q.astype(jnp.float32).reshape(1, K, Q // K, 1, 1)
        m = jnp.maximum(m, sink)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(scores - m)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    if sink is not None:
        denom = denom + jnp.exp(sink - m)
    p = p / jnp.maximum(denom, 1e-30)
    if v_BSKD.dtype == jnp.float32:
        out = jnp.einsum("bkgts,bskd->btkgd", p, v_BSKD)
        return out.reshape(B, T, Q, D)
    # low precision: heads folded into the rows, one [U, S] x [S, D] product per (batch, kv
    # head) with float32 accumulation (XLA CPU has no bf16 x bf16 -> f32 kernel for the 5-d
    # einsum above when it is not fused)
    S = v_BSKD.shape[1]
    p_BKUS = p.astype(v_BSKD.dtype).reshape(B, K, (Q // K) * T, S)
    out_BKUD = jax.lax.dot_general(p_BKUS, v_BSKD.transpose(0, 2, 1, 3),
                                   (((3,), (2,)), ((0, 1), (0, 1))),
                                   preferred_element_type=jnp.float32)
    return out_BKUD.reshape(B, K, Q // K, T, D).transpose(0, 3, 1, 2, 4).reshape(B, T, Q, D)


def attend_window_sinks(q_BTQD, new_k_BTKD, new_v_BTKD, block_mask_BTT, cache_k_BKSD,
                        cache_v_BKSD, prefix_B, positions_BT, window: int | None, sinks_Q):
    """``attend_cached``'s visibility (cache slots ``< prefix``, new rows by ``block_mask``)
    narrowed to the last ``window`` positions (a sliding-window layer; slot ``s`` holds
    position ``s``), with attention sinks: one dense pass over every cache slot and the new
    rows (gpt-oss's layers; no blockwise or bucketed form yet)."""
    S = cache_k_BKSD.shape[2]
    keys = jnp.concatenate([view_layer(cache_k_BKSD).transpose(0, 2, 1, 3),
                            new_k_BTKD.astype(value_dtype(cache_k_BKSD.dtype))], axis=1)
    values = jnp.concatenate([view_layer(cache_v_BKSD).transpose(0, 2, 1, 3),
                              new_v_BTKD.astype(value_dtype(cache_v_BKSD.dtype))], axis=1)
    slot_S = jnp.arange(S)
    cache_BTS = jnp.broadcast_to((slot_S[None, :] < prefix_B[:, None])[:, None, :],
                                 positions_BT.shape + (S,))
    new_BTT = block_mask_BTT
    if window is not None:
        cache_BTS = cache_BTS & (positions_BT[:, :, None] - slot_S[None, None, :] < window)
        new_BTT = new_BTT & (positions_BT[:, :, None] - positions_BT[:, None, :] < window)
    return attend(q_BTQD, keys, values, jnp.concatenate([cache_BTS, new_BTT], axis=2),
                  sinks_Q)


# Blockwise (flash-style) attention over a KV cache with a structured mask. Query rows are new
# tokens; row ``t`` of batch row ``b`` sees (a) every cache slot ``s < prefix[b]`` and (b) the
# new rows ``j`` with ``block_mask[b, t, j]`` (their keys/values are passed in directly). The
# cache part runs over key blocks with a running max/sum and stops after the last block that
# holds a live slot; no ``[T, S]`` score or mask tensor exists. Heads are folded into the rows
# of each product: per (batch, kv head) one ``[U, D] x [D, block]`` matmul, ``U = T * group``
# folded rows (``group = Q / K`` query heads per kv head; docs/algorithm.md §0).

ATTENTION_BLOCK = 512  # cache slots per key block
# At most this many query rows per kv head (rows x grouped heads: decode and verify) take one
# dense pass over a power-of-two bucket of slots instead of the block loop (no per-block overhead).
DENSE_ROWS = 128
ATTENTION_MODES = ("auto", "bucket", "dense")  # how decode/verify read the cache (attend_cached)


def _fold_queries(q_BTQD, num_kv_heads: int):
    """``[B, T, Q, D]`` -> ``[B, K, U, D]`` with ``U = T * group`` folded rows (row
    ``t * group + g`` of kv head ``k`` is query head ``k * group + g``)."""
    B, T, Q, D = q_BTQD.shape
    group = Q // num_kv_heads
    q = q_BTQD.reshape(B, T, num_kv_heads, group, D).transpose(0, 2, 1, 3, 4)
    return q.reshape(B, num_kv_heads, T * group, D)


def _unfold_rows(o_BKUD, T: int):
    B, K, U, D = o_BKUD.shape
    group = U // T
    return o_BKUD.reshape(B, K, T, group, D).transpose(0, 2, 1, 3, 4).reshape(B, T, K * group, D)


def _scores(q_BKUD, k_BKSD):
    """Scaled float32 scores ``[B, K, U, S]``."""
    s = jax.lax.dot_general(q_BKUD, k_BKSD, (((3,), (3,)), ((0, 1), (0, 1))),
                            preferred_element_type=jnp.float32)
    return s * (q_BKUD.shape[-1] ** -0.5)


def _online_step(state, s, visible, v_BKSD, slot_axis: int = 3, fused: bool = False):
    """One key block of the running softmax: state ``(max, sum, acc)`` in float32, each
    ``[B, K, U, ...]``. The scores ``s`` are ``[B, K, U, S]`` (``slot_axis`` 3) or
    ``[B, K, S, U]`` (``slot_axis`` 2: slot-major, see ``SLOT_MAJOR_ROWS``). ``fused`` (slot-major
    only): the values' product as an elementwise product summed over the slots, no dot."""
    m_BKU1, l_BKU1, acc_BKUD = state

    def per_row(x):   # a [B, K, 1, U] reduction over slot-major scores as [B, K, U, 1]
        return x if slot_axis == 3 else jnp.swapaxes(x, 2, 3)
    s = jnp.where(visible, s, -jnp.inf)
    m_new = jnp.maximum(m_BKU1, per_row(jnp.max(s, axis=slot_axis, keepdims=True)))
    m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
    alpha = jnp.exp(m_BKU1 - m_safe)
    p = jnp.exp(s - per_row(m_safe))
    if fused:
        pv_BKUD = jnp.sum(p[..., None] * v_BKSD[:, :, :, None, :].astype(jnp.float32), axis=2)
    else:
        pv_BKUD = jax.lax.dot_general(p.astype(v_BKSD.dtype), v_BKSD,
                                      (((slot_axis,), (2,)), ((0, 1), (0, 1))),
                                      preferred_element_type=jnp.float32)
    return (m_new, l_BKU1 * alpha + per_row(jnp.sum(p, axis=slot_axis, keepdims=True)),
            acc_BKUD * alpha + pv_BKUD)


# A batch of at least SLOT_MAJOR_MIN_BATCH rows with at most SLOT_MAJOR_ROWS folded query rows
# per kv head (decode steps of data collection) reads the cache slots as the *rows* of its score
# product (``[S, U]``, keys as the left operand); everything else takes the usual ``[U, S]``
# layout. Measured (``benchmarks/step/attention_layout.py`` @ 95a294e): on an Intel Xeon the
# ``[U, S]``
# product was 2.1x slower for a whole batch-64 AR step (623 vs 1291 ms at 640 slots), equal at
# batch 1 and faster at batch 16 (181 vs 198 ms); on a Zen 5 ``[U, S]`` is faster at every
# batch up to 16 (a batch-1 step at 4,000 context slots: 24.7 against 27.4 ms; one layer's pass
# at batch 16 and 640 slots 21.5 vs 29.9 ms), the softmax reducing along the contiguous axis.
SLOT_MAJOR_ROWS = 8
SLOT_MAJOR_MIN_BATCH = 32
# ``attend_cached``'s power-of-two buckets stop below ``S / BUCKET_SHARE_MAX`` slots; a longer
# prefix reads the whole cache (the bucket's slice is a copy of the slots it reads, the whole
# cache is read in place inside the ``switch``)
BUCKET_SHARE_MAX = 2
# ``attend_cached(fused=True)``: the cache pass of a few query rows as elementwise products and
# sums (scores: q x k summed over D; values: p x v summed over the slots), which XLA:CPU fuses
# into single passes over the slots instead of batched few-row dots. The slot-refill AR step
# (``TargetModel.forward_cached_groups``, data collection) uses it: a batch-128 SmolLM2 step
# reading 768/640/512/384 slots per group took 579 ms against 647 with the slot-major dots
# (1.12x), the same 340 ms at up to 384 slots (AMD EPYC, 2 cores, 2026-12-03;
# ``benchmarks/step/slot_step.py`` @ 77bcb80). Other paths keep the dots, so their numbers (and the
# T = 0 equality of every method with ``ar``) are unchanged.


def _prefix_step(state, q_BKUD, k_BKSD, v_BKSD, visible_BS, fused: bool = False):
    """One running-softmax step over the cache slots ``k/v [B, K, S, D]`` with
    ``visible [B, S]``, in the score layout that is faster for ``B`` and ``U``
    (``SLOT_MAJOR_ROWS``, ``SLOT_MAJOR_MIN_BATCH``).
    ``fused``: both products as elementwise products and sums (the note above)."""
    if fused:
        s_BKSU = jnp.sum(k_BKSD[:, :, :, None, :].astype(jnp.float32)
                         * q_BKUD[:, :, None, :, :].astype(jnp.float32), axis=-1)
        return _online_step(state, s_BKSU * (q_BKUD.shape[-1] ** -0.5),
                            visible_BS[:, None, :, None], v_BKSD, slot_axis=2, fused=True)
    if q_BKUD.shape[2] <= SLOT_MAJOR_ROWS and q_BKUD.shape[0] >= SLOT_MAJOR_MIN_BATCH:
        s_BKSU = jax.lax.dot_general(k_BKSD, q_BKUD, (((3,), (3,)), ((0, 1), (0, 1))),
                                     preferred_element_type=jnp.float32)
        return _online_step(state, s_BKSU * (q_BKUD.shape[-1] ** -0.5),
                            visible_BS[:, None, :, None], v_BKSD, slot_axis=2)
    return _online_step(state, _scores(q_BKUD, k_BKSD), visible_BS[:, None, None, :], v_BKSD)


def attend_cached(q_BTQD, new_k_BTKD, new_v_BTKD, block_mask_BTT, cache_k_BKSD, cache_v_BKSD,
                  prefix_B, *, block: int | None = None, dense_rows: int | None = None,
                  mode: str = "auto", fused: bool = False):
    """Attention of new rows over the committed cache prefix and the new rows themselves.

    ``cache_*_BKSD``: one layer's cache ``[B, K, S, D]`` as stored (a bfloat16 layer as its
    bits, ``cache.CACHE_BITS``: each pass views only the slots it reads; a view of the whole
    layer taken outside the bucket ``switch`` made XLA:CPU copy every slot of every layer at
    every step: a bf16 4k-context ``ar`` token 49.6 against 30.2 ms, Zen 4); slots
    ``>= prefix[b]`` are never read into the result (and key blocks past ``max(prefix)`` are
    not computed). ``block_mask_BTT``:
    which new rows each new row sees (causal for a prompt chunk, ancestors for a tree).
    Float32 softmax; a row that sees nothing gives zeros, as ``attend``. ``block``: key slots per
    block (default ``ATTENTION_BLOCK``). With at most ``dense_rows`` (default ``DENSE_ROWS``)
    folded query rows (decode, verify) the prefix is one dense pass; ``mode`` says over what:

    - ``"bucket"``: the first ``block * 2^i`` slots, the smallest such bucket that holds
      ``max(prefix)`` (a ``lax.switch``, one branch per bucket: cheap on a CPU, but on XLA:GPU
      every conditional makes the host wait for the device);
    - ``"dense"``: all ``S`` slots, masked (no conditional);
    - ``"auto"`` (default): ``"dense"`` when lowered for a GPU (``cuda``/``rocm``), ``"bucket"``
      otherwise (``lax.platform_dependent``: a program lowered for one platform holds only that
      platform's branch).

    ``fused``: the prefix pass as elementwise products and sums instead of dots (the note above
    ``_prefix_step``; for decode-sized ``U``).
    """
    if mode not in ATTENTION_MODES:
        raise ValueError(f"attention mode must be one of {ATTENTION_MODES}, got {mode!r}")
    block = ATTENTION_BLOCK if block is None else block
    dense_rows = DENSE_ROWS if dense_rows is None else dense_rows
    B, T, Q, D = q_BTQD.shape
    K = new_k_BTKD.shape[2]
    group = Q // K
    S = cache_k_BKSD.shape[2]
    q_BKUD = _fold_queries(q_BTQD, K)
    U = T * group
    state = (jnp.full((B, K, U, 1), -jnp.inf, jnp.float32), jnp.zeros((B, K, U, 1), jnp.float32),
             jnp.zeros((B, K, U, D), jnp.float32))
    # (b) the new rows: a small [U, T] block
    vis_B1UT = jnp.broadcast_to(block_mask_BTT[:, :, None, :],
                                (B, T, group, T)).reshape(B, 1, U, T)
    new_k_BKTD = new_k_BTKD.transpose(0, 2, 1, 3)
    new_v_BKTD = new_v_BTKD.transpose(0, 2, 1, 3)
    state = _online_step(state, _scores(q_BKUD, new_k_BKTD), vis_B1UT, new_v_BKTD)

    # (a) the committed prefix, in key blocks
    blk = min(block, S)
    if blk == S:
        live_BS = jnp.arange(S)[None, :] < prefix_B[:, None]
        state = _prefix_step(state, q_BKUD, view_layer(cache_k_BKSD), view_layer(cache_v_BKSD),
                             live_BS, fused)
    elif U <= dense_rows:   # decode, verify
        # the first bucket always (a switch of one branch would be no conditional, and a read
        # of the whole loop-carried cache outside one makes XLA copy it every step), then
        # powers of two below S / BUCKET_SHARE_MAX, then the whole cache
        buckets = [blk]
        width = 2 * blk
        while width * BUCKET_SHARE_MAX < S:
            buckets.append(width)
            width *= 2
        buckets.append(S)

        def dense(width, st):
            live_BS = jnp.arange(width)[None, :] < prefix_B[:, None]
            return _prefix_step(st, q_BKUD, view_layer(cache_k_BKSD[:, :, :width]),
                                view_layer(cache_v_BKSD[:, :, :width]), live_BS, fused)

        def bucketed(st):
            index = jnp.searchsorted(jnp.asarray(buckets), jnp.max(prefix_B), side="left")
            return jax.lax.switch(jnp.minimum(index, len(buckets) - 1),
                                  [functools.partial(dense, width) for width in buckets], st)

        if mode == "auto":
            dense_all = functools.partial(dense, S)
            state = jax.lax.platform_dependent(state, cuda=dense_all, rocm=dense_all,
                                               default=bucketed)
        else:
            state = dense(S, state) if mode == "dense" else bucketed(state)
    else:
        def one_block(i, st):
            lo = i * blk
            first = jnp.minimum(lo, S - blk)  # the last block may overlap the one before it
            kb = view_layer(jax.lax.dynamic_slice_in_dim(cache_k_BKSD, first, blk, axis=2))
            vb = view_layer(jax.lax.dynamic_slice_in_dim(cache_v_BKSD, first, blk, axis=2))
            slot = first + jnp.arange(blk)
            live_BS = (slot >= lo)[None, :] & (slot[None, :] < prefix_B[:, None])
            return _prefix_step(st, q_BKUD, kb, vb, live_BS, fused)

        n_blocks = (jnp.max(prefix_B) + blk - 1) // blk
        state = jax.lax.fori_loop(0, n_blocks, one_block, state)
    _, l_BKU1, acc_BKUD = state
    out = acc_BKUD / jnp.where(l_BKU1 > 0, l_BKU1, 1.0)
    return _unfold_rows(out, T).astype(q_BTQD.dtype)


class Attention(nnx.Module):
    """Qwen3/Llama/Qwen2 attention projections (optional q/k RMSNorm, optional qkv bias);
    Qwen3.5's gated attention: ``output_gate`` (``q_proj`` gives each head's query then its
    gate, the output is times ``sigmoid(gate)``) and zero-centred q/k norms (``norm_offset``)."""

    def __init__(self, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int, *,
                 qk_norm: bool, bias: bool, eps: float, dtype, operand_dtype=None,
                 output_gate: bool = False, norm_offset: float = 0.0, sinks: bool = False,
                 output_bias: bool = False, rngs: nnx.Rngs):
        """``sinks``: a learned logit per query head (``sinks [Q]``) joins every softmax's
        denominator (gpt-oss); ``output_bias``: ``o_proj`` has a bias."""
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.output_gate = output_gate
        self.sinks = (nnx.Param(jnp.zeros((num_heads,), dtype), **declare("heads"))
                      if sinks else None)
        lin = functools.partial(Linear, dtype=dtype, operand_dtype=operand_dtype, rngs=rngs)
        q_width = num_heads * head_dim * (2 if output_gate else 1)
        self.q_proj = lin(hidden, q_width, axes=("heads", "embed"), bias=bias)
        self.k_proj = lin(hidden, num_kv_heads * head_dim, axes=("kv_heads", "embed"), bias=bias)
        self.v_proj = lin(hidden, num_kv_heads * head_dim, axes=("kv_heads", "embed"), bias=bias)
        self.o_proj = lin(num_heads * head_dim, hidden, axes=("embed", "heads"), bias=output_bias)
        norm = functools.partial(RMSNorm, head_dim, eps, axis="head_dim", dtype=dtype,
                                 offset=norm_offset)
        self.q_norm = norm() if qk_norm else None
        self.k_norm = norm() if qk_norm else None

    def queries(self, x_BTH, cos, sin):
        return self.queries_and_gate(x_BTH, cos, sin)[0]

    def queries_and_gate(self, x_BTH, cos, sin):
        """Rotated queries ``[B, T, Q, D]`` and the output gate ``[B, T, Q, D]`` (None without
        ``output_gate``)."""
        B, T, _ = x_BTH.shape
        q = self.q_proj(x_BTH)
        gate = None
        if self.output_gate:
            q = q.reshape(B, T, self.num_heads, 2 * self.head_dim)
            q, gate = q[..., :self.head_dim], q[..., self.head_dim:]
        q = q.reshape(B, T, self.num_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        return apply_rope(q, cos, sin), gate

    def keys_values(self, x_BTH, cos, sin):
        """Rotated keys and values ``[B, T, K, D]`` for inputs ``x``."""
        B, T, _ = x_BTH.shape
        k = self.k_proj(x_BTH).reshape(B, T, self.num_kv_heads, self.head_dim)
        if self.k_norm is not None:
            k = self.k_norm(k)
        v = self.v_proj(x_BTH).reshape(B, T, self.num_kv_heads, self.head_dim)
        return apply_rope(k, cos, sin), v

    def output(self, attn_BTQD, gate_BTQD=None):
        B, T = attn_BTQD.shape[:2]
        if gate_BTQD is not None:
            attn_BTQD = attn_BTQD.astype(jnp.float32) * jax.nn.sigmoid(
                gate_BTQD.astype(jnp.float32))
        return self.o_proj(attn_BTQD.reshape(B, T, self.num_heads * self.head_dim))
