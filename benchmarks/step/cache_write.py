"""The batch-16 cache-write stage in one process: float32, the plain bf16 scatter, the bf16 bits.

SmolLM2-135M's shapes: 30 layers x (k, v) caches of ``[16, 3, 256, 64]``, one new row per batch
row written at slot 128, the caches donated; process CPU ms, median of 20 after a warm-up.

    JAX_PLATFORMS=cpu python -m benchmarks step cache_write
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
from jax import lax

from dominotree_jax.model.cache import storage_dtype, write_layer

B, K, S, D, L = 16, 3, 256, 64, 30


def plain_scatter(cache_BKSD, new_BTKD, start_B):
    """The write before the bits storage: a scatter in the cache's own (bf16) dtype."""
    slots_BT = start_B[:, None] + jnp.arange(new_BTKD.shape[1])[None]
    dnums = lax.ScatterDimensionNumbers(
        update_window_dims=(2, 3), inserted_window_dims=(2,), scatter_dims_to_operand_dims=(2,),
        operand_batching_dims=(0,), scatter_indices_batching_dims=(0,))
    return lax.scatter(cache_BKSD, slots_BT[..., None], new_BTKD.astype(cache_BKSD.dtype), dnums,
                       mode=lax.GatherScatterMode.FILL_OR_DROP)


def stage_ms(write, stored_dtype, repeats=20) -> float:
    new_BTKD = jnp.ones((B, 1, K, D), jnp.bfloat16)
    start_B = jnp.full((B,), S // 2, jnp.int32)
    f = jax.jit(lambda cache, n, s: tuple(write(c, n, s) for c in cache), donate_argnums=0)
    cache = tuple(jnp.zeros((B, K, S, D), stored_dtype) for _ in range(2 * L))
    cache = jax.block_until_ready(f(cache, new_BTKD, start_B))
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        cache = jax.block_until_ready(f(cache, new_BTKD, start_B))
        times.append(time.process_time() - t0)
    return statistics.median(times) * 1e3


def main(argv=None):
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    for _ in range(2):
        print(f"float32 scatter          {stage_ms(write_layer, jnp.float32):8.2f} ms")
        print(f"bf16 plain scatter (old) {stage_ms(plain_scatter, jnp.bfloat16):8.2f} ms")
        print(f"bf16 bits write (new)    "
              f"{stage_ms(write_layer, storage_dtype(jnp.bfloat16)):8.2f} ms")
