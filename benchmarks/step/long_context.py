"""A decode step and a DominoTree round at a long context against a short one, side by side in
one process (issue 47 item 2): the `ar` step's time per token and a fixed budget-16 DominoTree
round's time, each at every ``--contexts`` length, and their ratio to the shortest context.

The prompt is the long-prompt benchmark's (``step long_prompt``: documentation text cut to the
length, then a question). Times are differences of two decodes that share the prompt (so its
prefill, the bulk of a long call, cancels): ``ar`` per token = (decode of 5 + D tokens - decode
of 5) / D; a round = (decode of 5 + E tokens - decode of 5) / (its rounds - the short one's), at
T 0 (the rounds are then fixed). Every program is compiled first; the calls are interleaved
run by run (``measure.timing.interleaved_medians``) and each figure is the median of
``--runs``. Batch 1, SmolLM2-135M + the shipped drafter at ``--precision``. At ~4k context a
call is ~5-6 s of prefill around ~2 s of 96 decode steps (Zen 5, 2 cores), so the prefill's
noise moves the per-step figure by 10-15 %: read one run as a rough ratio. So the ``ar`` step
is also timed alone: the prompt prefilled once, then a compiled loop of greedy target steps on
a copy of that cache (the target's forward and head only, without ``decode``'s sampling and
bookkeeping), ``D`` steps minus ``5``; and the decode loop's round itself, ``ar`` and a
budget-16 DominoTree round, each as one compiled program on a prefilled cache (``round
stages``' "fused" program, ``--round-repeats`` interleaved calls): the steadiest figure for the
round's growth with the context (the differences above carry the prefill's noise).

    python -m benchmarks step long_context [--contexts 64 4000] [--runs 3] [--decode 32]
        [--spec 48] [--round-repeats 21] [--rounds-only] [--precision float32] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import functools
import platform
import statistics
import time

from benchmarks.common import RESULTS, command_line
from dominotree_jax.precision import BENCHMARKED_PRECISIONS, add_precision_argument
from benchmarks.step.long_prompt import prompt_ids

WARM = 5   # tokens of the shorter decode of each pair


def decode_program(pair, ids, method: str, new_tokens: int):
    """A compiled decode of ``new_tokens`` (T 0) and its output."""
    import jax
    import jax.numpy as jnp

    import dominotree_jax as dj
    if method == "ar":
        cfg = dj.DecodeConfig(target=pair.target.config, method="ar", max_new_tokens=new_tokens,
                              stop_ids=())
        params = {"target": pair.target.params, "drafter": None}
    else:
        cfg = pair.config(method, max_new_tokens=new_tokens, budget=16, stop_ids=())
        params = pair.params
    prog = jax.jit(dj.decode, static_argnames="config").lower(
        params, jax.ShapeDtypeStruct(ids.shape, jnp.int32), config=cfg).compile()
    out = jax.block_until_ready(prog(params, ids))
    return (lambda: jax.block_until_ready(prog(params, ids))), out


def ar_step_runner(pair, ids, steps: int, slots: int):
    """``run() -> seconds``: a compiled loop of ``steps`` greedy target steps on a copy of the
    prompt's cache (prefilled once, ``slots`` slots): the step alone, without the prefill."""
    import jax
    import jax.numpy as jnp

    from dominotree_jax.model.target import bind_target, prefill
    from dominotree_jax.sampling import first_argmax
    cfg = pair.target.config
    T = ids.shape[1]

    @jax.jit
    def prefilled(params, prompt_BT):
        out, last_BV = prefill(bind_target(cfg, params), prompt_BT,
                               jnp.full((1,), T, jnp.int32), slots)
        return out.cache, first_argmax(last_BV)

    @functools.partial(jax.jit, donate_argnums=1)
    def loop(params, cache, tok_B):
        target = bind_target(cfg, params)

        def step(i, carry):
            cache, tok_B = carry
            pos_B = jnp.full((1,), T, jnp.int32) + i
            out = target.forward_cached(tok_B[:, None], pos_B[:, None], cache, pos_B, pos_B,
                                        jnp.ones((1, 1, 1), bool))
            return out.cache, first_argmax(target.logits(out.hidden[:, 0]))

        return jax.lax.fori_loop(0, steps, step, (cache, tok_B))

    params = pair.target.params
    cache, tok_B = jax.block_until_ready(prefilled(params, ids))

    def run():
        fresh = jax.tree.map(jnp.copy, cache)   # (the loop consumes its cache)
        jax.block_until_ready(fresh)
        t0 = time.perf_counter()
        jax.block_until_ready(loop(params, fresh, tok_B))
        return time.perf_counter() - t0

    run()   # compiles
    return run


def ar_steps_alone(pair, contexts, runs: int, steps: int) -> list[dict]:
    """ms per greedy target step on a prefilled cache at each context (interleaved runs)."""
    import numpy as np
    runners = {}
    for n in contexts:
        ids = np.asarray([prompt_ids(pair.target, n)], np.int32)
        slots = n + steps + 1
        runners[n] = (ar_step_runner(pair, ids, steps, slots),
                      ar_step_runner(pair, ids, WARM, slots))
    times = {n: ([], []) for n in contexts}
    for _ in range(runs):
        for n, (long_, short) in runners.items():
            times[n][0].append(long_())
            times[n][1].append(short())
    rows = []
    for n in contexts:
        long_s, short_s = (statistics.median(t) for t in times[n])
        rows.append(dict(context=n, ms_per_step=1e3 * (long_s - short_s) / (steps - WARM)))
    for r in rows:
        r["x_short"] = r["ms_per_step"] / rows[0]["ms_per_step"]
    return rows


def rounds_alone(pair, contexts, repeats: int) -> list[dict]:
    """ms per call of the decode loop's own round program on a prefilled cache at each context,
    no prefill timed: the ``ar`` step and a budget-16 DominoTree round (``round stages``' "fused"
    program, T 0, the round's start fixed so every call redoes the same round), all programs'
    calls interleaved (``interleaved_medians``, ``repeats`` each)."""
    import jax
    import jax.numpy as jnp

    from benchmarks.round.stages import Stages, ar_step, prefilled_context
    from dominotree_jax.measure.timing import interleaved_medians
    configs = {m: pair.config(m, max_new_tokens=64, budget=16) for m in ("ar", "dominotree")}
    copy = functools.partial(jax.tree.map, jnp.copy)   # fresh buffers: the programs donate
    fns = {}
    for n in contexts:
        slots = n + configs["dominotree"].num_draft_nodes + 1 + 64
        cache0, ctx0, t0_B, start_B = prefilled_context(pair, n, slots)
        step, fused = ar_step(pair, configs["ar"]), Stages(pair, configs["dominotree"]).fused
        state = {"ar": copy(cache0), "dominotree": (copy(cache0), copy(ctx0))}

        def run_ar(state=state, step=step, t0_B=t0_B, start_B=start_B):
            tok, state["ar"] = step(pair.params, state["ar"], t0_B, start_B)
            jax.block_until_ready(tok)

        def run_tree(state=state, fused=fused, t0_B=t0_B, start_B=start_B):
            state["dominotree"] = fused(pair.params, *state["dominotree"], t0_B, start_B)
            jax.block_until_ready(state["dominotree"])

        run_ar(), run_tree()   # compile both here, not inside the timed passes' warm-up
        fns[f"{n}/ar"], fns[f"{n}/dominotree"] = run_ar, run_tree
        print(f"compiled the rounds alone at context {n}", flush=True)
    ms = interleaved_medians(fns, repeats)
    rows = [dict(context=n, ar_ms=ms[f"{n}/ar"], round_ms=ms[f"{n}/dominotree"])
            for n in contexts]
    for r in rows:
        r["ar_x_short"] = r["ar_ms"] / rows[0]["ar_ms"]
        r["round_x_short"] = r["round_ms"] / rows[0]["round_ms"]
        r["round_x_ar"] = r["round_ms"] / r["ar_ms"]
    return rows


def measure(pair, contexts, runs: int, decode: int, spec: int) -> list[dict]:
    import numpy as np
    calls, meta = [], []
    for n in contexts:
        ids = np.asarray([prompt_ids(pair.target, n)], np.int32)
        for method, extra in (("ar", decode), ("dominotree", spec)):
            short, s_out = decode_program(pair, ids, method, WARM)
            long_, l_out = decode_program(pair, ids, method, WARM + extra)
            rounds = int(l_out.num_rounds[0]) - int(s_out.num_rounds[0])
            calls += [short, long_]
            meta.append((n, method, rounds, int(l_out.num_tokens[0]) - int(s_out.num_tokens[0])))
            print(f"compiled context {n} {method}: {rounds} rounds apart", flush=True)
    from dominotree_jax.measure.timing import interleaved_medians
    ms = interleaved_medians({str(i): f for i, f in enumerate(calls)}, runs, warmup=0)
    secs = [ms[str(i)] / 1e3 for i in range(len(calls))]
    rows = []
    for i, (n, method, rounds, tokens) in enumerate(meta):
        short_s, long_s = secs[2 * i], secs[2 * i + 1]
        print(f"context {n} {method}: {short_s:.3f} s and {long_s:.3f} s", flush=True)
        if long_s <= short_s:
            raise SystemExit(f"context {n} {method}: the longer decode was not slower ("
                             f"{long_s:.3f} <= {short_s:.3f} s): the prefill's noise is "
                             "larger than the decode timed; raise --decode / --spec or --runs")
        rows.append(dict(context=n, method=method, rounds=rounds, tokens=tokens,
                         short_s=short_s, long_s=long_s,
                         ms_per_round=1e3 * (long_s - short_s) / max(rounds, 1)))
    for r in rows:
        base = next(b for b in rows if b["method"] == r["method"])
        r["x_short"] = r["ms_per_round"] / base["ms_per_round"]
        ar = next(b for b in rows if b["method"] == "ar" and b["context"] == r["context"])
        r["x_ar_step"] = r["ms_per_round"] / ar["ms_per_round"]
    return rows


def table(rows, args, cpu: str, argv) -> str:
    lines = [f"# A step and a DominoTree round at long contexts ({args.precision})", "",
             f"`{command_line('step', 'long_context', argv)}`", "",
             f"{cpu}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, batch 1, T 0, "
             f"median of {args.runs} interleaved runs.", "",
             "| context | method | ms / round | x the shortest context | x this context's AR "
             "step | rounds timed | tokens | calls timed (s) |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['context']} | {r['method']} | {r['ms_per_round']:.1f} | "
                     f"{r['x_short']:.2f} | {r['x_ar_step']:.2f} | {r['rounds']} | "
                     f"{r['tokens']} | {r['short_s']:.2f} / {r['long_s']:.2f} |")
    return "\n".join(lines) + "\n"


def alone_table(rows, args) -> str:
    lines = ["", f"The target's greedy step alone on a prefilled cache (no prefill in the "
             f"timed calls; {args.decode} steps minus {WARM}, slots = context + "
             f"{args.decode} + 1):", "",
             "| context | ms / step | x the shortest context |", "|---|---:|---:|"]
    lines += [f"| {r['context']} | {r['ms_per_step']:.2f} | {r['x_short']:.2f} |" for r in rows]
    return "\n".join(lines) + "\n"


def rounds_table(rows, repeats: int) -> str:
    lines = ["", f"The decode loop's round alone on a prefilled cache (`round stages`' fused "
             f"program: no prefill in the timed calls; median of {repeats} interleaved calls):",
             "", "| context | `ar` step ms | x the shortest | DominoTree round ms | x the "
             "shortest | x this context's `ar` step |", "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['context']} | {r['ar_ms']:.2f} | {r['ar_x_short']:.2f} | "
              f"{r['round_ms']:.2f} | {r['round_x_short']:.2f} | {r['round_x_ar']:.2f} |"
              for r in rows]
    return "\n".join(lines) + "\n"


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        name = next(line.split(":", 1)[1].strip() for line in text.splitlines()
                    if line.startswith("model name"))
        flags = [f for f in ("amx_bf16", "avx512_bf16") if f" {f}" in text]
        return f"{name} ({', '.join(flags) or 'no bf16 units'})"
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[64, 4000])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--decode", type=int, default=32, help="ar tokens timed per context")
    ap.add_argument("--spec", type=int, default=48, help="DominoTree tokens timed per context")
    ap.add_argument("--round-repeats", type=int, default=21,
                    help="calls of each round program alone (0: skip that table)")
    ap.add_argument("--rounds-only", action="store_true",
                    help="only the rounds alone (no decode calls, no step loop)")
    add_precision_argument(ap, pairs=False, choices=BENCHMARKED_PRECISIONS)
    ap.add_argument("--out", default=str(RESULTS / "long_context" / "step_and_round.md"))
    args = ap.parse_args(argv)
    if sorted(args.contexts) != args.contexts or args.contexts[0] < 16:
        raise SystemExit("--contexts must be increasing lengths of at least 16 tokens")
    if args.rounds_only and not args.round_repeats:
        raise SystemExit("--rounds-only needs --round-repeats > 0")
    from dominotree_jax.measure.default_pair import load_models
    pair, _, _ = load_models(None, None, args.precision)
    alone = [] if args.rounds_only else ar_steps_alone(pair, args.contexts, args.runs,
                                                       args.decode)
    for r in alone:
        print(f"ar step alone, context {r['context']}: {r['ms_per_step']:.2f} ms "
              f"({r['x_short']:.2f}x)", flush=True)
    alone_rounds = (rounds_alone(pair, args.contexts, args.round_repeats)
                    if args.round_repeats else [])
    for r in alone_rounds:
        print(f"rounds alone, context {r['context']}: ar {r['ar_ms']:.2f} ms "
              f"({r['ar_x_short']:.2f}x), DominoTree {r['round_ms']:.2f} ms "
              f"({r['round_x_short']:.2f}x)", flush=True)
    if args.rounds_only:
        text = (f"# The decode loop's round at long contexts ({args.precision})\n\n"
                f"`{command_line('step', 'long_context', argv)}`\n\n{cpu_name()}, "
                f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, batch 1, T 0.\n"
                + rounds_table(alone_rounds, args.round_repeats))
    else:
        rows = measure(pair, args.contexts, args.runs, args.decode, args.spec)
        text = table(rows, args, cpu_name(), argv) + alone_table(alone, args)
        if alone_rounds:
            text += rounds_table(alone_rounds, args.round_repeats)
    print(text)
    with open(args.out, "w") as f:
        f.write(text)
