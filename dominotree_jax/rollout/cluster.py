"""tunix's ``RLCluster`` on a mesh over several processes: ``MultiProcessRLCluster``.

In JAX's multi-controller runtime every process runs the same learner with its own prompts
(its rows of each step's batch). tunix 0.1.7 assembles the global batch for the reference
and actor log-prob passes (``sharding_utils.shard_input``) but then slices it with the
*local* batch's row range (``dest_prompt_tokens[batch_slice]``), so every process gets
process 0's rows: with ``beta > 0`` the GRPO loss reads another process's reference
log-probs (``tests/rl_cluster_multiprocess_worker.py --tunix-cluster``: after 2 steps 55 %
of the policy's weights differ from a single process's). This subclass hands those passes
the global batch in global row units and gives each process back its own rows
(``placement.BatchPlacement``), as the rollout engine's ``generate`` and
``get_per_token_logps`` already do. On one process it is ``RLCluster``.

What runs where: docs/rl.md ("Many devices, many hosts").
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from dominotree_jax.rollout.placement import BatchPlacement
from dominotree_jax.rollout.tunix_types import HAVE_TUNIX
from dominotree_jax.sharding import DATA

if HAVE_TUNIX:
    from tunix.rl import rl_cluster as rl_cluster_lib

    class MultiProcessRLCluster(rl_cluster_lib.RLCluster):
        """``RLCluster`` whose log-prob passes are right on a mesh over several processes
        (module docstring). Its meshes must have a ``"data"`` axis and the training config
        ``data_sharding_axis=("data",)`` when they span processes."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            axis = tuple(self.cluster_config.training_config.data_sharding_axis)
            for role, mesh in self.r2m.items():
                if not BatchPlacement(mesh).multi_process:
                    continue
                if DATA not in mesh.axis_names or axis != (DATA,):
                    raise ValueError(
                        f"the {role} mesh spans several processes: it needs a {DATA!r} axis "
                        f"(has {mesh.axis_names}) and data_sharding_axis=({DATA!r},) (got "
                        f"{axis})")

        def get_ref_per_token_logps(self, prompt_tokens, completion_tokens, pad_id, eos_id,
                                    micro_batch_size=None):
            return self._global_rows(
                rl_cluster_lib.Role.REFERENCE, super().get_ref_per_token_logps,
                prompt_tokens, completion_tokens, micro_batch_size, pad_id=pad_id,
                eos_id=eos_id)

        def get_actor_per_token_logps(self, prompt_tokens, completion_tokens, pad_id, eos_id,
                                      micro_batch_size=None, temperature=None):
            return self._global_rows(
                rl_cluster_lib.Role.ACTOR, super().get_actor_per_token_logps,
                prompt_tokens, completion_tokens, micro_batch_size, pad_id=pad_id,
                eos_id=eos_id, temperature=temperature)

        def _global_rows(self, role, method, prompt_tokens, completion_tokens,
                         micro_batch_size, **kw):
            """``method`` over the global batch (this process's rows placed beside the
            others', the micro batch in global rows); this process's rows of the result."""
            placement = BatchPlacement(self.r2m[role])
            if not placement.multi_process:
                return method(prompt_tokens, completion_tokens,
                              micro_batch_size=micro_batch_size, **kw)
            local_rows = int(np.shape(prompt_tokens)[0])
            global_rows = placement.global_rows(local_rows)
            micro = (None if micro_batch_size is None
                     else micro_batch_size * global_rows // local_rows)
            out = method(placement.put(np.asarray(prompt_tokens)),
                         placement.put(np.asarray(completion_tokens)),
                         micro_batch_size=micro, **kw)
            return jnp.asarray(placement.local(out))

