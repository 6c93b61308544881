"""One pair measured: random weights, then every method's whole round timed side by side with
the AR step, then (``--stages all``) its stages; each method isolated, the report written after
each."""

from __future__ import annotations

import collections
import dataclasses
import functools
import time

import jax
import jax.numpy as jnp

from dominotree_jax.decoding.config import TREE_METHODS, DecodeConfig
from dominotree_jax.measure.timing import interleaved_medians
from dominotree_jax.model.target import target_graphdef

from benchmarks.gpu.configs import BUDGET, PairSpec
from benchmarks.gpu.control import Deadline, calling, error_line, run_isolated
from benchmarks.gpu.rounds import (
    accept_commit_stage, build_stage, decode_configs, draft_stage, round_buffers, round_stage,
    shared_config, verify_stage,
)
from benchmarks.gpu.weights import num_params, pair_params

@dataclasses.dataclass
class PairRun:
    """Everything the per-method measurements of one pair share."""
    spec: PairSpec
    params: dict
    configs: dict          # method -> DecodeConfig ("ar" included)
    context: int
    max_new_tokens: int
    repeats: int
    inner: int
    t0_B: jax.Array
    start_B: jax.Array
    n_B: jax.Array
    ar: object = None      # the compiled AR step, a zero-argument callable
    ar_error: BaseException | None = None  # why the AR step did not compile (not retried)

    def fresh(self) -> dict:
        return round_buffers(self.spec, self.configs, context=self.context,
                             max_new_tokens=self.max_new_tokens,
                             dtype=jax.tree.leaves(self.params["target"])[0].dtype)


def prepare_pair(spec: PairSpec, *, context: int, max_new_tokens: int, repeats: int, inner: int,
                 use_pallas, log=print) -> PairRun:
    """Random bf16 weights on the device and the decode configs of ``spec``."""
    t = time.perf_counter()
    params = pair_params(spec)
    log(f"{spec.name}: {num_params(params['target']) / 1e6:.1f} M target + "
        f"{num_params(params['drafter']) / 1e6:.1f} M drafter parameters "
        f"({time.perf_counter() - t:.1f} s)")
    configs = decode_configs(spec, max_new_tokens=max_new_tokens, use_pallas=use_pallas)
    return PairRun(spec, params, configs, context, max_new_tokens, repeats, inner,
                   t0_B=jnp.full((1,), 7, jnp.int32), start_B=jnp.full((1,), context, jnp.int32),
                   n_B=jnp.ones((1,), jnp.int32))


def _round_caller(run: PairRun, config: DecodeConfig, program=None):
    """A zero-argument call of ``config``'s whole round on its own donated buffers: the jitted
    ``round_stage``, or ``program``, that round already compiled (``compiled_round``)."""
    state = run.fresh()
    if config.method == "ar":
        state["ctx"] = None
    fn = functools.partial(round_stage, config=config) if program is None else program

    def call():
        state["cache"], state["ctx"], state["out"], tau = fn(
            run.params, state["cache"], state["ctx"], state["out"], run.t0_B, run.start_B,
            run.n_B)
        return tau

    return call


def compiled_round(run: PairRun, config: DecodeConfig):
    """``(hlo_text, call)``: ``config``'s round compiled once, its text (to read its
    instructions) and a zero-argument call of that same program on its own donated buffers (the
    profiles: their events name this program's instructions)."""
    bufs = jax.eval_shape(run.fresh)
    ctx = None if config.method == "ar" else bufs["ctx"]
    program = round_stage.lower(run.params, bufs["cache"], ctx, bufs["out"], run.t0_B,
                                run.start_B, run.n_B, config=config).compile()
    return program.as_text(), _round_caller(run, config, program)


def compiled_rounds() -> int | None:
    """Programs ``round_stage`` has compiled so far (None where jax does not say)."""
    size = getattr(round_stage, "_cache_size", None)
    return size() if callable(size) else None


def ar_step(run: PairRun):
    """The pair's AR step, compiled on first use (a failure is raised again, not retried)."""
    if run.ar_error is not None:
        raise RuntimeError(f"the AR step failed: {error_line(run.ar_error)}") from run.ar_error
    if run.ar is None:
        try:
            call = _round_caller(run, run.configs["ar"])
            jax.block_until_ready(call())
        except Exception as err:
            run.ar_error = err
            raise
        run.ar = call
    return run.ar


def measure_round(run: PairRun, method: str) -> dict:
    """The method's whole round (one jitted function) timed side by side with the AR step;
    ``round_programs``: round programs compiled while measuring it: 1 (or 0 where this process
    already had it); more means a round recompiles, which is recorded as a failure."""
    config = run.configs[method]
    ar = ar_step(run)
    before = compiled_rounds()
    t = time.perf_counter()
    call = _round_caller(run, config)
    jax.block_until_ready(call())
    compile_s = time.perf_counter() - t
    jax.block_until_ready(call())  # a second call (new start values) must not recompile
    programs = None if before is None else compiled_rounds() - before
    med = interleaved_medians({"ar": ar, "round": call}, run.repeats, run.inner)
    return dict(ar_ms=med["ar"], round_ms=med["round"], compile_s=compile_s,
                round_programs=programs, verify_rows=config.num_draft_nodes + 1)


def measure_stages(run: PairRun, method: str) -> dict:
    """Draft, build, verify and accept/commit of one method, timed with its round and the AR
    step side by side."""
    config, params = run.configs[method], run.params
    t0_B, start_B, n_B = run.t0_B, run.start_B, run.n_B
    ctx0 = run.fresh()["ctx"]
    # stage-level programs depend only on what shapes them: share them across methods
    plain = shared_config(config, method="dflash", budget=BUDGET)
    z, base = draft_stage(params, ctx0, t0_B, start_B, config=plain)
    draft = build_stage(params, z, base, t0_B, config=config)
    shape_cfg = shared_config(config, method="ddtree" if method in TREE_METHODS else "dflash")
    logits, taps, kv = verify_stage(params, run.fresh()["cache"], t0_B, start_B, draft,
                                    config=shape_cfg)
    verify_state, commit_state = run.fresh(), run.fresh()

    def run_verify():
        return verify_stage(params, verify_state["cache"], t0_B, start_B, draft,
                            config=shape_cfg)

    def run_accept_commit(state=commit_state):
        state["cache"], state["ctx"], state["out"], tau = accept_commit_stage(
            params, state["cache"], state["ctx"], state["out"], logits, taps, kv, draft,
            t0_B, start_B, n_B, config=shape_cfg)
        return tau

    fns = {"ar": ar_step(run), "round": _round_caller(run, config),
           "draft": calling(draft_stage, params, ctx0, t0_B, start_B, config=plain),
           "build": calling(build_stage, params, z, base, t0_B, config=config),
           "verify": run_verify, "accept_commit": run_accept_commit}
    med = interleaved_medians(fns, run.repeats, run.inner)
    return {f"{name}_ms": ms for name, ms in med.items()}


def ar_bytes(spec: PairSpec, context: int, itemsize: int = 2) -> int:
    """Bytes one AR step must read: the target's weights (an untied input embedding only by
    its one row) and the K/V of ``context`` committed slots in every layer."""
    t = spec.target
    weights = num_params(target_graphdef(t, "float32")[1])
    if not t.tie_word_embeddings:
        weights -= (t.vocab_size - 1) * t.hidden_size
    kv = 2 * t.num_hidden_layers * t.num_key_value_heads * t.head_dim * context
    return (weights + kv) * itemsize


def pair_entry(spec: PairSpec, run_settings: dict) -> dict:
    return dict(title=spec.name, published=spec.published, methods={m: {} for m in spec.methods},
                **run_settings)


def measure_pair(spec: PairSpec, entry: dict, *, deadline: Deadline, stages: str, context: int,
                 max_new_tokens: int, repeats: int, inner: int, use_pallas, write, log) -> dict:
    """Every method of ``spec``, each isolated, the report written after each: first all
    rounds (the headline), then all stages. Returns the count of each outcome."""
    outcomes = collections.Counter()
    holder = {}

    def prepare():
        holder["run"] = prepare_pair(spec, context=context, max_new_tokens=max_new_tokens,
                                     repeats=repeats, inner=inner, use_pallas=use_pallas, log=log)
        return {"target_params": num_params(holder["run"].params["target"]),
                "drafter_params": num_params(holder["run"].params["drafter"])}

    outcome = run_isolated(entry, "setup", prepare, deadline, log, f"{spec.name} weights")
    outcomes[outcome] += 1
    if outcome != "ok":
        for m in spec.methods:
            outcomes[run_isolated(entry["methods"][m], "round", _not_run(outcome), deadline,
                                  log, f"{spec.name} {m}")] += 1
        write()
        return outcomes
    run = holder["run"]
    entry["cache_slots"] = run.fresh()["cache"].max_len
    write()
    parts = [("round", measure_round)] + ([("stages", measure_stages)] if stages == "all" else [])
    for part, measure in parts:
        for m in spec.methods:
            if part == "stages" and "error" in (entry["methods"][m].get("round") or {}):
                entry["methods"][m][part] = {"skipped": "the round failed"}
                continue  # its stages would compile the same failing pieces again
            outcome = run_isolated(entry["methods"][m], part, functools.partial(measure, run, m),
                                   deadline, log, f"{spec.name} {m} {part}")
            programs = entry["methods"][m][part].get("round_programs")
            if outcome == "ok" and programs not in (None, 0, 1):  # a round that recompiles
                log(f"  {spec.name} {m}: {programs} round programs compiled, not 1")
                outcome = "error"
            outcomes[outcome] += 1
            write()
    del holder["run"], run
    return outcomes


def _not_run(reason: str):
    def fail():
        raise RuntimeError(f"not run: the pair's setup {reason}")
    return fail
