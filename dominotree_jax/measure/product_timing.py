"""Matrix-product microbenchmark behind the precision choice (docs/precision.md).

Times jitted ``x [m, K] @ w[N, K].T`` the way the engine runs it (``precision.product``): a
float32 weight, or a bf16 weight with the activation cast at the product's input and float32
accumulation. ``product_shapes`` lists a target's products; ``time_products`` returns the
median milliseconds per (shape, rows, dtype); ``fastest_precision`` reads the table.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.measure.timing import interleaved_medians
from dominotree_jax.precision import BENCHMARKED_PRECISIONS, product

DTYPES = BENCHMARKED_PRECISIONS   # the precisions timed (defined once, in precision.py)
ROWS = (1, 16, 17, 32, 64)


def product_shapes(cfg) -> dict[str, tuple[int, int]]:
    """``{name: (K in-features, N out-features)}`` of one target layer's products and the head."""
    H, I = cfg.hidden_size, cfg.intermediate_size
    q = cfg.num_attention_heads * cfg.head_dim
    kv = cfg.num_key_value_heads * cfg.head_dim
    return {"q": (H, q), "k/v": (H, kv), "o": (q, H), "gate/up": (H, I), "down": (I, H),
            "head": (H, cfg.vocab_size)}


def layer_weights(cfg) -> dict[str, int]:
    """How many of each product one target forward runs (per layer x layers; the head once)."""
    L = cfg.num_hidden_layers
    return {"q": L, "k/v": 2 * L, "o": L, "gate/up": 2 * L, "down": L, "head": 1}


def time_products(shapes: dict[str, tuple[int, int]], rows=ROWS, dtypes=DTYPES,
                  repeats: int = 20) -> dict[tuple[str, int, str], float]:
    """Median ms of one jitted product per ``(shape name, rows, dtype)``, all interleaved."""
    rng = np.random.default_rng(0)
    fns = {}
    for name, (K, N) in shapes.items():
        w32 = jnp.asarray(rng.standard_normal((N, K), np.float32) / np.sqrt(K))
        for dt in dtypes:
            w = w32.astype(dt)
            for m in rows:
                x = jnp.asarray(rng.standard_normal((m, K), np.float32))
                f = jax.jit(product)
                fns[(name, m, dt)] = (lambda f=f, x=x, w=w: f(x, w))
    return interleaved_medians(fns, repeats)


def forward_product_ms(cfg, table, rows: int, dtype: str) -> float:
    """Milliseconds of all products of one target forward over ``rows`` rows (from ``table``)."""
    counts = layer_weights(cfg)
    return sum(n * table[(name, rows, dtype)] for name, n in counts.items())


def fastest_precision(cfg, table, rows=ROWS) -> dict[int, str]:
    """Per row count, the dtype whose products of one target forward take least time."""
    dtypes = sorted({k[2] for k in table})
    return {m: min(dtypes, key=lambda dt: forward_product_ms(cfg, table, m, dt)) for m in rows}


def markdown_table(cfg, table, rows=ROWS) -> str:
    """The per-shape table (ms, float32 / bf16) and the per-forward totals."""
    shapes = product_shapes(cfg)
    lines = ["| [K, N] | " + " | ".join(f"m={m}" for m in rows) + " |",
             "|---|" + "---|" * len(rows)]
    for name, (K, N) in shapes.items():
        cells = [f"{table[(name, m, 'float32')]:.3f} / {table[(name, m, 'bfloat16')]:.3f}"
                 for m in rows]
        lines.append(f"| {K} x {N} ({name}) | " + " | ".join(cells) + " |")
    tot = [(forward_product_ms(cfg, table, m, "float32"),
            forward_product_ms(cfg, table, m, "bfloat16")) for m in rows]
    lines.append("| whole forward (sum) | " + " | ".join(f"**{a:.1f} / {b:.1f}**"
                                                       for a, b in tot) + " |")
    lines.append("| bf16 speed / f32 | " + " | ".join(f"{a / b:.2f}x" for a, b in tot) + " |")
    return "\n".join(lines)
