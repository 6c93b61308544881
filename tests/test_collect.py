"""Data collection on a tiny random target with a prompt pool passed in: a share of sampled
batches, stored top-k logits, multi-turn follow-ups on the target's own answers, several pool
seeds, prompts read from a file, resumable and with a backward-compatible manifest. (The SmolLM2
prompt recipes: experiments/smollm2_campaign/tests.)"""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest

import dominotree_jax as dj
from dominotree_jax.train.data.collect import collect, sampled_batch
from dominotree_jax.train.data.overlap import BenchmarkFilter
from dominotree_jax.train.data.shards import ShardStore
from test_data_pipeline import TCFG, _CharTokenizer, target  # noqa: F401 (fixture)

FOLLOW_UPS = ("Can you make that shorter?", "Please add a short conclusion.")
COLOURS = ("red", "green", "blue", "amber", "violet", "teal")


def toy_pool(num: int):
    """The pool seed -> ``num`` distinct short prompts (a stand-in for a prompt recipe)."""
    def pool(seed: int) -> list[dict]:
        rng = random.Random(seed)
        texts = dict.fromkeys(f"Describe a {rng.choice(COLOURS)} box holding {rng.randrange(10**6)}"
                              f" beads." for _ in range(num))
        return [{"source": "template:toy", "text": t} for t in texts]
    return pool


def test_sampled_batch_share():
    assert [sampled_batch(n, 0.5) for n in range(4)] == [False, True, False, True]
    assert not any(sampled_batch(n, 0.0) for n in range(10))
    assert sum(sampled_batch(n, 0.3) for n in range(100)) == 30


def test_collect_resumes_with_followups_sampling_and_topk(tmp_path, target):  # noqa: F811
    t = dj.Target(TCFG, target.params, _CharTokenizer())
    data = str(tmp_path / "data")
    kw = dict(seed=0, prompts=toy_pool(60), batch=4, max_new=8, deadline=None,
              request_every=0, request_share=0.0, pool_name="toy", store_topk=3)
    first = collect(t, data, max_batches=2, sample_share=0.5, **kw)
    assert first["answer_batches"] == 2
    man = json.load(open(os.path.join(data, "manifest.json")))
    assert [s["temperature"] for s in man["shards"]] == [0.0, 0.7]
    assert all(s["topk"] == 3 and s["prompt_mix"] == "toy" for s in man["shards"])
    store = ShardStore(data)
    for e in store.entries():
        shard = store.read(e)
        assert shard["topk_ids"].shape == (e["answer_tokens"], 3)
    # A second run (resumed) adds multi-turn follow-ups on the answers of the first.
    with pytest.raises(ValueError, match="follow_ups"):
        collect(t, data, max_batches=1, followup_share=0.5, **kw)
    second = collect(t, data, max_batches=1, followup_share=0.5, follow_ups=FOLLOW_UPS, **kw)
    store = ShardStore(data)
    rows = list(store.rows())
    follow = [(tok, p) for tok, p, src in rows if src.startswith("followup:")]
    assert follow, store.manifest["sources"]
    tok, p = follow[0]
    # Turn starts (id 1 in the toy template): user, assistant, user, then the generation prompt.
    assert int(np.sum(tok[:p] == 1)) == 4
    # Nothing was answered twice.
    keys = [tok[:p].tobytes() for tok, p, _ in rows]
    assert len(keys) == len(set(keys)) and len(rows) == 8 + second["rows"]
    assert np.all([p > 0 for _, p, _ in rows])


def test_until_means_the_next_such_utc_time_and_rejects_bad_times():
    import datetime
    import time


    from dominotree_jax.train.data.collect import deadline_from
    now = datetime.datetime.now(datetime.timezone.utc)
    past = (now - datetime.timedelta(minutes=2)).strftime("%H:%M")
    soon = (now + datetime.timedelta(minutes=3)).strftime("%H:%M")
    t = time.time()
    # a time earlier today (e.g. 00:55 asked at 22:56) is tomorrow's, not "already passed"
    assert 23 * 3600 < deadline_from(None, past) - t <= 24 * 3600
    assert 60 < deadline_from(None, soon) - t <= 4 * 60
    assert deadline_from(1, soon) - t <= 61          # the earlier of the two
    assert deadline_from(None, None) is None
    for bad in ("25:00", "12:60", "9", "ab:cd"):
        with pytest.raises(ValueError, match="HH:MM"):
            deadline_from(None, bad)


def test_several_seeds_answer_their_pools_in_order(tmp_path, target):  # noqa: F811
    """``--seed 5 6``: seed 5's pool first, then seed 6's, until both are used up; a repeated
    seed is refused."""

    from dominotree_jax.train.data.collect import pool_items
    from dominotree_jax.train.data.generate import prompt_key
    t = dj.Target(TCFG, target.params, _CharTokenizer())
    kw = dict(prompts=toy_pool(6), batch=4, max_new=3, deadline=None, max_batches=None,
              request_every=0, request_share=0.0)

    def pool_keys(seed):
        items, _, _ = pool_items(t.tokenizer, toy_pool(6)(seed), BenchmarkFilter(), set())
        return {prompt_key(ids) for ids, _ in items}
    first, second = pool_keys(5), pool_keys(6)
    assert len(first) >= 4 and second - first
    data = str(tmp_path / "data")
    total = collect(t, data, seed=[5, 6], **kw)
    store = ShardStore(data)
    shards = [{prompt_key(tok[:p]) for tok, p, _ in store.entry_rows(e)}
              for e in store.entries()]
    assert set().union(*shards) == first | second       # both pools, each prompt once
    assert total["rows"] == len(first | second)
    assert shards[0] <= first                           # seed 5's pool came first
    assert collect(t, data, seed=[5, 6], **kw)["rows"] == 0   # resumed: nothing left
    with pytest.raises(ValueError, match="distinct"):
        collect(t, str(tmp_path / "b"), seed=[5, 5], **kw)


def test_prompts_from_a_file(tmp_path):
    from dominotree_jax.train.data.collect import prompts_from_file
    path = tmp_path / "mine.jsonl"
    path.write_text('{"text": "Hello there"}\n\n{"text": "Sort a list", "source": "code"}\n')
    assert prompts_from_file(str(path)) == [{"text": "Hello there", "source": "file:mine"},
                                            {"text": "Sort a list", "source": "code"}]
    for bad in ('{"prompt": "x"}', "plain text", '{"text": ""}'):
        path.write_text(bad + "\n")
        with pytest.raises(ValueError, match="mine.jsonl:1"):
            prompts_from_file(str(path))
