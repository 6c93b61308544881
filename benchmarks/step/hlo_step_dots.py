"""What one standalone target step compiles to, per precision (no timing).

Compiles one ``verify`` step of SmolLM2-135M (as ``step/profile.py`` jits it: the weights are
arguments of the jitted step) for an AR step (1 row) and a 17-row verify at batch 1, and counts
in the optimised HLO the products (``dot`` instructions, XNNPACK ``__ynn_fusion`` fusions) by
operand dtypes and the ``convert`` instructions
(or fusions) that output a float32 array of a weight's shape. This says whether the bf16 step
runs bf16 x bf16 dots (XLA:CPU's bf16 kernel) or float32 dots on converted copies.

    python -m benchmarks step hlo_step_dots [--dtypes float32,bfloat16]
"""

from __future__ import annotations

import argparse
import collections
import re

from benchmarks.step.hlo_weight_converts import WEIGHT_SHAPES, computations

INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(\w+)\[[^\]]*\]\S*\s+(\w+)\(([^)]*)\)(.*)$")
WEIGHT_F32 = re.compile(r"=\s*f32\[" + WEIGHT_SHAPES + r"\]\S*\s+(convert|fusion)\(")


def scheduled_lines(hlo: str) -> list[str]:
    """The lines of the computations that run as such (entry, loop bodies, ...), not the bodies
    of fusions (whose parameter names repeat across computations)."""
    return [ln for name, lines in computations(hlo).items()
            if not name.lstrip("%").startswith(("fused", "wrapped")) for ln in lines]


def weight_upcasts(hlo: str) -> int:
    """Instructions outputting a float32 array of a weight's shape (a per-call upcast)."""
    return sum(bool(WEIGHT_F32.search(ln)) for ln in scheduled_lines(hlo))


def product_kinds(hlo: str) -> collections.Counter:
    """``Counter`` of ``'<kernel>: lhs x rhs -> out'`` over the products of ``hlo``: plain ``dot``
    instructions (XLA:CPU's own dot) and the ``__ynn_fusion`` fusions (XNNPACK's kernels), with
    their operands' dtypes."""
    dtype_of, found = {}, []
    for ln in scheduled_lines(hlo):
        m = INSTR.match(ln)
        if not m:
            continue
        name, out, op, operands, rest = m.groups()
        dtype_of[name] = out
        if op == "dot" or (op == "fusion" and "__ynn_fusion" in rest):
            found.append(("dot" if op == "dot" else "ynn", out,
                          re.findall(r"%([\w.\-]+)", operands)))
    return collections.Counter(
        f"{kind}: " + " x ".join(dtype_of.get(o, "?") for o in ops) + f" -> {out}"
        for kind, out, ops in found)


def main(argv=None):
    from dominotree_jax.precision import BENCHMARKED_PRECISIONS, add_precision_argument
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_precision_argument(ap, "--dtypes", aliases=(), many=True, pairs=False,
                           default=BENCHMARKED_PRECISIONS, help="comma-separated precisions")
    args = ap.parse_args(argv)
    import jax
    import jax.numpy as jnp

    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_gguf_path
    from dominotree_jax.decoding.verify import verify
    from dominotree_jax.model.cache import KVCache
    from dominotree_jax.model.target import bind_target
    from benchmarks.step.profile import step_inputs

    for dtype in args.dtypes:
        t = dj.load_target(smollm2_gguf_path(), precision=dtype, tokenizer=False)
        cfg = t.config

        def step(cache, params, t0_B, start_B, tokens_BN, depths_BN, ancestor_BRR):
            logits, _, new_cache = verify(bind_target(cfg, params), cache, t0_B, start_B,
                                          tokens_BN, depths_BN, ancestor_BRR, ())
            return new_cache, jnp.argmax(logits, -1)

        for rows in (1, 17):
            inputs = step_inputs(cfg, 1, rows, 256, 128)
            cache = KVCache.for_target(cfg, 1, 256, jax.tree.leaves(t.params)[0].dtype)
            hlo = jax.jit(step, donate_argnums=0).lower(cache, t.params, *inputs).compile() \
                .as_text()
            kinds = ", ".join(f"{n}x {k}" for k, n in sorted(product_kinds(hlo).items()))
            conv = weight_upcasts(hlo)
            print(f"{dtype}, {rows}-row step: dots: {kinds}; instructions outputting a float32 "
                  f"weight-shaped array (convert/fusion): {conv}", flush=True)
