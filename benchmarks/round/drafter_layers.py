"""What a drafter layer costs: the draft stage of several drafters against one AR step.

Each ``--drafter`` directory (released Domino format, SmolLM2 target) drafts one block after
``--context`` committed tokens; its draft stage (``Drafter.draft``: backbone layers + the
shared LM head) and its ``dominotree`` round fused into one jitted call are timed interleaved
with the target's AR step, so the figures are ratios measured side by side. Use it to decide
whether an extra drafter layer is worth its acceptance: a round costs ``fused / AR`` steps and
commits ``τ`` tokens.

    JAX_PLATFORMS=cpu python -m benchmarks round drafter_layers --drafter shipped \
        --drafter runs/d2/drafter [--repeats 21]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import dominotree_jax as dj
from convert.drafter import load_drafter
from benchmarks.round.stages import Stages, ar_step, prefilled_context
from dominotree_jax.assets import smollm2_drafter_path, smollm2_gguf_path
from dominotree_jax.measure.timing import interleaved_medians


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", action="append", required=True,
                    help="drafter directory, or 'shipped' (repeatable)")
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--context", type=int, default=200)
    args = ap.parse_args(argv)
    if args.repeats < 10:
        ap.error("--repeats must be >= 10")

    target = dj.load_target(smollm2_gguf_path())
    C, S = args.context, args.context + 128
    fns, names, first = {}, [], None
    copy = lambda tree: jax.tree.map(jnp.copy, tree)  # noqa: E731
    for spec in args.drafter:
        path = smollm2_drafter_path() if spec == "shipped" else spec
        dcfg, dparams = load_drafter(path, target_cfg=target.config)
        pair = dj.Pair(target, dcfg, dparams)
        cfg = pair.config("dominotree", max_new_tokens=64, budget=16, node_topk=8, top_m=64)
        st = Stages(pair, cfg)
        cache, ctx, t0_B, start_B = prefilled_context(pair, C, S)
        params = pair.params
        if first is None:
            first = (ar_step(pair, pair.config("ar", max_new_tokens=64)), params, cache,
                     t0_B, start_B)
        state = {"cache": copy(cache), "ctx": copy(ctx)}

        def run_fused(state=state, st=st, params=params, t0_B=t0_B, start_B=start_B):
            state["cache"], state["ctx"] = st.fused(params, state["cache"], state["ctx"],
                                                    t0_B, start_B)
            jax.block_until_ready(state["ctx"])

        name = f"{spec} ({pair.drafter_config.num_hidden_layers} layer(s))"
        names.append(name)
        fns[f"{name}/draft"] = (lambda st=st, params=params, ctx=ctx, t0_B=t0_B,
                                start_B=start_B: st.draft(params, ctx, t0_B, start_B))
        fns[f"{name}/round"] = run_fused
        print(f"  compiled {name}", flush=True)

    step, params, cache, t0_B, start_B = first
    ar_state = {"cache": copy(cache)}

    def run_ar():
        tok, ar_state["cache"] = step(params, ar_state["cache"], t0_B, start_B)
        tok.block_until_ready()

    fns["ar"] = run_ar
    med = interleaved_medians(fns, args.repeats)
    ar = med["ar"]
    print(f"\nSmolLM2-135M, context {C} tokens, median of {args.repeats}, "
          f"{jax.default_backend()}; AR step {ar:.1f} ms\n")
    print("| drafter | draft ms (× AR) | dominotree round ms (× AR) |")
    print("|---|---|---|")
    for n in names:
        d, r = med[f"{n}/draft"], med[f"{n}/round"]
        print(f"| {n} | {d:.1f} ({d / ar:.2f}×) | {r:.1f} ({r / ar:.2f}×) |")
