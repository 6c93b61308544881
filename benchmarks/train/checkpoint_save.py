"""Time of one orbax checkpoint of SmolLM2-135M's size, as tunix's checkpoint manager writes it
(``PyTreeCheckpointHandler`` through ``ocp.CheckpointManager``, async): 134.5 M float32
parameters x 3 (policy + AdamW's two moments), random values (constant ones compress away).

    python -m benchmarks train checkpoint_save [DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import time

import jax
import orbax.checkpoint as ocp

N_PARAMS = 134_515_008   # SmolLM2-135M (benchmarks/train/grpo_step.py prints it)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directory", nargs="?", default="/tmp/bench_checkpoint_save",
                    help="where the checkpoints are written (removed afterwards)")
    args = ap.parse_args(argv)
    save_twice(args.directory)


def save_twice(directory: str, chunks: int = 90) -> None:
    """Two saves of policy + moments into ``directory`` (its contents are removed)."""
    key = jax.random.key(0)
    tree = {f"p{i}": jax.random.normal(jax.random.fold_in(key, i), (N_PARAMS // chunks,))
            for i in range(chunks)}
    state = {"params": tree, "mu": jax.tree.map(lambda x: x * 1e-3, tree),
             "nu": jax.tree.map(lambda x: x * x, tree)}
    shutil.rmtree(directory, ignore_errors=True)
    mgr = ocp.CheckpointManager(directory, item_handlers={"s": ocp.PyTreeCheckpointHandler()},
                                options=ocp.CheckpointManagerOptions(max_to_keep=2))
    for step in (1, 2):
        t0 = time.perf_counter()
        mgr.save(step, args=ocp.args.Composite(s=ocp.args.PyTreeSave(state)))
        t1 = time.perf_counter()
        mgr.wait_until_finished()
        print(f"step {step}: save() returned after {t1 - t0:.2f} s, written after "
              f"{time.perf_counter() - t0:.2f} s", flush=True)
    size = sum(os.path.getsize(os.path.join(r, f))
               for r, _, fs in os.walk(os.path.join(directory, "2")) for f in fs)
    print(f"one checkpoint on disk: {size / 1e9:.2f} GB")
    shutil.rmtree(directory, ignore_errors=True)
