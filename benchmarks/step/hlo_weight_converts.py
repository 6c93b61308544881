"""Where a bf16 target's weights are converted in the compiled ``ar`` decode (no timing).

Compiles ``decode`` (method ``ar``, batch 1) for SmolLM2-135M with bf16 weights and counts, in
the optimised HLO, the entry computation's fusions that output a float32 array of a weight's
shape (the hoisted bf16 -> float32 converts, run once per call) and the lines of the
``while`` body that name a bf16 weight shape (a convert or product inside the loop).

    python -m benchmarks step hlo_weight_converts [--precision bfloat16]
    python -m benchmarks step hlo_weight_converts --method dominotree --budget auto  # + drafter

``--method`` other than ``ar`` loads the shipped drafter in the same precision (the weight shapes
counted are the target's; the drafter's own shapes may add to the entry count).
"""

from __future__ import annotations

import argparse
import re

WEIGHT_SHAPES = r"(49152,576|576,49152|576,1536|1536,576|576,576|192,576)"


def computations(hlo: str) -> dict[str, list[str]]:
    comps, cur = {}, None
    for ln in hlo.splitlines():
        if ln and not ln.startswith(" ") and ln.rstrip().endswith("{"):
            cur = "ENTRY" if ln.startswith("ENTRY") else ln.split()[0]
            comps[cur] = []
        elif cur:
            comps[cur].append(ln)
    return comps


def main(argv=None):
    from dominotree_jax.precision import add_precision_argument
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_precision_argument(ap, default="bfloat16", help="the pair's precision")
    ap.add_argument("--method", default="ar")
    ap.add_argument("--budget", default="16", help="an int, or 'auto'")
    args = ap.parse_args(argv)
    import jax
    import jax.numpy as jnp

    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_gguf_path

    if args.method == "ar":
        t = dj.load_target(smollm2_gguf_path(), precision=args.precision, tokenizer=False)
        cfg = dj.DecodeConfig(target=t.config, method="ar", max_new_tokens=16, stop_ids=())
        params, state = {"target": t.params, "drafter": None}, None
    else:
        from dominotree_jax.decoding.auto_size import initial_state
        from dominotree_jax.measure.default_pair import load_models
        pair = load_models(None, None, args.precision)[0]
        budget = args.budget if args.budget == "auto" else int(args.budget)
        cfg = pair.config(args.method, max_new_tokens=16, stop_ids=(), budget=budget)
        params = pair.params
        state = initial_state(cfg, 1) if cfg.is_auto else None
    hlo = jax.jit(dj.decode, static_argnames="config").lower(
        params, jax.ShapeDtypeStruct((1, 32), jnp.int32), config=cfg,
        auto_state=state).compile().as_text()
    comps = computations(hlo)
    entry = sum(bool(re.search(r"=\s*f32\[" + WEIGHT_SHAPES + r"\]\S*\s+fusion\(", ln))
                for ln in comps["ENTRY"])
    bodies = re.findall(r"while\(.*?body=%?([\w.\-]+)", hlo)
    in_body = sum(bool(re.search(r"bf16\[" + WEIGHT_SHAPES + r"\]", ln))
                  for b in bodies for ln in comps.get(b, []))
    # upcasts outside the entry: in a loop body, a conditional's branch or another computation
    # that runs per iteration (fusion bodies excluded: their fusion is the instruction counted)
    upcast = re.compile(r"=\s*f32\[" + WEIGHT_SHAPES + r"\]\S*\s+(fusion|convert)\(")
    per_comp = {name: sum(bool(upcast.search(ln)) for ln in lines)
                for name, lines in comps.items() if name != "ENTRY"
                and not name.lstrip("%").startswith(("fused", "wrapped"))}
    per_iter = sum(per_comp.values())
    shapes = {}   # the per-iteration upcasts by weight shape
    for name, lines in comps.items():
        if name != "ENTRY" and not name.lstrip("%").startswith(("fused", "wrapped")):
            for ln in lines:
                m = upcast.search(ln)
                if m:
                    shape = re.search(r"f32\[([\d,]+)\]", ln).group(1)
                    shapes[shape] = shapes.get(shape, 0) + 1
    branches = set(re.findall(r"branch_computations=\{([^}]*)\}", hlo))
    in_branch = {c.strip().lstrip("%") for b in branches for c in b.split(",")}
    in_branch |= set(re.findall(r"(?:true|false)_computation=%?([\w.\-]+)", hlo))
    where = ", ".join(
        f"{n.lstrip('%')} ({c}" + (", a conditional branch)" if n.lstrip("%") in in_branch else ")")
        for n, c in sorted(per_comp.items(), key=lambda x: -x[1]) if c)
    print(f"{args.precision} {args.method} (budget {args.budget}) decode: {entry} entry fusions "
          f"output float32 weight-shaped arrays (once per call); {len(bodies)} while loop(s) "
          f"whose bodies name a bf16 weight shape on {in_body} line(s); {per_iter} float32 "
          f"weight-shaped convert/fusion outputs outside the entry (per iteration)"
          + (f": in {where}; shapes " + ", ".join(f"[{k}] x{v}" for k, v in shapes.items())
             if where else ""))
