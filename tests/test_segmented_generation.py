"""Segmented (refilling) answer generation on a tiny random target: the same greedy answers as
the plain path, an exact answer cap across segments, full refilled calls, only completed rows
in shards, resumable after a kill, and ``collect --segment``."""

from __future__ import annotations

import collections
import json
import os

import numpy as np
import pytest

import dominotree_jax as dj
from dominotree_jax.train import segmented
from dominotree_jax.train.collect import collect
from dominotree_jax.train.generate import generate_answers
from dominotree_jax.train.shards import ShardStore
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
    toks, num = segmented.run_decode(target, [p for p, _ in prompts], width=64, batch=16,
                                     max_new=10, stop_ids=())
    eos = collections.Counter(toks[:, 1:9].ravel().tolist()).most_common(1)[0][0]
    return dj.Target(TCFG, target.params, _EosTokenizer(int(eos)))


def test_segmented_greedy_equals_plain_and_refills(tmp_path, eos_target):
    prompts = _prompts(14)
    plain = ShardStore(str(tmp_path / "plain"), vocab_size=TCFG.vocab_size)
    generate_answers(eos_target, plain, prompts, batch=4, max_new=10, seed=0, **QUIET)
    ref = _answers(plain)
    lengths = [len(a) for a in ref.values()]
    assert len(ref) == 14 and min(lengths) < 10 and max(lengths) == 10, lengths  # uneven rows
    seg = ShardStore(str(tmp_path / "seg"), vocab_size=TCFG.vocab_size)
    s = generate_answers(eos_target, seg, prompts, batch=4, max_new=10, seed=0, segment=3,
                         **QUIET)
    assert _answers(seg) == ref
    assert s["rows"] == 14 and s["answer_tokens"] == sum(lengths)
    # Refill: calls mix fresh prompts with continuing rows, and every call runs a full batch
    # until the prompts run out (only the last refill and the drain may run fewer rows).
    log = s["call_log"]
    assert any(0 < fresh < rows for rows, fresh in log), log
    last_fresh = max(i for i, (_, fresh) in enumerate(log) if fresh)
    assert all(rows == 4 for rows, _ in log[:last_fresh]), log
    assert s["full_calls"] >= len(log) - 4, log
    man = json.load(open(os.path.join(str(tmp_path / "seg"), "manifest.json")))
    assert [e["rows"] for e in man["shards"]] == [4, 4, 4, 2]
    assert all(e["segment"] == 3 and e["gen_seconds"] >= 0 for e in man["shards"])


def test_segmented_cap_is_exact_and_wide_rows_fit(tmp_path, target):  # noqa: F811
    # No stop id: every answer runs to the cap, which 3 segments of 5 tokens overshoot; one
    # prompt of 1020 tokens needs a width past the largest prompt bucket once answered.
    prompts = _prompts(5, seed=2) + [(list(np.arange(1020) % 80 + 3), "long")]
    plain = ShardStore(str(tmp_path / "plain"), vocab_size=TCFG.vocab_size)
    generate_answers(target, plain, prompts, batch=3, max_new=12, seed=0, **QUIET)
    seg = ShardStore(str(tmp_path / "seg"), vocab_size=TCFG.vocab_size)
    s = generate_answers(target, seg, prompts, batch=3, max_new=12, seed=0, segment=5, **QUIET)
    got = _answers(seg)
    assert all(len(a) == 12 for a in got.values()) and len(got) == 6
    assert got == _answers(plain)
    assert s["answer_tokens"] == 6 * 12
    assert max(e["prompt_width"] for e in seg.entries("answers")) == 1024


def test_segmented_kill_leaves_only_complete_rows_and_resumes(tmp_path, eos_target,
                                                             monkeypatch):
    prompts = _prompts(12, seed=1)
    plain = ShardStore(str(tmp_path / "plain"), vocab_size=TCFG.vocab_size)
    generate_answers(eos_target, plain, prompts, batch=4, max_new=10, seed=0, **QUIET)
    ref = _answers(plain)

    real, calls = segmented.run_decode, []

    def dies_on_fifth_call(*a, **kw):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt("killed")
        return real(*a, **kw)

    monkeypatch.setattr(segmented, "run_decode", dies_on_fifth_call)
    data = str(tmp_path / "run")
    with pytest.raises(KeyboardInterrupt):
        generate_answers(eos_target, ShardStore(data, vocab_size=TCFG.vocab_size), prompts,
                         batch=4, max_new=10, seed=0, segment=3, **QUIET)
    monkeypatch.setattr(segmented, "run_decode", real)
    killed = _answers(ShardStore(data))
    assert 0 < len(killed) < 12                       # some shard made it, not everything
    assert all(ref[k] == v for k, v in killed.items())  # full answers only, never partial
    s = generate_answers(eos_target, ShardStore(data), prompts, batch=4, max_new=10, seed=0,
                         segment=3, **QUIET)
    assert s["pending"] == 12 - len(killed) and s["rows"] == s["pending"]
    assert _answers(ShardStore(data)) == ref
    assert ShardStore(data).totals()["answers"]["rows"] == 12   # nothing answered twice


def test_segmented_max_batches_and_sampling(tmp_path, eos_target):
    prompts = _prompts(20, seed=3)
    runs = []
    for name in ("a", "b"):
        store = ShardStore(str(tmp_path / name), vocab_size=TCFG.vocab_size)
        s = generate_answers(eos_target, store, prompts, batch=4, max_new=9, seed=7, segment=4,
                             temperature=0.7, max_batches=2, **QUIET)
        assert s["batches"] == 2 and s["rows"] == 8
        runs.append(_answers(store))
    assert runs[0] == runs[1]                           # keys from the seed and call number
    assert all(len(a) <= 9 for a in runs[0].values())
    greedy = ShardStore(str(tmp_path / "g"), vocab_size=TCFG.vocab_size)
    generate_answers(eos_target, greedy, prompts, batch=4, max_new=9, seed=7, segment=4,
                     max_batches=2, **QUIET)
    assert _answers(greedy).keys() == runs[0].keys() and _answers(greedy) != runs[0]
    with pytest.raises(ValueError, match="segment"):
        segmented.SegmentedAnswerer(eos_target, greedy, batch=4, max_new=9, segment=0, seed=0)


@pytest.mark.parametrize("mode", ["segment", "refill"])
def test_collect_segmented_resumes_with_sampling_and_topk(tmp_path, target, mode):  # noqa: F811
    """``collect --segment`` and ``collect --refill`` (``slots.SlotAnswerer``)."""
    from dominotree_jax.train.slots import SlotAnswerer
    t = dj.Target(TCFG, target.params, _CharTokenizer())
    data = str(tmp_path / "data")
    kw = dict(seed=0, num_prompts=60, batch=4, max_new=8, deadline=None, request_every=0,
              request_share=0.0, prompt_mix="v4", store_topk=3, **{mode: 3})
    first = collect(t, data, max_batches=2, sample_share=0.5, **kw)
    man = json.load(open(os.path.join(data, "manifest.json")))
    # Two full shards (greedy, sampled), then each pool's rows in flight finished into one more.
    assert first["answer_batches"] == len(man["shards"]) >= 2
    assert [s["temperature"] for s in man["shards"][:2]] == [0.0, 0.7]
    assert all(s["segment"] == 3 and s["topk"] == 3 for s in man["shards"])
    generator = (SlotAnswerer if mode == "refill" else segmented.SegmentedAnswerer).GENERATOR
    assert all(s["generator"] == generator for s in man["shards"])
    store = ShardStore(data)
    for e in store.entries():
        assert store.read(e)["topk_ids"].shape == (e["answer_tokens"], 3)
    collect(t, data, max_batches=1, **kw)
    rows = list(ShardStore(data).rows())
    keys = [tok[:p].tobytes() for tok, p, _ in rows]
    assert len(keys) == len(set(keys)) and len(rows) > first["rows"]
