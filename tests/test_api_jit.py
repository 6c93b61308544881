"""``decode`` as users call it: directly (checked, then one compiled program per
``DecodeConfig.program``) and inside their own ``jax.jit`` (the same refusals, value checks in
the program); temperature, top-k and top-p are runtime values of one program."""

from __future__ import annotations

import contextlib
import re

import jax
import numpy as np
import pytest

from decode_helpers import FAST_XLA, count_host_callbacks
from dominotree_jax import DecodeConfig, decode
from dominotree_jax.decoding.decode import check_inputs
from dominotree_jax.sampling import Sampling
from spec_fixtures import tiny_pair

MAX_NEW = 6


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


def _config(tcfg, **kw):
    return DecodeConfig(target=tcfg, method="ar", max_new_tokens=MAX_NEW, **kw)


def _jitted(**jit_kw):
    """``decode`` under the caller's own jit (config static), as the README once showed it."""
    def run(params, prompt, key=None, lengths=None, stops=None, rows=None, *, config):
        return decode(params, prompt, config=config, key=key, prompt_lengths=lengths,
                      row_stop_ids=stops, prompt_rows=rows)
    return jax.jit(run, static_argnames="config", compiler_options=FAST_XLA, **jit_kw)


@contextlib.contextmanager
def count_lowerings():
    """Counts programs lowered (one per compiled program, read back from the persistent cache
    or not) while the block runs."""
    seen = []

    def listener(event, duration, **kw):
        if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
            seen.append(event)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


BAD_VALUES = [   # (what, arguments of _jitted's run, error text)
    ("out-of-vocabulary id", dict(prompt=[[3, 64, 5, 1]]),
     "token ids outside the vocabulary [0, 64): [64]"),
    ("negative id", dict(prompt=[[3, 4, -2, 1]]),
     "token ids outside the vocabulary [0, 64): [-2]"),
    ("length beyond the prompt", dict(prompt=[[3, 4, 5, 1]], lengths=[5]),
     "prompt_lengths must be in [1, 4], got [5]"),
    ("row stop id", dict(prompt=[[3, 4, 5, 1]], stops=[[70, -1]]),
     "row_stop_ids outside the vocabulary (or -1): [70]"),
    ("prompt row", dict(prompt=[[3, 4, 5, 1]], rows=[0, 1]),
     "prompt_rows must index the 1 prompts, got values in [0, 1]"),
]


@pytest.mark.parametrize("what,args,text", BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_jitted_decode_refuses_bad_values_with_the_eager_error(pair, what, args, text):
    """The target: jitted ``decode`` refuses an out-of-vocabulary prompt (and every other bad
    value) with the same error text as the direct call, before returning any output."""
    tcfg, _, params = pair
    cfg = _config(tcfg)
    arrays = {k: np.asarray(v, np.int32) for k, v in args.items()}
    with pytest.raises(ValueError, match=re.escape(text)) as eager:
        decode(params, arrays["prompt"], config=cfg, prompt_lengths=arrays.get("lengths"),
               row_stop_ids=arrays.get("stops"), prompt_rows=arrays.get("rows"))
    assert str(eager.value) == text
    with pytest.raises(Exception, match=re.escape(text)) as jitted:
        out = _jitted()(params, **arrays, config=cfg)
        jax.block_until_ready(out)
    assert str(eager.value) in str(jitted.value)


@pytest.mark.parametrize("what,args,text", BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_check_inputs_refuses_what_decode_refuses(pair, what, args, text):
    """``check_inputs``: the host check to run before ``decode(..., value_checks=False)``."""
    tcfg, _, _ = pair
    arrays = {k: np.asarray(v, np.int32) for k, v in args.items()}
    with pytest.raises(ValueError) as refused:
        check_inputs(arrays["prompt"], config=_config(tcfg),
                     prompt_lengths=arrays.get("lengths"), row_stop_ids=arrays.get("stops"),
                     prompt_rows=arrays.get("rows"))
    assert str(refused.value) == text


def test_value_checks_false_leaves_the_host_callback_out(pair, monkeypatch):
    """The in-program value check is a host callback (jax never writes a program that has one
    to its persistent compilation cache); ``value_checks=False`` traces none, and decodes the
    same tokens."""
    tcfg, _, params = pair
    cfg = _config(tcfg)
    prompt = np.array([[3, 4, 5, 1]], np.int32)

    def run(params, prompt, *, config, value_checks):
        return decode(params, prompt, config=config, value_checks=value_checks)

    jitted = jax.jit(run, static_argnames=("config", "value_checks"), compiler_options=FAST_XLA)
    with count_host_callbacks(monkeypatch) as made:
        checked = jitted(params, prompt, config=cfg, value_checks=True)
    assert len(made) == 1
    with count_host_callbacks(monkeypatch) as made:
        unchecked = jitted(params, prompt, config=cfg, value_checks=False)
    assert made == []
    np.testing.assert_array_equal(np.asarray(checked.tokens), np.asarray(unchecked.tokens))


def test_jitted_decode_runs_good_values_as_the_direct_call(pair):
    tcfg, _, params = pair
    cfg = _config(tcfg, temperature=0.8, top_k=9)
    prompt, key = np.array([[3, 4, 5, 1], [7, 8, 0, 0]], np.int32), jax.random.key(4)
    lengths = np.array([4, 2], np.int32)
    direct = decode(params, prompt, config=cfg, key=key, prompt_lengths=lengths)
    jitted = _jitted()(params, prompt, key, lengths, config=cfg)
    np.testing.assert_array_equal(np.asarray(direct.tokens), np.asarray(jitted.tokens))


@pytest.mark.parametrize("what,kw,text", [
    ("float prompt", dict(prompt=np.array([1.0, 2.0])), "integer token ids"),
    ("3-d prompt", dict(prompt=np.ones((1, 2, 3), np.int32)), "must be [T] or [B, T]"),
    ("empty prompt", dict(prompt=np.zeros((1, 0), np.int32)), "empty prompt"),
    ("lengths shape", dict(prompt=np.ones((2, 3), np.int32), lengths=np.array([3, 3, 3])),
     "prompt_lengths must be an integer [B=2]"),
    ("float lengths", dict(prompt=np.ones((1, 3), np.int32), lengths=np.array([2.0])),
     "prompt_lengths must be an integer"),
    ("stops shape", dict(prompt=np.ones((2, 3), np.int32), stops=np.ones((3, 2), np.int32)),
     "row_stop_ids must be an integer [B=2, e]"),
])
def test_shapes_and_dtypes_are_refused_under_jit_too(pair, what, kw, text):
    """Shape and dtype checks need no values: the same ``ValueError`` at trace time."""
    tcfg, _, params = pair
    cfg = _config(tcfg)
    with pytest.raises(ValueError, match=re.escape(text)):
        decode(params, kw["prompt"], config=cfg, prompt_lengths=kw.get("lengths"),
               row_stop_ids=kw.get("stops"))
    with pytest.raises(ValueError, match=re.escape(text)):
        _jitted()(params, kw["prompt"], None, kw.get("lengths"), kw.get("stops"), config=cfg)


def test_a_sampled_config_without_a_key_is_refused_under_jit_too(pair):
    tcfg, _, params = pair
    with pytest.raises(ValueError, match="explicit PRNG key"):
        _jitted()(params, np.array([1, 2], np.int32), config=_config(tcfg, temperature=0.5))


def test_two_temperatures_run_one_compiled_program(pair):
    """The target: ``decode`` called directly compiles once per ``config.program``; other
    temperatures, top-k and top-p run that program (greediness alone is static)."""
    tcfg, _, params = pair
    prompt, key = np.array([5, 9, 2], np.int32), jax.random.key(0)
    cfg = _config(tcfg, temperature=0.7)
    decode(params, prompt, config=cfg, key=key).tokens.block_until_ready()   # compiled here
    outs = []
    with count_lowerings() as lowered:
        for kw in (dict(temperature=1.3), dict(temperature=0.2, top_k=5),
                   dict(temperature=2.0, top_p=0.6)):
            outs.append(decode(params, prompt, config=_config(tcfg, **kw), key=key))
            outs[-1].tokens.block_until_ready()
    assert lowered == []
    with count_lowerings() as lowered:   # the counter counts: greedy is another program
        decode(params, prompt, config=_config(tcfg), key=key).tokens.block_until_ready()
    assert len(lowered) >= 1
    # and each runtime setting is really used: the same as a program compiled for it alone
    for out, kw in zip(outs, (dict(temperature=1.3), dict(temperature=0.2, top_k=5),
                              dict(temperature=2.0, top_p=0.6))):
        alone = _jitted()(params, prompt, key, config=_config(tcfg, **kw))
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(alone.tokens))


def test_config_program_drops_the_sampling_values_but_not_greediness(pair):
    tcfg, _, _ = pair
    hot, cold = _config(tcfg, temperature=1.7, top_k=3), _config(tcfg, temperature=0.3)
    assert hot.program == cold.program and hash(hot.program) == hash(cold.program)
    assert _config(tcfg).program != hot.program and _config(tcfg).sampling is None
    np.testing.assert_allclose(hot.sampling.temperature, 1.7)
    assert int(hot.sampling.top_k) == 3


def test_traced_sampling_values_in_your_own_jit(pair):
    """``decode(..., sampling=Sampling(...))`` with traced values: one program of the caller's
    serves every temperature, the same tokens as each config's own; bad values are refused
    in the program with the eager text."""
    tcfg, _, params = pair
    prompt, key = np.array([5, 9, 2, 11], np.int32), jax.random.key(2)
    cfg = _config(tcfg, temperature=1.0)
    traces = []

    def run(params, temperature, top_p):
        traces.append(1)
        return decode(params, prompt, config=cfg, key=key,
                      sampling=Sampling.of(temperature, 0, top_p)).tokens

    f = jax.jit(run, compiler_options=FAST_XLA)
    for t, p in ((0.4, 1.0), (1.6, 0.7)):
        want = decode(params, prompt, config=_config(tcfg, temperature=t, top_p=p), key=key)
        np.testing.assert_array_equal(np.asarray(f(params, t, p)), np.asarray(want.tokens))
    assert len(traces) == 1
    with pytest.raises(Exception, match=re.escape("top_p must be in (0, 1], got 1.5")):
        jax.block_until_ready(f(params, 0.5, 1.5))
    with pytest.raises(Exception, match="temperature must be > 0 to sample"):
        jax.block_until_ready(f(params, 0.0, 1.0))
    with pytest.raises(ValueError, match="need a sampled config"):
        decode(params, prompt, config=_config(tcfg), sampling=Sampling.of(0.5))


@pytest.mark.parametrize("source,method", [("lookup", "dominotree"), ("dominotree", "lookup"),
                                           ("lookup", "ar"), ("ddtree", "dflash")])
def test_replace_to_another_method_builds_that_method_afresh(pair, source, method):
    """The fields stay as given (defaults are resolved in properties), so ``replace()``
    carries nothing resolved for the old method into the new one."""
    tcfg, dcfg, _ = pair
    common = dict(target=tcfg, drafter=dcfg, max_new_tokens=8, budget=6, node_topk=3,
                  top_m=16, draft_window=12)
    fresh = DecodeConfig(**common, method=method)
    replaced = DecodeConfig(**common, method=source).replace(method=method)
    assert replaced == fresh and hash(replaced) == hash(fresh)
    assert (replaced.lookup_paths, replaced.lookup_path_length, replaced.draft_depth) == \
        (fresh.lookup_paths, fresh.lookup_path_length, fresh.draft_depth)
    unwindowed = replaced.replace(draft_window=None)
    assert unwindowed == DecodeConfig(**{**common, "draft_window": None}, method=method)
    assert unwindowed.drafter.draft_window is None


def test_lookup_defaults_resolve_per_method_and_share_one_program(pair):
    tcfg, dcfg, _ = pair
    bare = DecodeConfig(target=tcfg, method="lookup")
    assert (bare.lookup, bare.lookup_length) == (0, None)   # as given
    assert (bare.lookup_paths, bare.lookup_path_length) == (4, 16)
    beside = DecodeConfig(target=tcfg, drafter=dcfg, method="dominotree", lookup=2)
    assert beside.lookup_path_length == 8
    assert bare.program == DecodeConfig(target=tcfg, method="lookup", lookup=4,
                                        lookup_length=16).program


def test_the_rollout_programs_serve_every_temperature_with_one_compilation(pair):
    """The engine's decode and log-prob programs: temperature (and top-k / top-p) are
    arguments; a new temperature runs the programs already compiled."""
    from dominotree_jax.rollout.engine_batches import PromptBatch
    from dominotree_jax.rollout.engine_programs import RolloutPrograms
    from dominotree_jax.rollout.placement import BatchPlacement

    tcfg, _, params = pair
    programs = RolloutPrograms(tcfg, "drop", FAST_XLA)
    prompt_BT = np.array([[5, 9, 2, 0], [7, 1, 3, 8]], np.int32)
    batch = PromptBatch(prompt_BT, np.array([3, 4], np.int32), prompt_BT)
    place, target = BatchPlacement(None), {"target": params["target"], "drafter": None}
    outs = [programs.decode(target, batch, jax.random.key(1), None, None,
                            _config(tcfg, temperature=t, top_k=k), place, False)[0]
            for t, k in ((0.6, 0), (1.4, 7))]
    assert len(programs.traces) == 1 and programs.traces[0].temperature == 0.6
    want = _jitted()(target, prompt_BT, jax.random.key(1), batch.lengths_B,
                     config=_config(tcfg, temperature=1.4, top_k=7))
    np.testing.assert_array_equal(np.asarray(outs[1].tokens), np.asarray(want.tokens))
    completion = np.asarray(outs[0].tokens).clip(0)
    logps = [programs.per_token_logps(params["target"], prompt_BT, completion, 0, t)
             for t in (0.0, 0.6, 1.0)]
    assert len(programs.logp_traces) == 1
    np.testing.assert_array_equal(np.asarray(logps[0]), np.asarray(logps[2]))   # 0 reads as 1
    assert not np.allclose(np.asarray(logps[1]), np.asarray(logps[2]))
