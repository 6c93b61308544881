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
    # 70 slots: the first call inserts its new rows in three prefills (64, 4, then 2 of 4).
    prompts = _prompts(70, seed=9)
    plain = ShardStore(str(tmp_path / "plain"), vocab_size=TCFG.vocab_size)
    generate_answers(target, plain, prompts, batch=70, max_new=3, seed=0, **QUIET)
    store = ShardStore(str(tmp_path / "slots"), vocab_size=TCFG.vocab_size)
    s = _slot_run(target, store, prompts, batch=70, max_new=3, seed=0, segment=2)
    assert s["rows"] == 70 and _answers(store) == _answers(plain)


@pytest.mark.parametrize("n", [1, 3, 5, 13, 24, 40, 64, 70, 150])
def test_insert_pieces_cover_rows_longest_first_with_little_padding(n):
    lengths = [(i * 37) % 101 + 1 for i in range(n)]
    pieces = slots.insert_pieces(lengths)
    assert sorted(i for p in pieces for i in p) == list(range(n))        # each row once
    flat = [lengths[i] for p in pieces for i in p]
    assert flat == sorted(lengths, reverse=True)                         # longest first
    padded = sum(slots.piece_rows(len(p)) for p in pieces) - n
    assert 0 <= padded < min(slots.INSERT_ROWS)
    assert all(len(p) <= max(slots.INSERT_ROWS) for p in pieces)
    # one program when it pads fewer than the smallest size: 13 rows -> one of 16, not 4 x 4
    assert len(pieces) == 1 or n > 64 or slots.piece_rows(n) - n >= min(slots.INSERT_ROWS)


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


def test_slot_widths_cover_each_group():
    need = [700, 400, 390, 300, 260, 130, 129, 0]
    assert slots.slot_widths(need, 4, 768) == (768, 512, 384, 256)
    assert slots.slot_widths(need, 2, 768) == (768, 384)
    assert slots.slot_widths(need, 1, 640) == (640,)     # capped at the cache length
    assert slots.slot_widths([0, 0], 2, 768) == (128, 128)


def test_grouped_steps_equal_whole_cache_steps(target):  # noqa: F811
    # 8 slots at scattered positions, sorted longest first, in 4 groups reading 384/256/128/128
    # slots: the same tokens as steps over the whole cache; a width one step too short is not.
    import jax
    import jax.numpy as jnp
    import numpy as np
    cfg = target.config
    rng = np.random.default_rng(0)
    pos = np.array([300, 250, 200, 130, 120, 60, 10, 3], np.int32)
    state = slots.empty_slots(cfg, 8, 512, jnp.float32)
    cache = jax.tree.map(lambda a: jnp.asarray(rng.normal(size=a.shape), a.dtype), state.cache)
    state = slots.SlotState(cache, jnp.asarray(pos), jnp.asarray(rng.integers(0, 96, 8), jnp.int32))
    need = (pos + 6).tolist()
    widths = slots.slot_widths(need, 4, 512)
    assert widths == (384, 256, 128, 128)
    run = functools.partial(slots.step_slots, target.params, key=jax.random.key(0), cfg=cfg,
                            steps=6, temperature=0.0)
    copy = functools.partial(jax.tree.map, jnp.copy)
    _, whole = run(copy(state))
    _, grouped = run(copy(state), widths=widths)
    np.testing.assert_array_equal(np.asarray(grouped), np.asarray(whole))
    # slot 7 moved to position 70: a last group reading 64 slots cuts its prefix
    moved = slots.SlotState(state.cache, state.pos_B.at[7].set(70), state.last_B)
    _, cut = run(copy(moved), widths=(384, 256, 128, 64))
    _, ref = run(copy(moved))
    assert not np.array_equal(np.asarray(cut)[7], np.asarray(ref)[7])


def test_move_slots_moves_rows_in_cycles_and_drops_padding():
    import jax.numpy as jnp
    import numpy as np
    state = slots.empty_slots(TCFG, 4, 8, jnp.float32)
    k0 = state.cache.k[0].at[:, 0, 0, 0].set(jnp.arange(4.0))
    state = slots.SlotState(state.cache._replace(k=(k0,) + state.cache.k[1:]),
                            jnp.arange(4, dtype=jnp.int32), 10 + jnp.arange(4, dtype=jnp.int32))
    # a 3-cycle 0 <- 2 <- 1 <- 0, slot 3 stays, one padding move (dst 4: dropped)
    out = slots.move_slots(state, jnp.asarray([2, 0, 1, 3], jnp.int32),
                           jnp.asarray([0, 1, 2, 4], jnp.int32))
    np.testing.assert_array_equal(np.asarray(out.cache.k[0][:, 0, 0, 0]), [2, 0, 1, 3])
    np.testing.assert_array_equal(np.asarray(out.pos_B), [2, 0, 1, 3])
    np.testing.assert_array_equal(np.asarray(out.last_B), [12, 10, 11, 13])


def test_regroup_moves_only_rows_that_outgrew_their_group():
    # 4 groups of 2 slots, widths in steps of 128
    need = [140, 600, 0, 300, 100, 90, 0, 500]
    order = slots.regroup(need, 4, 768)
    assert sorted(order) == list(range(8))
    placed = [need[order[i]] for i in range(8)]
    ranked = slots.slot_widths(sorted(need, reverse=True), 4, 768)
    assert ranked == (640, 384, 128, 128)
    assert slots.slot_widths(placed, 4, 768) == ranked       # as narrow as a full sort
    moved = [i for i in range(8) if order[i] != i and need[order[i]] > 0]
    assert len(moved) < 6, (order, placed)                    # a full sort moves 6 rows here
    # every row already fitting its group stays: nothing to do
    assert slots.regroup(sorted(need, reverse=True), 4, 768) == list(range(8))


@pytest.mark.parametrize("seed", range(20))
def test_regroup_random_layouts_fit_ranked_widths(seed):
    import random
    rng = random.Random(seed)
    need = [rng.choice([0, rng.randint(1, 800)]) for _ in range(16)]
    order = slots.regroup(need, 4, 800)
    assert sorted(order) == list(range(16))
    placed = [need[order[i]] for i in range(16)]
    assert slots.slot_widths(placed, 4, 800) == slots.slot_widths(
        sorted(need, reverse=True), 4, 800)
