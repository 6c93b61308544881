"""Measure this machine's round costs for ``budget="auto"`` and cache them on disk.

    python -m dominotree_jax.calibrate [--target PATH] [--drafter DIR|random] [--batches 1,16]
        [--rows 1,3,5,9,17] [--context 256] [--rounds 8] [--repeats 5] [--out PATH] [--dry-run]
        [--precision auto|float32|bfloat16|float16]

Precision first (docs/precision.md): with ``--precision auto`` (the default) the target's own
matrix products are timed in float32 and in bf16 (``product_timing.py``) at one row (an AR step)
and at the largest ``--rows`` (a verify); the precision whose step + verify products take less
time is chosen (on a CPU without bf16 matrix units that is float32), printed, and the round costs
below are measured with the pair in it. The table is stored per precision.

Every cost is in ``ar`` steps (one round of plain decoding at the same batch size), each the
median of ``--repeats`` timed calls of a jitted loop of ``--rounds`` rounds against a committed
context of ``--context`` real tokens, the programs interleaved so load drift hits all alike:

- verify ``R`` rows: the verify + accept + commit of auto mode (drafter context extension
  included), for each ``--rows``; ``R = 1`` is auto mode's plain step, timed where decode runs
  it: on the float32 views of 16-bit weights on CPU at batch 1 (``plain_step_params``);
- draft, per method: the drafter's block forward + the chain or tree build (trees at 16 nodes).

The programs run in a shuffled order each pass (``timing.interleaved_medians``).

The table is written to ``$DOMINOTREE_JAX_COSTS`` or ``~/.cache/dominotree_jax/costs.json``
under a key of backend, device kind and the two models' shapes. It is read only when asked:
``decoding.costs.load_calibrated_costs`` (which ``Pair.config(budget="auto")`` calls); a
``DecodeConfig`` built directly uses the default cost model unless given ``auto_costs``.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.precision import AUTO, Precision, add_precision_argument
from dominotree_jax.measure.timing import interleaved_medians


def _csv_ints(s: str) -> tuple[int, ...]:
    return tuple(int(x) for x in s.split(",") if x.strip())


def context_tokens(target, n: int) -> np.ndarray:
    """``n`` real tokens: chat-formatted HumanEval prompts, concatenated (cycled if short);
    seeded random ids for a target without a tokenizer (tests)."""
    from dominotree_jax.measure import eval_prompts as prompt_sets
    if getattr(target, "tokenizer", None) is None:
        return np.random.default_rng(0).integers(1, target.config.vocab_size, n).astype(np.int32)
    ids: list[int] = []
    for text in prompt_sets.humaneval(16):
        ids += target.chat_prompt(text)
        if len(ids) >= n:
            break
    return np.resize(np.asarray(ids, np.int32), n)


class RoundPrograms:
    """Jitted loops of ``rounds`` rounds at batch ``B`` over one committed context, built from
    the decode loop's own functions (``decoding/round.py``)."""

    def __init__(self, pair, batch: int, context: int, rounds: int, max_rows: int):
        from dominotree_jax.decoding.costs import default_tables
        from dominotree_jax.decoding.draft import bind_drafter_for, tap_layers_for
        from dominotree_jax.decoding.round import prefill_context
        from dominotree_jax.model.target import bind_target

        self.pair, self.B, self.rounds = pair, batch, rounds
        # auto mode's verify of r rows is its size r - 1 (a tree config: any size goes)
        self.auto_config = pair.config("ddtree", budget="auto", node_topk=1, top_m=0,
                                       auto_sizes=(0, max(max_rows - 1, 1)),
                                       auto_costs=default_tables())
        self.ar_config = pair.config("ar")
        S = context + max_rows + 8
        ids = context_tokens(pair.target, context + 1)
        ids_BT = jnp.asarray(np.tile(ids[None], (batch, 1)))
        self.t0_B = ids_BT[:, context]
        self.start_B = jnp.full((batch,), context, jnp.int32)
        lengths_B = jnp.full((batch,), context, jnp.int32)
        self.chain = jnp.asarray(np.resize(ids, max_rows))  # node tokens (a real-text chain)

        def bind(params, config):
            return (bind_target(config.target, params["target"]),
                    bind_drafter_for(config, params["drafter"]))

        @jax.jit
        def prefill_both(params, ids_BT, lengths_B):
            target, drafter = bind(params, self.auto_config)
            pre = prefill_context(target=target, drafter=drafter, prompt_BT=ids_BT,
                                  lengths_B=lengths_B, max_len=S,
                                  tap_layers=tap_layers_for(self.auto_config))
            return pre.cache, pre.ctx

        self.cache, self.ctx = prefill_both(pair.params, ids_BT[:, :context], lengths_B)
        self._bind = bind
        self.plain_params = plain_step_params(pair.params, batch)

    def _verify_fn(self, rows: int, plain_ar: bool):
        """The jittable loop of ``verify_loop`` and its arguments."""
        from dominotree_jax.decoding.draft import draft_from_tree
        from dominotree_jax.decoding.loop_inputs import LoopConstants, RoundInput
        from dominotree_jax.decoding.round import commit_rows, fixed_round, sized_round
        from dominotree_jax.tree import chain_tree

        n, B = rows - 1, self.B
        config = self.ar_config if plain_ar else self.auto_config
        tokens_BN = jnp.broadcast_to(self.chain[:n], (B, n))
        draft = draft_from_tree(chain_tree(tokens_BN, jnp.zeros((B, n))))

        def loop(params, plain_params, cache, ctx, t0_B, start_B):
            target, drafter = self._bind(params, config)
            # auto's plain step runs where decode runs it: on the float32 views (decode.py)
            plain_target, plain_drafter = (self._bind(plain_params, config) if n == 0
                                           else (None, None))
            consts = LoopConstants(config=config, target=target, drafter=drafter,
                                   plain_target=plain_target, plain_drafter=plain_drafter)
            out_BO = jnp.zeros((B, config.max_depth + 3), jnp.int32)

            def body(_, carry):
                cache, ctx, out_BO = carry
                inp = RoundInput(cache=cache, ctx=ctx, t0_B=t0_B, start_B=start_B,
                                 key=jax.random.key(0))
                result = (fixed_round(inp, consts.replace(plain_target=None,
                                                          plain_drafter=None), size=0)
                          if plain_ar else sized_round(inp, draft, consts, num_nodes=n))
                c = commit_rows(inp, result, consts, out_BO=out_BO,
                                logp_BO=out_BO.astype(jnp.float32),
                                n_B=jnp.ones((B,), jnp.int32), done_B=jnp.zeros((B,), bool))
                return c.cache, c.ctx, c.out_BO

            return jax.lax.fori_loop(0, self.rounds, body, (cache, ctx, out_BO))

        args = (self.pair.params, self.plain_params, self.cache,
                None if plain_ar else self.ctx, self.t0_B, self.start_B)
        return loop, args

    def verify_loop(self, rows: int, plain_ar: bool = False):
        """``rounds`` × auto mode's round of ``rows`` verify rows after its draft
        (``round.sized_round`` + ``commit_rows``, argmax); ``plain_ar``: the ``ar`` round
        (``round.fixed_round``: no taps, no drafter context) -- the unit. ``rows = 1`` is auto's
        plain step, on the float32 views of 16-bit CPU weights where decode runs it so
        (``plain_step_params``)."""
        loop, (params, plain_params, cache, ctx, t0_B, start_B) = self._verify_fn(rows, plain_ar)
        fn = jax.jit(loop, donate_argnums=(2, 3))
        state = {"cache": jax.tree.map(jnp.copy, cache), "ctx": jax.tree.map(jnp.copy, ctx)}

        def call():
            state["cache"], state["ctx"], out = fn(params, plain_params, state["cache"],
                                                   state["ctx"], t0_B, start_B)
            jax.block_until_ready(out)

        return call

    def verify_jaxpr(self, rows: int, plain_ar: bool = False):
        """The jaxpr of ``verify_loop(rows, plain_ar)``'s program (for tests)."""
        loop, args = self._verify_fn(rows, plain_ar)
        return jax.make_jaxpr(loop)(*args)

    def draft_loop(self, config):
        """``rounds`` × ``draft.draft_round`` of ``config.method`` (drafter block forward +
        chain/tree build), the Domino head reading the target embedding where decode's auto
        mode reads it (the float32 view of 16-bit CPU weights)."""
        from dominotree_jax.decoding.draft import draft_round
        from dominotree_jax.decoding.loop_inputs import LoopConstants, RoundInput

        def loop(params, plain_params, ctx, t0_B, start_B):
            target, drafter = self._bind(params, config)
            head_target, _ = self._bind(plain_params, config)
            consts = LoopConstants(config=config, target=target, drafter=drafter,
                                   # as decode: gathered before its loop
                                   head_rows_CH=drafter.head_rows(target),
                                   plain_target=head_target)

            def body(i, acc):
                inp = RoundInput(cache=None, ctx=ctx, t0_B=(t0_B + i) % 7, start_B=start_B,
                                 key=None)
                d = draft_round(inp, consts)
                return acc + d.tokens_BN.sum() + d.scores_BN.sum()

            return jax.lax.fori_loop(0, self.rounds, body, jnp.zeros((), jnp.float32))

        fn = jax.jit(loop)
        return lambda: jax.block_until_ready(fn(self.pair.params, self.plain_params, self.ctx,
                                                self.t0_B, self.start_B))


def plain_step_params(params, batch: int = 1) -> dict:
    """``params`` (``{"target", "drafter"}``) as auto mode's plain step of ``batch`` rows reads
    them: the float32 view of each 16-bit set where decode makes one
    (``precision.uses_float32_view``: on CPU at batch 1), else the set itself. Decode makes
    the views once per call, before its loop, so over a generation they cost next to nothing
    per round; made here once, outside the timed loops,
    the calibrated plain step costs what it costs in decode (inside each timed loop of a few
    rounds the upcast of every weight would dominate it)."""
    from dominotree_jax.precision import float32_view, params_precision, uses_float32_view
    backend = jax.default_backend()
    out = {}
    for name, tree in params.items():
        view = tree is not None and uses_float32_view(
            params_precision(tree, f"{name} parameters"), backend, batch)
        out[name] = float32_view(tree) if view else tree
    return out


def calibrate_batch(pair, batch: int, rows: tuple[int, ...], methods, *, context: int,
                    rounds: int, repeats: int, log=print):
    from dominotree_jax.decoding.costs import CostTable

    progs = RoundPrograms(pair, batch, context, rounds, max(rows))
    fns = {"ar": progs.verify_loop(1, plain_ar=True)}
    for r in rows:
        fns[f"verify/{r}"] = progs.verify_loop(r)
    for m in methods:
        cfg = pair.config(m, budget=16, node_topk=8)
        fns[f"draft/{m}"] = progs.draft_loop(cfg)
    t0 = time.perf_counter()
    med = interleaved_medians(fns, repeats)
    ar = med["ar"]
    log(f"batch {batch}: ar round {ar / rounds:.1f} ms; "
        + ", ".join(f"{k} {v / ar:.2f}" for k, v in med.items() if k != "ar")
        + f"  ({time.perf_counter() - t0:.0f} s)")
    return CostTable(batch=batch,
                     verify=tuple((r, round(med[f"verify/{r}"] / ar, 4)) for r in rows),
                     draft=tuple((m, round(med[f"draft/{m}"] / ar, 4)) for m in methods),
                     source="calibrated")


def choose_precision(product_ms: dict[str, dict[int, float]], rows: tuple[int, ...]) -> str:
    """The precision whose products of a one-row step plus a ``max(rows)``-row verify take
    least time; ``product_ms[precision][rows]`` is one target forward's product milliseconds.
    Ties go to float32 (exact, and the default)."""
    verify = max(rows)
    cost = {p: t[1] + t[verify] for p, t in product_ms.items()}
    return min(sorted(cost), key=lambda p: (cost[p], p != "float32"))


def measure_precisions(target_cfg, rows: tuple[int, ...], repeats: int) -> dict:
    """``{precision name: {rows: ms}}``: one target forward's matrix products in each
    benchmarked precision (``precision.BENCHMARKED_PRECISIONS``: float32, bf16)."""
    from dominotree_jax.measure import product_timing as matmul
    counts = (1, max(rows))
    table = matmul.time_products(matmul.product_shapes(target_cfg), rows=counts,
                                 repeats=max(5, repeats))
    return {dt: {m: round(matmul.forward_product_ms(target_cfg, table, m, dt), 3)
                 for m in counts} for dt in matmul.DTYPES}


def cast_pair(pair, precision):
    """``pair`` with target and drafter parameters in ``precision`` (a ``Precision`` or its
    text; ``Pair.with_precision``)."""
    return pair.with_precision(precision)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m dominotree_jax.calibrate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="target .gguf / HF dir (default: SmolLM2)")
    ap.add_argument("--drafter", default=None, help="drafter dir or 'random' (default: shipped)")
    ap.add_argument("--batches", type=_csv_ints, default=(1,))
    ap.add_argument("--rows", type=_csv_ints, default=(1, 3, 5, 9, 17))
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=8, help="rounds per timed call")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None, help="cost file (default: the cached one)")
    ap.add_argument("--dry-run", action="store_true", help="print, do not write")
    add_precision_argument(ap, aliases=(), default=AUTO, auto=True, pairs=False,
                           help="the pair's precision (auto: the faster products on this "
                                "machine)")
    args = ap.parse_args(argv)
    rows = tuple(sorted(set(args.rows)))
    if not rows or rows[0] != 1 or len(rows) < 2:
        ap.error("--rows must include 1 and at least one larger row count")
    if min(args.batches, default=0) < 1 or args.repeats < 1 or args.rounds < 1:
        ap.error("--batches, --repeats and --rounds must be positive")

    from dominotree_jax.measure.default_pair import load_models, usable_methods
    from dominotree_jax.decoding import costs

    pair, target_name, drafter_name = load_models(args.target, args.drafter)
    product_ms = None
    precision = args.precision
    if precision is None:   # auto
        product_ms = measure_precisions(pair.target.config, rows, args.repeats)
        precision = Precision(choose_precision(product_ms, rows))
        print(f"products of one forward, ms (1 row / {max(rows)} rows): "
              + ", ".join(f"{p} {t[1]:.1f} / {t[max(rows)]:.1f}" for p, t in product_ms.items())
              + f" -> {precision}", file=sys.stderr)
    if precision != pair.precision:
        pair = cast_pair(pair, precision)
    methods = usable_methods(("dflash", "domino", "dspark", "dflash2", "ddtree", "condstatic",
                              "dominotree", "dsparktree", "dflash2tree"),
                             pair.drafter_config)
    print(f"calibrating {target_name} + {drafter_name} on {jax.default_backend()} "
          f"({jax.devices()[0]}); rows {rows}, methods {methods}", file=sys.stderr)
    tables = tuple(calibrate_batch(pair, b, rows, methods, context=args.context,
                                   rounds=args.rounds, repeats=args.repeats,
                                   log=lambda s: print(s, file=sys.stderr))
                   for b in sorted(set(args.batches)))
    for t in tables:
        print(t.to_json())
    if not args.dry_run:
        info = {"target": target_name, "drafter": drafter_name, "context": args.context,
                "precision": str(precision), "product_ms": product_ms,
                "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        path = costs.save_costs(pair.target.config, pair.drafter_config, tables,
                                path=args.out, info=info, precision=precision)
        print(f"wrote {path}", file=sys.stderr)
    return tables


if __name__ == "__main__":
    main()
