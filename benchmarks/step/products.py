"""float32 vs bf16 matrix products at the target's shapes: the microbenchmark behind the
precision choice (docs/precision.md).

Jitted ``[m, in] x [in, out]`` products as the engine runs them (``precision.product``: float32,
or bf16 x bf16 with float32 accumulation), median of ``--repeats`` interleaved calls, for every
product of SmolLM2-135M (or ``--target``) at ``--rows``; then the sum over one whole forward
(30 layers + head) and the faster dtype per row count. Prints a markdown table.

    JAX_PLATFORMS=cpu python -m benchmarks step products [--rows 1,16,17,32,64] [--repeats 30]
"""

from __future__ import annotations

import argparse
import time

import jax

from dominotree_jax.measure import product_timing as matmul
from dominotree_jax.measure.timing import bf16_units, cpu_model


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="target .gguf / HF dir (default: SmolLM2)")
    ap.add_argument("--rows", default="1,16,17,32,64")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args(argv)
    rows = tuple(int(r) for r in args.rows.split(","))
    if args.target:
        import dominotree_jax as dj
        cfg = dj.load_target(args.target, tokenizer=False).config
    else:
        from dominotree_jax.config import TargetConfig
        cfg = TargetConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                           num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                           head_dim=64, tie_word_embeddings=True)
    t0 = time.perf_counter()
    table = matmul.time_products(matmul.product_shapes(cfg), rows, repeats=args.repeats)
    fastest = matmul.fastest_precision(cfg, table, rows)
    print(f"CPU: {cpu_model()}; bf16 matrix units: {bf16_units()}; jax {jax.__version__}, "
          f"{jax.devices()[0]}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    print("ms per product, float32 / bf16 x bf16 -> float32 (median of "
          f"{args.repeats}; `jax.jit(precision.product)`):\n")
    print(matmul.markdown_table(cfg, table, rows))
    print("\nfaster precision for one forward's products: "
          + ", ".join(f"{m} rows: {d}" for m, d in fastest.items())
          + f"  ({time.perf_counter() - t0:.0f} s)")
    return table
