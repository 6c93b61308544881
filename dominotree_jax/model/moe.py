"""Mixture-of-experts feed-forward blocks: Qwen3-MoE, Qwen3-Next / Qwen3.5-MoE and gpt-oss.

Each token's router picks ``top_k`` of ``num_experts`` gated MLPs and sums their outputs
weighted by the routing weights. ``SparseMoE`` is the Qwen block (softmax over all experts in
float32, top-k, renormalised when ``norm_topk_prob``; optional sigmoid-gated shared expert);
``GptOssMoE`` is gpt-oss's (top-k of the router logits, softmax over the k; clamped
``(up + 1) * gate * sigmoid(1.702 gate)`` experts with biases).

**Layout.** Expert weights are stacked along a leading expert axis and keep the checkpoints'
``[out, in]`` layout per expert (like ``Linear``); gate and up are separate arrays, so the
``"mlp"`` axis (``I``) splits cleanly for tensor parallelism:

- ``experts.gate_proj`` ``[experts, I, H]``, ``experts.up_proj`` ``[experts, I, H]``,
  ``experts.down_proj`` ``[experts, H, I]``; gpt-oss adds ``experts.gate_proj_bias``
  ``[experts, I]``, ``experts.up_proj_bias`` ``[experts, I]``, ``experts.down_proj_bias``
  ``[experts, H]``;
- a router ``[experts, H]``: ``gate.weight`` (Qwen), ``router.weight`` + ``router.bias
  [experts]`` (gpt-oss);
- Qwen3-Next / Qwen3.5-MoE: ``shared_expert.{gate,up,down}_proj.weight`` (a ``SwiGLU``) and
  ``shared_expert_gate.weight [1, H]``.

Checkpoints map onto them (``stack_expert_tensors``, ``split_gate_up``,
``gpt_oss_expert_params``): per-expert ``mlp.experts.{e}.gate_proj.weight`` (Qwen3-MoE,
Qwen3-Next) stack along the expert axis; a fused ``mlp.experts.gate_up_proj [experts, 2I, H]``
(Qwen3.5-MoE's release, transformers' own save format) is ``[gate; up]`` halves; gpt-oss's is
interleaved (gate = even rows, up = odd rows) and ``mxfp4.dequantize_mxfp4`` gives it from the
released ``_blocks``/``_scales``.

**Three forms** of the expert computation (static ``form``, equal results):

- ``"ragged"``: the token-expert assignments sorted by expert, one grouped product per
  projection (``jax.lax.ragged_dot_general``, group sizes per expert), unsorted and combined.
  A grouped GEMM on GPU; XLA:CPU lowers it to a masked dense product over all experts.
- ``"gather"``: each token's ``k`` experts' weights gathered and applied by ``einsum``: copies
  ``rows x k`` expert matrices.
- ``"by_expert"``: a loop over the distinct experts the rows chose, each expert's matrices
  read once for all rows: the few rows of decoding and verification (``choose_form``).

Precision as ``Linear``: operands in the weights' dtype, products accumulated and returned in
float32, routing and activations in float32; outputs are float32.

Names: ``x_sH`` is ``[..., H]`` (docs/algorithm.md §0); inside, the flattened tokens are
``rows`` and their ``rows x top_k`` token-expert pairs ``assignments``, named in words like the
expert axis (``E``, ``N``, ``k``, ``n`` already have meanings there).
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dominotree_jax.linalg import matmul_t
from dominotree_jax.model.layers import _INIT_STD, SwiGLU
from dominotree_jax.sharding import declare

FORMS = ("ragged", "gather", "by_expert")
ACTIVATIONS = ("silu", "gpt_oss")

# [assignments, in] x [experts, out, in] -> [assignments, out], assignments grouped by expert
_RAGGED_DIMS = jax.lax.RaggedDotDimensionNumbers(
    dot_dimension_numbers=(((1,), (2,)), ((), ())), lhs_ragged_dimensions=[0],
    rhs_group_dimensions=[0])


# rows up to which ``form=None`` loops over the experts the rows chose (decode steps,
# verification: each chosen expert's weights read once); above, the grouped products (prefill
# chunks). One layer of Qwen3-Coder-30B-A3B on an AMD EPYC (Zen 3, 2 cores): a 1-row step
# took 239 ms in the gather form, which copies every row's expert matrices
# (``benchmarks/step/layer_kinds.py`` @ 83bd99a).
SMALL_ROWS_MAX = 64


def choose_form(rows: int) -> str:
    """The expert form for ``rows`` token rows (static)."""
    return "by_expert" if rows <= SMALL_ROWS_MAX else "ragged"


def _normal(rngs: nnx.Rngs, shape, dtype):
    return _INIT_STD * jax.random.normal(rngs.params(), shape, dtype)


class Router(nnx.Module):
    """Router logits ``x @ weight.T (+ bias)`` in float32: ``weight [experts, H]``,
    ``bias [experts]`` (gpt-oss). Also the shared expert's gate (one "expert")."""

    def __init__(self, hidden: int, num_experts: int, *, bias: bool = False,
                 dtype=jnp.float32, rngs: nnx.Rngs):
        self.weight = nnx.Param(_normal(rngs, (num_experts, hidden), dtype),
                                **declare("expert", "embed"))
        self.bias = (nnx.Param(jnp.zeros((num_experts,), dtype), **declare("expert"))
                     if bias else None)

    def __call__(self, x_sH):
        logits = matmul_t(x_sH, self.weight[...])
        return logits if self.bias is None else logits + self.bias[...].astype(jnp.float32)


def softmax_topk(logits, top_k: int, normalize: bool):
    """Qwen routing: softmax over all experts (float32), the ``top_k`` largest, renormalised
    to sum 1 when ``normalize``. Returns ``(weights [..., top_k] float32, expert_ids [...,
    top_k] int32)``; ties go to the lower expert id."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    weights, expert_ids = jax.lax.top_k(probs, top_k)
    if normalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, expert_ids.astype(jnp.int32)


def topk_softmax(logits, top_k: int):
    """gpt-oss routing: the ``top_k`` largest logits, softmax over them (float32)."""
    top, expert_ids = jax.lax.top_k(logits.astype(jnp.float32), top_k)
    return jax.nn.softmax(top, axis=-1), expert_ids.astype(jnp.int32)


class Experts(nnx.Module):
    """``num_experts`` gated MLPs stacked along a leading expert axis, ``[out, in]`` each:
    ``gate_proj``/``up_proj`` ``[experts, I, H]``, ``down_proj`` ``[experts, H, I]``, and with
    ``bias`` ``gate_proj_bias``/``up_proj_bias`` ``[experts, I]``, ``down_proj_bias
    [experts, H]``.

    ``activation``: ``"silu"`` -- ``silu(gate) * up`` (Qwen); ``"gpt_oss"`` -- gate clamped
    above at ``limit``, up to ``[-limit, limit]``, ``(up + 1) * gate * sigmoid(alpha gate)``.
    """

    def __init__(self, num_experts: int, hidden: int, intermediate: int, *,
                 bias: bool = False, activation: str = "silu", alpha: float = 1.702,
                 limit: float = 7.0, dtype=jnp.float32, rngs: nnx.Rngs):
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.num_experts = num_experts
        self.activation, self.alpha, self.limit = activation, float(alpha), float(limit)
        shape_in, shape_out = (num_experts, intermediate, hidden), (num_experts, hidden,
                                                                    intermediate)
        in_axes = declare("expert", "mlp", "embed")
        self.gate_proj = nnx.Param(_normal(rngs, shape_in, dtype), **in_axes)
        self.up_proj = nnx.Param(_normal(rngs, shape_in, dtype), **in_axes)
        self.down_proj = nnx.Param(_normal(rngs, shape_out, dtype),
                                   **declare("expert", "embed", "mlp"))
        zeros = functools.partial(jnp.zeros, dtype=dtype)
        self.gate_proj_bias = (nnx.Param(zeros((num_experts, intermediate)),
                                         **declare("expert", "mlp")) if bias else None)
        self.up_proj_bias = (nnx.Param(zeros((num_experts, intermediate)),
                                       **declare("expert", "mlp")) if bias else None)
        self.down_proj_bias = (nnx.Param(zeros((num_experts, hidden)), **declare("expert", "embed"))
                               if bias else None)

    def _glu(self, gate, up):
        if self.activation == "silu":
            return jax.nn.silu(gate) * up
        gate = jnp.minimum(gate, self.limit)
        up = jnp.clip(up, -self.limit, self.limit)
        return (up + 1.0) * (gate * jax.nn.sigmoid(gate * self.alpha))

    def __call__(self, x, expert_ids, weights, form: str | None = None):
        """``sum_j weights[t, j] * expert_{expert_ids[t, j]}(x[t])`` for rows ``x [rows, H]``,
        ``expert_ids [rows, top_k]`` (int), ``weights [rows, top_k]``: ``[rows, H]`` float32.
        ``form`` None: ``choose_form`` by the rows."""
        form = choose_form(x.shape[0]) if form is None else form
        if form == "by_expert":
            return self._by_expert(x, expert_ids, weights)
        if form == "ragged":
            outputs = self._ragged(x, expert_ids)
        elif form == "gather":
            outputs = self._gather(x, expert_ids)
        else:
            raise ValueError(f"form must be one of {FORMS}, got {form!r}")
        return jnp.sum(outputs * weights.astype(jnp.float32)[..., None], axis=1)

    def _bias(self, bias, expert_ids):
        return 0.0 if bias is None else bias[...][expert_ids].astype(jnp.float32)

    def _ragged(self, x, expert_ids):
        """Each row's ``top_k`` expert outputs ``[rows, top_k, H]`` by grouped products."""
        rows, top_k = expert_ids.shape
        flat = expert_ids.reshape(-1)                   # the assignments, row-major
        order = jnp.argsort(flat, stable=True)          # assignments grouped by expert
        expert = flat[order]
        sizes = jnp.bincount(flat, length=self.num_experts).astype(jnp.int32)
        x_sorted = x[order // top_k]                    # each assignment's row

        def grouped(a, w):
            return jax.lax.ragged_dot_general(a.astype(w.dtype), w, sizes, _RAGGED_DIMS,
                                              preferred_element_type=jnp.float32)
        gate = grouped(x_sorted, self.gate_proj[...]) + self._bias(self.gate_proj_bias, expert)
        up = grouped(x_sorted, self.up_proj[...]) + self._bias(self.up_proj_bias, expert)
        out = grouped(self._glu(gate, up), self.down_proj[...]) + self._bias(
            self.down_proj_bias, expert)
        unsorted = jnp.zeros_like(out).at[order].set(out, unique_indices=True)
        return unsorted.reshape(rows, top_k, -1)

    def _by_expert(self, x, expert_ids, weights):
        """``[rows, H]``: a loop over the distinct experts the rows chose (a dynamic count),
        each expert's matrices sliced once and applied to every row, its output added with
        each row's weight for it (0 where the row did not choose it)."""
        rows, top_k = expert_ids.shape
        chosen = jnp.unique(expert_ids.reshape(-1), size=min(rows * top_k, self.num_experts),
                            fill_value=-1)
        count = jnp.sum(chosen >= 0)
        weights = weights.astype(jnp.float32)

        def one(w, e):
            return jax.lax.dynamic_index_in_dim(w[...], e, axis=0, keepdims=False)

        def bias(b, e):
            return 0.0 if b is None else one(b, e).astype(jnp.float32)

        def body(i, acc):
            e = chosen[i]
            gate = matmul_t(x, one(self.gate_proj, e)) + bias(self.gate_proj_bias, e)
            up = matmul_t(x, one(self.up_proj, e)) + bias(self.up_proj_bias, e)
            out = matmul_t(self._glu(gate, up), one(self.down_proj, e)) + bias(
                self.down_proj_bias, e)
            coef = jnp.sum(jnp.where(expert_ids == e, weights, 0.0), axis=1)
            return acc + coef[:, None] * out

        return jax.lax.fori_loop(0, count, body,
                                 jnp.zeros((rows, self.down_proj.shape[1]), jnp.float32))

    def _gather(self, x, expert_ids):
        """Each row's ``top_k`` expert outputs ``[rows, top_k, H]`` from its gathered expert
        weights (``[rows, top_k, out, in]``)."""
        def apply(spec, a, w):
            return jnp.einsum(spec, a.astype(w.dtype), w, preferred_element_type=jnp.float32)
        gate = apply("nh,nkih->nki", x, self.gate_proj[...][expert_ids])
        up = apply("nh,nkih->nki", x, self.up_proj[...][expert_ids])
        gate = gate + self._bias(self.gate_proj_bias, expert_ids)
        up = up + self._bias(self.up_proj_bias, expert_ids)
        out = apply("nki,nkhi->nkh", self._glu(gate, up), self.down_proj[...][expert_ids])
        return out + self._bias(self.down_proj_bias, expert_ids)


def _rows(x_sH):
    return x_sH.reshape(-1, x_sH.shape[-1])


class SparseMoE(nnx.Module):
    """The Qwen3-MoE / Qwen3-Next / Qwen3.5-MoE sparse block (``mlp`` of a MoE layer).

    ``gate`` (``Router``, ``[experts, H]``) -> ``softmax_topk`` -> ``experts`` (SiLU
    ``Experts`` of width ``intermediate``). With ``shared_intermediate``: plus
    ``sigmoid(shared_expert_gate(x)) * shared_expert(x)`` (``SwiGLU``; ``Router`` with one
    row).
    """

    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int, *,
                 norm_topk_prob: bool = True, shared_intermediate: int | None = None,
                 dtype=jnp.float32, rngs: nnx.Rngs):
        self.top_k, self.norm_topk_prob = top_k, bool(norm_topk_prob)
        self.gate = Router(hidden, num_experts, dtype=dtype, rngs=rngs)
        self.experts = Experts(num_experts, hidden, intermediate, dtype=dtype, rngs=rngs)
        shared = bool(shared_intermediate)
        self.shared_expert = (SwiGLU(hidden, shared_intermediate, dtype=dtype, rngs=rngs)
                              if shared else None)
        self.shared_expert_gate = Router(hidden, 1, dtype=dtype, rngs=rngs) if shared else None

    @classmethod
    def from_config(cls, config, *, dtype=jnp.float32, rngs: nnx.Rngs) -> "SparseMoE":
        """From a transformers Qwen3-MoE / Qwen3-Next / Qwen3.5-MoE (text) config: Qwen3.5-MoE
        has no ``norm_topk_prob`` and always renormalises; no
        ``shared_expert_intermediate_size`` (Qwen3-MoE): no shared expert."""
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"SparseMoE experts are SiLU-gated, the config has {act!r}")
        return cls(config.hidden_size, config.moe_intermediate_size, config.num_experts,
                   config.num_experts_per_tok,
                   norm_topk_prob=getattr(config, "norm_topk_prob", True),
                   shared_intermediate=getattr(config, "shared_expert_intermediate_size", None),
                   dtype=dtype, rngs=rngs)

    def route(self, x_sH):
        """``(weights [..., top_k] float32, expert_ids [..., top_k] int32)``."""
        return softmax_topk(self.gate(x_sH), self.top_k, self.norm_topk_prob)

    def __call__(self, x_sH, form: str | None = None):
        """``[..., H]`` -> ``[..., H]`` float32."""
        x = _rows(x_sH)
        weights, expert_ids = self.route(x)
        y = self.experts(x, expert_ids, weights, form)
        if self.shared_expert is not None:
            y = y + jax.nn.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return y.reshape(x_sH.shape)


class GptOssMoE(nnx.Module):
    """gpt-oss's ``mlp``: ``router`` (``Router`` with bias) -> ``topk_softmax`` -> ``experts``
    (``Experts(bias=True, activation="gpt_oss")`` of width ``intermediate``). Returns the
    block's output only (transformers' ``GptOssMLP`` also returns the routing weights:
    ``route``)."""

    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int, *,
                 swiglu_alpha: float = 1.702, swiglu_limit: float = 7.0, dtype=jnp.float32,
                 rngs: nnx.Rngs):
        self.top_k = top_k
        self.router = Router(hidden, num_experts, bias=True, dtype=dtype, rngs=rngs)
        self.experts = Experts(num_experts, hidden, intermediate, bias=True,
                               activation="gpt_oss", alpha=swiglu_alpha, limit=swiglu_limit,
                               dtype=dtype, rngs=rngs)

    @classmethod
    def from_config(cls, config, *, dtype=jnp.float32, rngs: nnx.Rngs) -> "GptOssMoE":
        """From a transformers ``GptOssConfig``."""
        return cls(config.hidden_size, config.intermediate_size, config.num_local_experts,
                   config.num_experts_per_tok, swiglu_alpha=getattr(config, "swiglu_alpha", 1.702),
                   swiglu_limit=getattr(config, "swiglu_limit", 7.0), dtype=dtype, rngs=rngs)

    def route(self, x_sH):
        """``(weights [..., top_k] float32, expert_ids [..., top_k] int32)``."""
        return topk_softmax(self.router(x_sH), self.top_k)

    def __call__(self, x_sH, form: str | None = None):
        """``[..., H]`` -> ``[..., H]`` float32."""
        x = _rows(x_sH)
        weights, expert_ids = self.route(x)
        return self.experts(x, expert_ids, weights, form).reshape(x_sH.shape)


# --------------------------------------------------------------------------- checkpoints

_PER_EXPERT = re.compile(r"^(.*?)(\d+)\.(\w+)\.(weight|bias)$")


def stack_expert_tensors(per_expert: dict) -> dict:
    """Stack per-expert checkpoint tensors along a new leading expert axis.

    ``{"model.layers.3.mlp.experts.{e}.gate_proj.weight": [I, H]}`` for ``e = 0 .. E-1`` becomes
    ``{"model.layers.3.mlp.experts.gate_proj": [E, I, H]}`` (likewise ``up_proj``,
    ``down_proj``; a per-expert ``...{e}.P.bias`` becomes ``...P_bias``): the names of
    ``Experts``' parameters under the same prefix. Any name containing ``experts.{e}.`` is
    stacked; other names pass through unchanged. Raises ``ValueError`` on a missing expert or
    mismatched shapes."""
    out: dict = {}
    groups: dict[str, dict[int, np.ndarray]] = {}
    for name, value in per_expert.items():
        m = _PER_EXPERT.match(name)
        if m is None or not m.group(1).endswith("experts."):
            out[name] = value
            continue
        prefix, index, proj, kind = m.groups()
        key = prefix + proj + ("_bias" if kind == "bias" else "")
        groups.setdefault(key, {})[int(index)] = np.asarray(value)
    for key, by_index in groups.items():
        if sorted(by_index) != list(range(len(by_index))):
            missing = sorted(set(range(max(by_index) + 1)) - set(by_index))
            raise ValueError(f"{key}: experts {missing} are missing")
        shapes = {a.shape for a in by_index.values()}
        if len(shapes) > 1:
            raise ValueError(f"{key}: experts have different shapes {sorted(shapes)}")
        out[key] = np.stack([by_index[e] for e in range(len(by_index))])
    return out


def split_gate_up(gate_up, *, axis: int = -2, interleaved: bool = False):
    """``(gate, up)`` from a fused gate/up tensor along ``axis`` (its ``2I`` rows):
    ``[gate; up]`` halves (Qwen's fused ``gate_up_proj [E, 2I, H]``), or ``interleaved`` --
    gate = even, up = odd rows (gpt-oss, weights and ``gate_up_proj_bias [E, 2I]`` with
    ``axis=-1``)."""
    n = gate_up.shape[axis]
    if n % 2:
        raise ValueError(f"a fused gate/up axis has an even size, got {n}")
    index = [slice(None)] * gate_up.ndim
    if interleaved:
        index[axis] = slice(0, None, 2)
        gate = gate_up[tuple(index)]
        index[axis] = slice(1, None, 2)
        return gate, gate_up[tuple(index)]
    index[axis] = slice(0, n // 2)
    gate = gate_up[tuple(index)]
    index[axis] = slice(n // 2, None)
    return gate, gate_up[tuple(index)]


def gpt_oss_expert_params(gate_up_proj, gate_up_proj_bias, down_proj, down_proj_bias, *,
                          transposed: bool) -> dict:
    """``Experts`` parameters (names under ``experts.``) from gpt-oss's expert tensors.

    ``transposed=True``: transformers' layout (``GptOssExperts``, its bf16 saves, and
    ``dequantize_mxfp4``'s default): ``gate_up_proj [E, H, 2I]``, ``down_proj [E, I, H]``;
    ``False``: ``[E, 2I, H]`` / ``[E, H, I]`` (``dequantize_mxfp4(..., layout="out_in")``).
    Biases: ``gate_up_proj_bias [E, 2I]``, ``down_proj_bias [E, H]``."""
    gate_up, down = np.asarray(gate_up_proj), np.asarray(down_proj)
    if transposed:
        gate_up, down = np.swapaxes(gate_up, -1, -2), np.swapaxes(down, -1, -2)
    gate, up = split_gate_up(gate_up, axis=-2, interleaved=True)
    gate_bias, up_bias = split_gate_up(np.asarray(gate_up_proj_bias), axis=-1, interleaved=True)
    return {"gate_proj": np.ascontiguousarray(gate), "up_proj": np.ascontiguousarray(up),
            "down_proj": np.ascontiguousarray(down), "gate_proj_bias": gate_bias,
            "up_proj_bias": up_bias, "down_proj_bias": np.asarray(down_proj_bias)}
