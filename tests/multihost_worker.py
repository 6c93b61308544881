"""One of two processes joined by ``jax.distributed.initialize`` on 127.0.0.1 (gloo CPU
collectives, 2 host devices each), run by ``test_rl_multidevice.py``: a ``decode`` sharded over
the 4 global devices (batch on ``"data"``, parameters replicated, each process feeding its own
rows) gives the tokens of a single-device ``decode`` of the whole batch.

Usage: ``multihost_worker.py PROCESS_ID PORT``. Prints ``ok ...``; exits non-zero on a failure.
"""

from __future__ import annotations

import sys

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")

import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from dominotree_jax import DecodeConfig, decode  # noqa: E402
from dominotree_jax.sharding import DATA, make_mesh  # noqa: E402
from spec_fixtures import tiny_pair  # noqa: E402

PROMPT_BT = np.array([[3, 17, 5, 9, 33], [40, 1, 0, 0, 0], [7, 7, 21, 0, 0], [5, 60, 2, 8, 1]],
                     np.int32)
LENGTHS_B = np.array([5, 2, 3, 5], np.int32)


def main(process_id: int, port: int) -> int:
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=process_id)
    assert jax.process_count() == 2 and jax.device_count() == 4, jax.devices()
    tcfg, dcfg, params = tiny_pair()
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method="dominotree", max_new_tokens=12,
                       budget=6, node_topk=3, top_m=16, return_logprobs=True)
    run = jax.jit(decode, static_argnames="config")
    # the single-process reference: this process's first device, the whole batch
    local = jax.local_devices()[0]
    ref = run(jax.device_put(params, local), jax.device_put(PROMPT_BT, local), config=cfg,
              prompt_lengths=jax.device_put(LENGTHS_B, local))
    ref_tokens = np.asarray(ref.tokens)

    mesh = make_mesh(data=4, model=1)          # over the 4 global devices
    replicated = NamedSharding(mesh, P())
    gparams = jax.tree.map(lambda x: jax.make_array_from_callback(
        np.shape(x), replicated, lambda idx, x=np.asarray(x): x[idx]), params)
    rows = slice(2 * process_id, 2 * process_id + 2)   # this process's share of the batch
    prompt = jax.make_array_from_process_local_data(NamedSharding(mesh, P(DATA, None)),
                                                    PROMPT_BT[rows], PROMPT_BT.shape)
    lengths = jax.make_array_from_process_local_data(NamedSharding(mesh, P(DATA)),
                                                     LENGTHS_B[rows], LENGTHS_B.shape)
    out = run(gparams, prompt, config=cfg, prompt_lengths=lengths)
    tokens = np.asarray(multihost_utils.process_allgather(out.tokens, tiled=True))
    logp = np.asarray(multihost_utils.process_allgather(out.logprobs, tiled=True))
    np.testing.assert_array_equal(tokens, ref_tokens)
    np.testing.assert_allclose(logp, np.asarray(ref.logprobs), atol=1e-4)
    print(f"ok process {process_id}: 2-process sharded decode {tokens.shape} equals the "
          f"single-process one", flush=True)
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
