"""``budget="auto"`` on bf16 weights with and without the float32 view of its plain steps and
the one-row pad, and bf16 ``ar`` with and without the pad, against float32 ``ar``, side by side
in one process (real SmolLM2-135M + shipped drafter).

On CPU XLA has no fast one-row 16-bit product: ``precision.PAD_ONE_ROW_16BIT`` (the default)
computes one-row products as two rows. When the policy may draft, ``decode`` also gives the auto
round's plain-step branch and the Domino head a float32 view of the 16-bit weights, made once
per call before the loop (``precision.uses_float32_view``); without the view and the pad the
branch upcasts every weight each round (XLA hoists no convert out of a ``lax.switch`` branch).
The runs patch those two while tracing.

    python -m benchmarks methods auto_view --prompts 3 --new 64 --method dominotree

Prints tokens/s per run (all prompts, after a compiling call), tau and the plain-step share,
and the ratios. Pause other CPU work while it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import time
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.measure.timing import cpu_model


@contextlib.contextmanager
def no_view():
    """Traced without the float32 view (the pad stays)."""
    with mock.patch("dominotree_jax.precision.uses_float32_view", lambda *a: False):
        yield


@contextlib.contextmanager
def no_pad():
    """Traced without the one-row pad (the view stays)."""
    with mock.patch("dominotree_jax.precision.PAD_ONE_ROW_16BIT", False):
        yield


@contextlib.contextmanager
def neither():
    with no_view(), no_pad():
        yield


def run_config(pair, cfg, prompts_by_set: dict, width: int, patch=None) -> dict:
    """``{set: {tok_s, tau, taus, plain, outs}}`` for one config (``run_configs``, one rep)."""
    return run_configs({"run": (pair, cfg, patch)}, prompts_by_set, width)["run"]


def run_configs(runs: dict, prompts_by_set: dict, width: int, reps: int = 1) -> dict:
    """``{label: {set: {tok_s, tau, taus, plain, outs}}}`` for ``runs = {label: (pair, config,
    patch)}``: one jitted ``decode`` per run, compiled first (``patch``: a context manager
    active meanwhile), then ``reps`` passes over every prompt (batch 1, right-padded to
    ``width``), each prompt decoded by every run in turn, in an order rotated from prompt to
    prompt: a run's time is summed over the same moments as the others', so a drift of the
    machine's speed falls on every run alike. ``tok_s``: tokens / seconds over all reps;
    ``tau``: tokens / rounds over the set; ``taus``: per prompt; ``plain``: the share of
    plain-step rounds; ``outs``: each prompt's tokens (first rep)."""
    from dominotree_jax import decode
    from dominotree_jax.decoding.auto_size import initial_state

    def compiled(pair, cfg, patch):
        state = initial_state(cfg, 1) if cfg.is_auto else None

        def fn(params, x, n, st):   # a fresh function per run: its own trace
            return decode(params, x, config=cfg, prompt_lengths=n, auto_state=st)
        jfn = jax.jit(fn)

        def one(p):
            x = np.pad(np.asarray(p, np.int32), (0, width - len(p)))[None]
            return jfn(pair.params, x, jnp.array([len(p)], jnp.int32), state)

        with patch() if patch else contextlib.nullcontext():
            jax.block_until_ready(one(next(iter(prompts_by_set.values()))[0]))   # compile
        return one

    fns = {label: compiled(*run) for label, run in runs.items()}
    labels = list(fns)
    acc = {label: {name: dict(tokens=0, secs=0.0, rounds=0, taus=[], sizes=[], outs=[])
                   for name in prompts_by_set} for label in labels}
    turn = 0
    for rep in range(reps):
        for name, prompts in prompts_by_set.items():
            for p in prompts:
                turn += 1
                for label in labels[turn % len(labels):] + labels[:turn % len(labels)]:
                    t0 = time.perf_counter()
                    o = jax.block_until_ready(fns[label](p))
                    a = acc[label][name]
                    a["secs"] += time.perf_counter() - t0
                    k, r = int(o.num_tokens[0]), int(o.num_rounds[0])
                    a["tokens"] += k
                    a["rounds"] += r
                    if rep == 0:
                        a["taus"].append(k / max(r, 1))
                        a["sizes"].extend(np.asarray(o.draft_sizes[0, :r]).tolist())
                        a["outs"].append(np.asarray(o.tokens[0, :k]))
    return {label: {name: dict(tok_s=a["tokens"] / a["secs"],
                               tau=a["tokens"] / max(a["rounds"], 1), taus=a["taus"],
                               plain=float(np.mean(np.asarray(a["sizes"]) == 0))
                               if a["sizes"] else 1.0, outs=a["outs"])
                    for name, a in by_set.items()}
            for label, by_set in acc.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=3, help="per dataset")
    ap.add_argument("--datasets", default="humaneval,mtbench,math500")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--method", default="dominotree")
    ap.add_argument("--width", type=int, default=256, help="prompt bucket (right-padded)")
    args = ap.parse_args(argv)

    from dominotree_jax.calibrate import cast_pair
    from dominotree_jax.measure import eval_prompts
    from dominotree_jax.measure.default_pair import load_models

    pair32 = load_models(None, None, "float32")[0]
    pair16 = cast_pair(pair32, "bfloat16")
    prompts = [pair32.target.chat_prompt(t) for d in args.datasets.split(",")
               for t in eval_prompts.load(d, args.prompts, 0)]
    prompts = [p[-args.width:] for p in prompts]

    def run(pair, method, budget, patch=None):
        cfg = pair.config(method, max_new_tokens=args.new, stop_ids=(), budget=budget)
        r = run_config(pair, cfg, {"all": prompts}, args.width, patch)["all"]
        return dict(r, tau=float(np.mean(r["taus"])))

    m = args.method
    rows = [("float32 ar", run(pair32, "ar", 16)),
            (f"bf16 {m} auto (float32 view, one-row pad)", run(pair16, m, "auto")),
            (f"bf16 {m} auto, no view", run(pair16, m, "auto", no_view)),
            (f"bf16 {m} auto, neither", run(pair16, m, "auto", neither)),
            ("bf16 ar (one-row pad)", run(pair16, "ar", 16)),
            ("bf16 ar, no pad", run(pair16, "ar", 16, no_pad))]
    base = rows[0][1]["tok_s"]
    print(f"# bf16 auto with/without the float32 view and the one-row pad — {cpu_model()}, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"{len(prompts)} prompts x {args.new} tokens, T 0, prompt bucket {args.width}\n")
    print("| run | tok/s | x float32 ar | tau | plain-step rounds |")
    print("|---|---:|---:|---:|---:|")
    for name, r in rows:
        print(f"| {name} | {r['tok_s']:.1f} | {r['tok_s'] / base:.2f} | {r['tau']:.2f} | "
              f"{r['plain']:.0%} |")
    view, no = rows[1][1], rows[2][1]
    same = all(np.array_equal(a, b) for a, b in zip(view["outs"], no["outs"]))
    print(f"\nview / no view: {view['tok_s'] / no['tok_s']:.2f}x; "
          f"tokens identical: {same}")
