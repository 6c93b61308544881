"""Multi-device decoding with JAX's own partitioner: place the inputs, ``jax.jit`` does the rest.

A 2-D mesh with axes ``"data"`` (batch rows) and ``"model"`` (tensor parallelism). The mesh axes
are ``AxisType.Auto``: XLA's SPMD partitioner propagates the input shardings through ``decode``
(the caches follow the K/V projections: batch on ``"data"``, kv heads on ``"model"``).

Parameter placement is declared with the model: every weight names what each of its dimensions
is (``logical_axes``, e.g. ``("heads", "embed")`` for ``q_proj``'s ``[out, in]``; the names are
``LOGICAL_AXES``), and one ``ShardingRules`` value says which logical axes go on ``"model"``.
The default rules are Megatron style, one all-reduce after attention and one after the MLP per
layer: ``heads``/``kv_heads`` (the q/k/v rows and biases, ``o_proj``'s columns) and ``mlp``
(``gate``/``up`` rows, ``down_proj``'s columns) on ``"model"``, for the target and the
drafter alike; everything else replicated. ``ShardingRules(vocab=True)`` (``shard_vocab``) also
splits the ``vocab`` rows (``embed_tokens``, ``lm_head``, the Domino head's ``W2``); off by
default: replicated vocabulary matrices keep every vocabulary-wide op of a round (argmax,
sampling, the top-M candidates, the tree's top-k) local; turn it on when ``V x H`` weights do
not fit per device.

A dimension that the ``"model"`` axis size does not divide stays replicated. Choose ``model``
dividing ``num_key_value_heads`` (and ``num_attention_heads``): if it only divides
``kv_heads * head_dim`` a head is split across devices -- still exact, more communication.

    mesh = make_mesh(data=2, model=4)
    params = shard_params(params, mesh)
    prompt_BT, lengths_B = shard_batch(prompt_BT, lengths_B, mesh)
    out = decode(params, prompt_BT, config=cfg, prompt_lengths=lengths_B)
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

DATA, MODEL = "data", "model"

# What each dimension of a weight can be (a weight declares one name per dimension with
# ``nnx.Param(..., logical_axes=...)``; model/layers.py, model/target.py, model/drafter.py)
LOGICAL_AXES = {
    "vocab": "a vocabulary's rows: the target's, or the drafter's draft vocabulary (W2)",
    "embed": "the hidden size H of the residual stream",
    "heads": "query heads x head_dim",
    "kv_heads": "key/value heads x head_dim",
    "head_dim": "one head's width (the q/k RMSNorm weights)",
    "mlp": "the MLP's intermediate units",
    "taps": "the drafter's concatenated tapped target features (num_taps x H)",
    "gru_gates": "the GRU's three gates x its state (3G)",
    "gru_state": "the GRU state (G)",
    "head_in": "the Domino head's input (H + G)",
    "head_embed": "the Domino head's embedding (E)",
    "draft_ids": "the draft vocabulary's target ids (d2t)",
    "markov_rank": "the DSpark Markov head's rank (r)",
    "confidence_in": "the DSpark confidence head's input (H, or H + r)",
    "confidence_out": "the DSpark confidence head's one output",
    "conv_taps": "DFlash2's convolution corrections (2 x taps x channel groups)",
    "conv_side": "a DFlash2 convolution: before (0) or after (1) its sublayer",
    "conv_tap": "a DFlash2 convolution's tap (its offset)",
    "selector_rank": "DFlash2's path selector's rank",
    "linear_channels": "a Gated DeltaNet layer's q/k/v/z channels (its conv channels)",
    "linear_heads": "a Gated DeltaNet layer's value heads (beta/decay rows, A_log, dt_bias)",
    "conv_kernel": "the taps of a causal depthwise convolution (and its unit group axis)",
    "expert": "the routed experts of a mixture-of-experts block",
}


def declare(*axes: str) -> dict:
    """``nnx.Param`` metadata declaring a weight's logical axes (one per dimension)."""
    unknown = [a for a in axes if a not in LOGICAL_AXES]
    if unknown:
        raise ValueError(f"unknown logical axes {unknown}; known: {', '.join(LOGICAL_AXES)}")
    return {"logical_axes": tuple(axes)}


@dataclasses.dataclass(frozen=True)
class ShardingRules:
    """Which logical axes (``LOGICAL_AXES``) a weight is split along on the ``"model"`` mesh
    axis; the rest are replicated. Built once, passed to ``shard_params`` / the trainer."""
    model_axes: tuple[str, ...] = ("heads", "kv_heads", "mlp")
    vocab: bool = False          # also the vocabulary rows (``shard_vocab``)

    def __post_init__(self):
        unknown = [a for a in self.model_axes if a not in LOGICAL_AXES]
        if unknown:
            raise ValueError(f"sharding rules name unknown logical axes {unknown}")

    def mesh_axis(self, logical: str) -> str | None:
        """The mesh axis a dimension with this logical axis goes on (None: replicated)."""
        return MODEL if logical in self.model_axes or (self.vocab and logical == "vocab") \
            else None

    def spec(self, axes: tuple[str, ...], shape: tuple[int, ...], model_size: int) -> P:
        """The ``PartitionSpec`` of a weight with logical ``axes`` and ``shape`` on a mesh whose
        ``"model"`` axis has ``model_size`` devices: the first dimension that goes on
        ``"model"`` and that it divides; ``P()`` when none."""
        if len(axes) != len(shape):
            raise ValueError(f"logical axes {axes} do not match a weight of shape {shape}")
        for dim, logical in enumerate(axes):
            if self.mesh_axis(logical) is not None and shape[dim] % model_size == 0:
                return P(*(MODEL if d == dim else None for d in range(len(shape))))
        return P()


def make_mesh(data: int, model: int, devices=None) -> Mesh:
    """A ``data x model`` mesh (axes ``"data"``, ``"model"``, both ``AxisType.Auto``) over the
    first ``data * model`` devices (or ``devices``)."""
    return jax.make_mesh((data, model), (DATA, MODEL), (AxisType.Auto, AxisType.Auto),
                         devices=devices)


def _is_variable(x) -> bool:
    return isinstance(x, nnx.Variable)


def logical_axes(variable, where: str = "a parameter") -> tuple[str, ...]:
    """The logical axes ``variable`` (an ``nnx.Param`` of a model's state) declares."""
    axes = variable.get_metadata().get("logical_axes") if _is_variable(variable) else None
    if axes is None:
        raise ValueError(f"{where} declares no logical axes: place the states the models "
                         f"build (model/, convert/), not plain arrays or dicts")
    return tuple(axes)


def _declared_spec(path, v, model_size: int, rules: ShardingRules) -> P:
    """The ``PartitionSpec`` of the variable ``v`` at ``path`` from the axes it declares."""
    return rules.spec(logical_axes(v, jax.tree_util.keystr(path)), np.shape(v.get_value()),
                      model_size)


def param_specs(params, model_size: int, rules: ShardingRules = ShardingRules()):
    """A tree like ``params`` (a model's ``nnx.State``, or a dict of them) with each
    parameter's ``PartitionSpec`` under ``rules`` in place of its value."""
    return jax.tree_util.tree_map_with_path(
        lambda path, v: None if v is None else _declared_spec(path, v, model_size, rules),
        params, is_leaf=_is_variable)


def flat_param_specs(state, model_size: int, rules: ShardingRules = ShardingRules()) -> dict:
    """``{"layers.0.self_attn.q_proj.weight": PartitionSpec}`` for a model's (abstract) state:
    the placement of a flat, checkpoint-named parameter dict (the trainer's)."""
    specs = jax.tree_util.tree_flatten_with_path(param_specs(state, model_size, rules),
                                                 is_leaf=lambda x: isinstance(x, P))[0]
    return {".".join(str(getattr(k, "key", k)) for k in path): spec for path, spec in specs}


def place_params(params, mesh: Mesh, rules: ShardingRules = ShardingRules(), put=None):
    """``params`` (states the models build) placed on ``mesh`` by their declared logical axes
    and ``rules``: ``put(value, NamedSharding)`` places one array (default ``jax.device_put``;
    the trainer passes its multi-process form)."""
    put = jax.device_put if put is None else put
    size = mesh.shape.get(MODEL, 1)

    def place(path, v):
        if v is None:
            return None
        spec = _declared_spec(path, v, size, rules)
        return v.replace(put(v.get_value(), NamedSharding(mesh, spec)))
    return jax.tree_util.tree_map_with_path(place, params, is_leaf=_is_variable)


def shard_params(params, mesh: Mesh, shard_vocab: bool = False,
                 rules: ShardingRules | None = None):
    """``params`` placed on ``mesh`` with ``NamedSharding`` by their declared logical axes and
    ``rules`` (default: ``ShardingRules(vocab=shard_vocab)``; module docstring)."""
    return place_params(params, mesh, ShardingRules(vocab=shard_vocab) if rules is None
                        else rules)


def shard_batch(prompt_BT, lengths_B, mesh: Mesh):
    """Prompts ``[B, T]`` and lengths ``[B]`` with the batch on ``"data"`` (``B`` must be a
    multiple of the ``"data"`` size: pad with dummy rows and drop their outputs)."""
    B = np.shape(prompt_BT)[0]
    if B % mesh.shape[DATA]:
        raise ValueError(f"batch size {B} is not a multiple of the mesh's data axis "
                         f"({mesh.shape[DATA]})")
    return (jax.device_put(np.asarray(prompt_BT, np.int32), NamedSharding(mesh, P(DATA, None))),
            jax.device_put(np.asarray(lengths_B, np.int32), NamedSharding(mesh, P(DATA))))


def replicated(x, mesh: Mesh):
    """``x`` (e.g. a PRNG key) copied to every device of ``mesh``."""
    return jax.device_put(x, NamedSharding(mesh, P()))
