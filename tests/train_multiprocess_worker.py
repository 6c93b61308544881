"""One of two processes joined by ``jax.distributed.initialize`` on 127.0.0.1 (gloo CPU
collectives, one host device each), run by ``test_train_mesh.py``: the drafter trainer on the
2-device global mesh (each process reading and computing the features of only its own
device's rows of every batch) trains 2
steps, checkpoints (orbax, both processes), resumes in both and trains 2 more; process 0 writes
the losses and parameters for the test to compare with one device's.

Usage: ``train_multiprocess_worker.py PROCESS_ID PORT``. Prints ``ok ...``; exits non-zero on
a failure.
"""

from __future__ import annotations

import sys
import tempfile

import jax

jax.config.update("jax_cpu_collectives_implementation", "gloo")

import numpy as np  # noqa: E402

from dominotree_jax.sharding import make_mesh  # noqa: E402
from dominotree_jax.train.dataset import SequenceDataset  # noqa: E402
from dominotree_jax.train.features import FeatureCache  # noqa: E402
from dominotree_jax.train.trainer import TrainConfig, Trainer  # noqa: E402
from train_fixtures import DCFG, TAPS, TCFG, tiny_target_and_answers  # noqa: E402

TC = TrainConfig(steps=4, batch=8, anchors=4, lr=3e-3, warmup=2, seed=0, ckpt_every_s=1e9)


def host(x):
    return np.asarray(x.addressable_data(0)) if isinstance(x, jax.Array) else np.asarray(x)


def main(process_id: int, port: int, ckpt_root: str) -> int:
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=process_id)
    assert jax.process_count() == 2 and jax.device_count() == 2, jax.devices()
    root = tempfile.mkdtemp()   # each process reads its own copy of the same shards
    target, store, _ = tiny_target_and_answers(f"{root}/data")
    ds = SequenceDataset(store, FeatureCache(f"{root}/f", TCFG, target.params, TAPS), 40)
    ids, _ = ds.split(10)
    built = []   # the rows this process reads and computes features for, batch by batch
    prefetch = ds.prefetch
    ds.prefetch = lambda seq_ids: (built.append(len(seq_ids)), prefetch(seq_ids))[1]

    def trainer(ckpt, mesh):
        return Trainer(DCFG, TCFG, target.params, ds, ids, TC, ckpt, progress=False, mesh=mesh)

    both = trainer(f"{ckpt_root}/both", make_mesh(2, 1))   # the 2 global devices
    h = both.fit(num_steps=2)
    both.close()
    again = trainer(f"{ckpt_root}/both", make_mesh(2, 1))  # restored by both processes
    assert again.step == 2, again.step
    h += again.fit()
    half = TC.batch // 2   # each process builds only its own device's rows of every batch
    assert list(again.local_rows) == list(range(process_id * half, (process_id + 1) * half)), \
        again.local_rows
    assert built == [half] * TC.steps, built
    if process_id == 0:   # the test compares them with one device's
        np.savez(f"{ckpt_root}/two_processes.npz", losses=[r["loss"] for r in h],
                 **{f"p/{k}": host(v) for k, v in again.flat.items()})
    print(f"ok process {process_id}: {TC.steps} steps on 2 processes, resumed from their "
          "shared checkpoint after 2")
    again.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
