"""Where a rollout batch lives: the ``"data"`` axis of the mesh the engine's parameters are on.

``BatchPlacement.of(params)`` finds that mesh (a ``NamedSharding`` whose mesh has a ``"data"``
axis; None when the parameters are on one device, or on a mesh without that axis: then the
batch stays where ``jnp.asarray`` puts it).

- One process: the batch rows go on ``"data"`` when the batch divides it (else replicated over
  the mesh: exact too, each ``"data"`` slice computing every row); ``local`` reads a whole
  output back.
- Many processes (a mesh over several processes' devices, after ``jax.distributed.initialize``:
  JAX's multi-controller runtime): every process runs the same ``generate`` with its own rows
  (the same number in every process); ``put`` assembles the global batch with
  ``jax.make_array_from_process_local_data`` (process ``i``'s rows are the rows its devices
  hold along ``"data"``), the program runs once over all devices, and ``local`` hands each
  process its own rows of an output (``multihost_utils.process_allgather``, then this
  process's slice). Host values shared by every process (a PRNG key, the auto-size state) go
  in as NumPy arrays: the same on every process, read as replicated.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from dominotree_jax.sharding import DATA


def mesh_of(tree) -> Mesh | None:
    """The mesh of the first array of ``tree`` placed on a mesh with a ``"data"`` axis."""
    for x in jax.tree.leaves(tree):
        s = getattr(x, "sharding", None)
        if isinstance(s, NamedSharding) and isinstance(s.mesh, Mesh) and \
                DATA in s.mesh.axis_names:
            return s.mesh
    return None


@dataclasses.dataclass(frozen=True)
class BatchPlacement:
    """Row placement of rollout batches on ``mesh`` (module docstring); ``mesh=None``: none."""
    mesh: Mesh | None

    @classmethod
    def of(cls, params) -> "BatchPlacement":
        return cls(mesh_of(params))

    @property
    def multi_process(self) -> bool:
        """The mesh spans devices of other processes than this one."""
        return self.mesh is not None and any(
            d.process_index != jax.process_index() for d in self.mesh.devices.flat)

    @property
    def data_size(self) -> int:
        return 1 if self.mesh is None else int(self.mesh.shape[DATA])

    def _local_data_slices(self) -> int:
        """How many positions of the ``"data"`` axis this process's devices hold."""
        axis = self.mesh.axis_names.index(DATA)
        mine = np.vectorize(lambda d: d.process_index == jax.process_index())(self.mesh.devices)
        return int(np.any(np.moveaxis(mine, axis, 0).reshape(self.data_size, -1), axis=1).sum())

    def global_rows(self, local_rows: int) -> int:
        """The global batch size when this process feeds ``local_rows`` rows."""
        if not self.multi_process:
            return local_rows
        slices = self._local_data_slices()
        if local_rows % slices:
            raise ValueError(f"this process feeds {local_rows} rows, not a multiple of the "
                             f"{slices} positions of the mesh's data axis its devices hold")
        return local_rows // slices * self.data_size

    def agree(self, *values: int) -> tuple[int, ...]:
        """The largest of each value over the processes (every process must call it)."""
        if not self.multi_process:
            return tuple(int(v) for v in values)
        every = np.asarray(multihost_utils.process_allgather(np.asarray(values, np.int64)))
        return tuple(int(v) for v in every.reshape(-1, len(values)).max(axis=0))

    def _rows_sharding(self, global_rows: int, ndim: int) -> NamedSharding:
        if self.multi_process or global_rows % self.data_size == 0:
            return NamedSharding(self.mesh, P(DATA, *(None,) * (ndim - 1)))
        return NamedSharding(self.mesh, P())   # one process, rows not dividing "data"

    def put(self, local_BX: np.ndarray) -> jax.Array | np.ndarray:
        """This process's rows ``[b, ...]`` as the global batch ``[B, ...]`` on the mesh."""
        local_BX = np.asarray(local_BX)
        if self.mesh is None:
            return local_BX
        B = self.global_rows(local_BX.shape[0])
        sharding = self._rows_sharding(B, local_BX.ndim)
        if not self.multi_process:
            return jax.device_put(local_BX, sharding)
        return jax.make_array_from_process_local_data(sharding, local_BX,
                                                      (B,) + local_BX.shape[1:])

    def local_rows(self, global_rows: int) -> np.ndarray:
        """The indices (ascending) of the rows of a global batch that this process fed."""
        if not self.multi_process:
            return np.arange(global_rows)
        index = self._rows_sharding(global_rows, 1).addressable_devices_indices_map(
            (global_rows,))
        return np.unique(np.concatenate([np.arange(global_rows)[i[0]] for i in index.values()]))

    def local(self, x_BX) -> np.ndarray:
        """This process's rows of a global output ``[B, ...]`` as a NumPy array."""
        if not self.multi_process:
            return np.asarray(x_BX)
        return np.asarray(multihost_utils.process_allgather(x_BX, tiled=True))[
            self.local_rows(x_BX.shape[0])]
