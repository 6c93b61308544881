"""Refilling answer generation on a persistent KV cache (``train/data/slots.py``) on a tiny
random target: the plain path's greedy answers, an exact cap, full refilled calls, only
completed rows in shards, resumable after a kill, reproducible sampling, the loop stop,
``collect --refill``, clear errors."""

from __future__ import annotations

import collections
import functools
import json
import os

import numpy as np
import pytest

import dominotree_jax as dj
from dominotree_jax.train.data import generate, loops, slots
from dominotree_jax.train.data.collect import collect
from dominotree_jax.train.data.generate import generate_answers
from dominotree_jax.train.data.shards import ShardStore
from test_collect import toy_pool
from test_data_pipeline import TCFG, _CharTokenizer, target  # noqa: F401 (fixture)

QUIET = dict(log=lambda m: None)


class _EosTokenizer(_CharTokenizer):
    def __init__(self, eos: int):
        self.eos_token_id = eos


def _prompts(n: int, seed: int = 0, lo: int = 3, hi: int = 20):
    rng = np.random.default_rng(seed)
    return [(rng.integers(3, 90, size=int(rng.integers(lo, hi))).tolist(), f"s{i % 3}")
            for i in range(n)]


def _answers(store: ShardStore) -> dict:
    return {(tuple(t[:p].tolist()), src): t[p:].tolist() for t, p, src in store.rows("answers")}


@pytest.fixture(scope="module")
def eos_target(target):  # noqa: F811
    """The tiny target with a stop id that its greedy answers hit at various depths: the token
    most often generated at answer positions 1..9 (no stop id), so rows finish unevenly."""
    prompts = _prompts(16, seed=5)
    toks, num = generate.run_decode(target, [p for p, _ in prompts], width=64, batch=16,
                                    max_new=10, stop_ids=())
    eos = collections.Counter(toks[:, 1:9].ravel().tolist()).most_common(1)[0][0]
    return dj.Target(TCFG, target.params, _EosTokenizer(int(eos)))


def _slot_run(tgt, store, prompts, **kw):
    """``slots.generate_answers_slots`` with prompts up to 64 tokens."""
    return slots.generate_answers_slots(tgt, store, prompts, max_prompt=64, **kw, **QUIET)


def test_slot_greedy_equals_plain_and_refills(tmp_path, eos_target):  # noqa: F811
    prompts = _prompts(14)
    plain = ShardStore(str(tmp_path / "plain"), vocab_size=TCFG.vocab_size)
    generate_answers(eos_target, plain, prompts, batch=4, max_new=10, seed=0, **QUIET)
    ref = _answers(plain)
    lengths = [len(a) for a in ref.values()]
    assert len(ref) == 14 and min(lengths) < 10 and max(lengths) == 10, lengths  # uneven rows
    store = ShardStore(str(tmp_path / "slots"), vocab_size=TCFG.vocab_size)
    s = _slot_run(eos_target, store, prompts, batch=4, max_new=10, seed=0, segment=3)
    assert _answers(store) == ref
    assert s["rows"] == 14 and s["answer_tokens"] == sum(lengths)
    # Refill: calls mix fresh prompts with continuing rows, and every call runs a full batch
    # until the prompts run out (only the last refill and the drain may run fewer rows).
    log = s["call_log"]
    assert any(0 < fresh < rows for rows, fresh in log), log
    last_fresh = max(i for i, (_, fresh) in enumerate(log) if fresh)
    assert all(rows == 4 for rows, _ in log[:last_fresh]), log
    assert s["full_calls"] >= 3
    man = json.load(open(os.path.join(str(tmp_path / "slots"), "manifest.json")))
    assert [e["rows"] for e in man["shards"]] == [4, 4, 4, 2]
    assert all(e["generator"] == slots.SlotAnswerer.GENERATOR for e in man["shards"])
    assert all(e["segment"] == 3 and e["gen_seconds"] >= 0 for e in man["shards"])


def test_slot_kill_leaves_only_complete_rows_and_resumes(tmp_path, eos_target,  # noqa: F811
                                                         monkeypatch):
    prompts = _prompts(12, seed=1)
    plain = ShardStore(str(tmp_path / "plain"), vocab_size=TCFG.vocab_size)
    generate_answers(eos_target, plain, prompts, batch=4, max_new=10, seed=0, **QUIET)
    ref = _answers(plain)

    real, calls = slots.step_slots, []

    def dies_on_fifth_call(*a, **kw):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt("killed")
        return real(*a, **kw)

    monkeypatch.setattr(slots, "step_slots", dies_on_fifth_call)
    data = str(tmp_path / "run")
    with pytest.raises(KeyboardInterrupt):
        _slot_run(eos_target, ShardStore(data, vocab_size=TCFG.vocab_size), prompts, batch=4,
                  max_new=10, seed=0, segment=3)
    monkeypatch.setattr(slots, "step_slots", real)
    killed = _answers(ShardStore(data))
    assert 0 < len(killed) < 12                       # some shard made it, not everything
    assert all(ref[k] == v for k, v in killed.items())  # full answers only, never partial
    s = _slot_run(eos_target, ShardStore(data), prompts, batch=4, max_new=10, seed=0,
                  segment=3)
    assert s["pending"] == 12 - len(killed) and s["rows"] == s["pending"]
    assert _answers(ShardStore(data)) == ref
    assert ShardStore(data).totals()["answers"]["rows"] == 12   # nothing answered twice


def test_slot_max_batches_and_sampling(tmp_path, eos_target):  # noqa: F811
    prompts = _prompts(20, seed=3)
    runs = []
    for name in ("a", "b"):
        store = ShardStore(str(tmp_path / name), vocab_size=TCFG.vocab_size)
        s = _slot_run(eos_target, store, prompts, batch=4, max_new=9, seed=7, segment=4,
                      temperature=0.7, max_batches=2)
        assert s["batches"] == 2 and s["rows"] == 8
        runs.append(_answers(store))
    assert runs[0] == runs[1]                           # keys from the seed and call number
    assert all(len(a) <= 9 for a in runs[0].values())
    greedy = ShardStore(str(tmp_path / "g"), vocab_size=TCFG.vocab_size)
    _slot_run(eos_target, greedy, prompts, batch=4, max_new=9, seed=7, segment=4,
              max_batches=2)
    assert _answers(greedy).keys() == runs[0].keys() and _answers(greedy) != runs[0]
    with pytest.raises(ValueError, match="segment"):
        slots.SlotAnswerer(eos_target, greedy, batch=4, max_new=9, segment=0, seed=0,
                           max_prompt=64)


def test_collect_refill_resumes_with_sampling_and_topk(tmp_path, target):  # noqa: F811
    t = dj.Target(TCFG, target.params, _CharTokenizer())
    data = str(tmp_path / "data")
    kw = dict(seed=0, prompts=toy_pool(60), batch=4, max_new=8, deadline=None,
              request_every=0, request_share=0.0, pool_name="toy", store_topk=3, refill=3)
    first = collect(t, data, max_batches=2, sample_share=0.5, **kw)
    man = json.load(open(os.path.join(data, "manifest.json")))
    # Two full shards (greedy, sampled), then each pool's rows in flight finished into one more.
    assert first["answer_batches"] == len(man["shards"]) >= 2
    assert [s["temperature"] for s in man["shards"][:2]] == [0.0, 0.7]
    assert all(s["segment"] == 3 and s["topk"] == 3 for s in man["shards"])
    assert all(s["generator"] == slots.SlotAnswerer.GENERATOR for s in man["shards"])
    store = ShardStore(data)
    for e in store.entries():
        assert store.read(e)["topk_ids"].shape == (e["answer_tokens"], 3)
    collect(t, data, max_batches=1, **kw)
    rows = list(ShardStore(data).rows())
    keys = [tok[:p].tobytes() for tok, p, _ in rows]
    assert len(keys) == len(set(keys)) and len(rows) > first["rows"]


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
    _slot_run(target, store, prompts, batch=4, max_new=24, seed=0, segment=5, loop_window=2,
              loop_repeats=3)
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
    kw = dict(seed=0, prompts=toy_pool(60), batch=4, max_new=8, deadline=None,
              request_every=0, request_share=0.0, pool_name="toy", max_batches=1)
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
