"""Multi-device decoding with JAX's own partitioner: place the inputs, ``jax.jit`` does the rest.

A 2-D mesh with axes ``"data"`` (batch rows) and ``"model"`` (tensor parallelism). The mesh axes
are ``AxisType.Auto``: XLA's SPMD partitioner propagates the input shardings through ``decode``
(the caches follow the K/V projections: batch on ``"data"``, kv heads on ``"model"``).

Parameter placement (weights are stored ``[out, in]``), Megatron style — one all-reduce after
attention and one after the MLP per layer:

- ``q_proj``/``k_proj``/``v_proj`` rows (heads) and biases, MLP ``gate_proj``/``up_proj`` rows
  (intermediate units): on ``"model"``;
- ``o_proj`` and ``down_proj`` columns: on ``"model"``;
- the same for the drafter's layers;
- with ``shard_vocab=True``: ``embed_tokens``, ``lm_head`` and the Domino head's ``W2``
  (``embed_proj.2``, ``[V, E]``) rows (vocabulary) on ``"model"``. Off by default: replicated
  vocabulary matrices keep every vocabulary-wide op of a round (argmax, sampling, the top-M
  candidates, the tree's top-k) local; turn it on when ``V x H`` weights do not fit per device;
- everything else (norms, the drafter's ``fc``, the GRU and ``W1``): replicated.

A dimension that the ``"model"`` axis size does not divide stays replicated. Choose ``model``
dividing ``num_key_value_heads`` (and ``num_attention_heads``): if it only divides
``kv_heads * head_dim`` a head is split across devices — still exact, more communication.

    mesh = make_mesh(data=2, model=4)
    params = shard_params(params, mesh)
    prompt_BT, lengths_B = shard_batch(prompt_BT, lengths_B, mesh)
    out = jax.jit(decode, static_argnames="config")(params, prompt_BT, config=cfg,
                                                    prompt_lengths=lengths_B)
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

DATA, MODEL = "data", "model"

_ROW_SHARDED = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")  # output units
_COL_SHARDED = ("o_proj", "down_proj")                                  # input units
_VOCAB_ROWS = ("embed_tokens", "lm_head")


def make_mesh(data: int, model: int, devices=None) -> Mesh:
    """A ``data x model`` mesh (axes ``"data"``, ``"model"``, both ``AxisType.Auto``) over the
    first ``data * model`` devices (or ``devices``)."""
    return jax.make_mesh((data, model), (DATA, MODEL), (AxisType.Auto, AxisType.Auto),
                         devices=devices)


def _names(path) -> tuple[str, ...]:
    """``("target", "layers", "0", "self_attn", "q_proj", "weight")`` for a pytree key path."""
    out = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                out.append(str(getattr(k, attr)))
                break
    return tuple(n for n in out if n != "value")  # nnx.Variable's own leaf


def param_spec(names: tuple[str, ...], shape: tuple[int, ...], model_size: int,
               shard_vocab: bool = False) -> P:
    """The ``PartitionSpec`` of one parameter, given its path names and shape."""
    if len(names) < 2:
        return P()
    module, leaf = names[-2], names[-1]
    if module in _ROW_SHARDED:
        spec = P(MODEL, None) if leaf == "weight" else P(MODEL)
    elif module in _COL_SHARDED and leaf == "weight":
        spec = P(None, MODEL)
    elif shard_vocab and leaf == "weight" and (
            module in _VOCAB_ROWS or (module == "2" and names[-3:-2] == ("embed_proj",))):
        spec = P(MODEL, None)
    else:
        return P()
    dim = list(spec).index(MODEL)
    return spec if shape[dim] % model_size == 0 else P()


def shard_params(params, mesh: Mesh, shard_vocab: bool = False):
    """``params`` placed on ``mesh`` with ``NamedSharding`` (see the module docstring)."""
    size = mesh.shape[MODEL]
    return jax.tree_util.tree_map_with_path(
        lambda path, x: jax.device_put(x, NamedSharding(
            mesh, param_spec(_names(path), np.shape(x), size, shard_vocab))), params)


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
