"""Slot-refill answer generation (``train/slots.py``) on a tiny random target: the plain path's
greedy answers, an exact cap, full refilled calls, reproducible sampling, the loop stop, clear
errors (``collect --refill`` itself runs in ``test_segmented_generation.py``)."""

from __future__ import annotations

import functools
import json
import os

import pytest

import dominotree_jax as dj
from dominotree_jax.train import loops, slots
from dominotree_jax.train.collect import collect
from dominotree_jax.train.generate import generate_answers
from dominotree_jax.train.segmented import generate_answers_segmented
from dominotree_jax.train.shards import ShardStore
from test_data_pipeline import TCFG, _CharTokenizer, target  # noqa: F401 (fixture)
from test_segmented_generation import QUIET, _answers, _prompts, eos_target  # noqa: F401


def _slot_run(tgt, store, prompts, **kw):
    """``generate_answers_segmented`` with a ``SlotAnswerer`` pool."""
    return generate_answers_segmented(
        tgt, store, prompts, answerer=functools.partial(slots.SlotAnswerer, max_prompt=64),
        **kw, **QUIET)


def test_slot_greedy_equals_plain_and_refills(tmp_path, eos_target):  # noqa: F811
    prompts = _prompts(14)
    plain = ShardStore(str(tmp_path / "plain"), vocab_size=TCFG.vocab_size)
    generate_answers(eos_target, plain, prompts, batch=4, max_new=10, seed=0, **QUIET)
    ref = _answers(plain)
    lengths = [len(a) for a in ref.values()]
    assert min(lengths) < 10 and max(lengths) == 10, lengths       # rows finish unevenly
    store = ShardStore(str(tmp_path / "slots"), vocab_size=TCFG.vocab_size)
    s = _slot_run(eos_target, store, prompts, batch=4, max_new=10, seed=0, segment=3)
    assert _answers(store) == ref
    assert s["rows"] == 14 and s["full_calls"] >= 3
    # refilled: some call admitted fresh rows beside continuing ones
    assert any(0 < fresh < rows for rows, fresh in s["call_log"])
    man = json.load(open(os.path.join(str(tmp_path / "slots"), "manifest.json")))
    assert all(e["generator"] == slots.SlotAnswerer.GENERATOR for e in man["shards"])


def test_slot_batch_above_one_insert_call(tmp_path, target):  # noqa: F811
    # 70 slots: the first call inserts its new rows in two prefills (64, then 6 of 16).
    prompts = _prompts(70, seed=9)
    plain = ShardStore(str(tmp_path / "plain"), vocab_size=TCFG.vocab_size)
    generate_answers(target, plain, prompts, batch=70, max_new=3, seed=0, **QUIET)
    store = ShardStore(str(tmp_path / "slots"), vocab_size=TCFG.vocab_size)
    s = _slot_run(target, store, prompts, batch=70, max_new=3, seed=0, segment=2)
    assert s["rows"] == 70 and _answers(store) == _answers(plain)


def test_slot_cap_is_exact_and_sampling_reproducible(tmp_path, target):  # noqa: F811
    prompts = _prompts(7, seed=2)
    store = ShardStore(str(tmp_path / "cap"), vocab_size=TCFG.vocab_size)
    _slot_run(target, store, prompts, batch=3, max_new=12, seed=0, segment=5)   # no stop id
    assert sorted(len(a) for a in _answers(store).values()) == [12] * 7
    plain = ShardStore(str(tmp_path / "plain"), vocab_size=TCFG.vocab_size)
    generate_answers(target, plain, prompts, batch=3, max_new=12, seed=0, **QUIET)
    assert _answers(store) == _answers(plain)
    runs = []
    for name in ("a", "b"):
        st = ShardStore(str(tmp_path / name), vocab_size=TCFG.vocab_size)
        _slot_run(target, st, prompts, batch=3, max_new=12, seed=4, segment=5,
                  temperature=0.7)
        runs.append(_answers(st))
    assert runs[0] == runs[1] and runs[0] != _answers(store)


def test_loop_end():
    assert loops.loop_end([7, 1, 2, 1, 2, 1, 2, 9], window=2, repeats=3) == 7
    assert loops.loop_end([7, 1, 2, 1, 2, 1, 2, 9], window=2, repeats=4) is None
    assert loops.loop_end([5, 5, 5], window=1, repeats=3) == 3
    assert loops.loop_end([1, 2, 3], window=4, repeats=2) is None


def test_slot_loop_stop_keeps_the_onset_of_a_loop(tmp_path, target):  # noqa: F811
    prompts = _prompts(8, seed=6)
    plain = ShardStore(str(tmp_path / "plain"), vocab_size=TCFG.vocab_size)
    generate_answers(target, plain, prompts, batch=4, max_new=24, seed=0, **QUIET)
    ref = _answers(plain)                                 # no stop id: all run to the cap
    store = ShardStore(str(tmp_path / "loop"), vocab_size=TCFG.vocab_size)
    generate_answers_segmented(
        target, store, prompts, batch=4, max_new=24, seed=0, segment=5, **QUIET,
        answerer=functools.partial(slots.SlotAnswerer, max_prompt=64, loop_window=2,
                                   loop_repeats=3))
    got = _answers(store)
    stopped = 0
    for k, answer in got.items():
        end = loops.loop_end(ref[k], 2, 3)
        want = ref[k][:end] if end is not None else ref[k]   # cut right after the 3rd window
        assert answer == want
        stopped += end is not None
    assert stopped > 0
    man = json.load(open(os.path.join(str(tmp_path / "loop"), "manifest.json")))
    assert sum(e["loop_stopped_rows"] for e in man["shards"]) == stopped
    assert all(e["loop_stop"] == [2, 3] for e in man["shards"])
    with pytest.raises(ValueError, match="repeats >= 2"):
        slots.SlotAnswerer(target, store, batch=2, max_new=4, segment=2, seed=0,
                           max_prompt=60, loop_window=2, loop_repeats=1)


def test_slot_errors_name_the_problem(tmp_path, target):  # noqa: F811
    store = ShardStore(str(tmp_path / "e"), vocab_size=TCFG.vocab_size)
    gen = slots.SlotAnswerer(target, store, batch=2, max_new=4, segment=2, seed=0,
                             max_prompt=60)
    with pytest.raises(ValueError, match="exceeds the slots' prompt width 64"):
        gen.admit([([5] * 70, "long")])
    with pytest.raises(ValueError, match="positions"):
        slots.SlotAnswerer(target, store, batch=2, max_new=TCFG.max_position_embeddings,
                           segment=2, seed=0, max_prompt=60)


def test_collect_refill_options_are_checked(tmp_path, target):  # noqa: F811
    t = dj.Target(TCFG, target.params, _CharTokenizer())
    kw = dict(seed=0, num_prompts=60, batch=4, max_new=8, deadline=None, request_every=0,
              request_share=0.0, prompt_mix="v4", max_batches=1)
    with pytest.raises(ValueError, match="--segment or --refill"):
        collect(t, str(tmp_path / "a"), segment=3, refill=3, **kw)
    with pytest.raises(ValueError, match="--loop-stop needs --refill"):
        collect(t, str(tmp_path / "b"), loop_stop=4, **kw)
