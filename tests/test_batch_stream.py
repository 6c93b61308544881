"""The trainer's batch stream and features: features computed per batch equal the cached ones,
the batch order is a function of the step (with sequence weights), a stream resumes at any
step, a process builds only its rows of a batch, and the draft vocabulary by frequency."""

from __future__ import annotations

import numpy as np
import pytest

from dominotree_jax.train.data.shards import ShardStore
from dominotree_jax.train.dataset import SequenceDataset, batch_stream, epoch_order
from dominotree_jax.train.draft_vocab import coverage, frequent_answer_tokens
from dominotree_jax.train.features import FeatureCache, OnTheFlyFeatures
from dominotree_jax.train.run import RunSettings
from train_fixtures import TCFG, tiny_target_and_answers


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream")
    target, _, _ = tiny_target_and_answers(str(root / "data"))
    plan = RunSettings(data=str(root / "data"), trim_loops=0, seq_len=40, layers=1,
                       intermediate=96, taps=(0, 1), block_size=4, gru=16, emb=16,
                       mask_token_id=127, heldout_pct=20)
    return root, target, plan


def dataset(plan, target):
    """The run's dataset with features computed per batch."""
    return plan.dataset(target, OnTheFlyFeatures(target.config, target.params, plan.taps))


def test_features_per_batch_equal_the_cached_ones(setup):
    root, target, plan = setup
    store = ShardStore(plan.data, vocab_size=TCFG.vocab_size)
    cached = SequenceDataset(store, FeatureCache(str(root / "f"), TCFG, target.params, plan.taps),
                             plan.seq_len)
    fly = SequenceDataset(store, OnTheFlyFeatures(TCFG, target.params, plan.taps), plan.seq_len)
    ids = [0, 5, 9, 13]
    fly.prefetch(ids)
    for j in ids:
        a, b = cached.get(j), fly.get(j)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_allclose(a[1].astype(np.float32), b[1].astype(np.float32), atol=2e-2)
    fly.prefetch([1])
    with pytest.raises(KeyError, match="not prefetched"):
        fly.get(0)


def test_batch_order_is_a_function_of_the_step_with_weights():
    ids = np.arange(10)
    w = np.array([0.0, 0.5, 1, 1, 1, 2, 2, 3, 1, 1])
    a = epoch_order(ids, 3, 1, w)
    np.testing.assert_array_equal(a, epoch_order(ids, 3, 1, w))
    assert 0 not in a and (a == 7).sum() == 3
    with pytest.raises(ValueError, match="non-negative"):
        epoch_order(ids, 3, 1, -w)


def test_stream_resumes_at_any_step(setup):
    _, target, plan = setup
    ds = dataset(plan, target)
    ids, _ = ds.split(plan.heldout_pct)
    w = np.where(np.asarray([ds.sources[int(j)] for j in ids]) == "test", 1.5, 1.0)
    full = batch_stream(ds, ids, batch=4, anchors=4, block=4, seed=0, weights=w)
    seq = [next(full)["tokens"] for _ in range(12)]
    late = batch_stream(ds, ids, batch=4, anchors=4, block=4, seed=0, start_step=9, weights=w)
    for k in range(9, 12):
        np.testing.assert_array_equal(next(late)["tokens"], seq[k])


def test_a_process_builds_only_its_rows_and_they_equal_the_whole_batchs(setup):
    _, target, plan = setup
    ds = dataset(plan, target)
    ids, _ = ds.split(plan.heldout_pct)
    kw = dict(batch=4, anchors=4, block=4, seed=0, anchor_mode="sample")
    whole = batch_stream(ds, ids, **kw)
    part = batch_stream(ds, ids, rows=[1, 3], **kw)
    for _ in range(3):
        w, p = next(whole), next(part)
        assert set(w) == set(p)
        for k in w:
            np.testing.assert_array_equal(p[k], w[k][[1, 3]], err_msg=k)
    with pytest.raises(ValueError, match="increasing indices"):
        next(batch_stream(ds, ids, rows=[3, 1], **kw))


def test_draft_vocabulary_by_frequency(setup):
    _, target, plan = setup
    ds = dataset(plan, target)
    ids, _ = ds.split(plan.heldout_pct)
    d2t = frequent_answer_tokens(ds, ids, 48, TCFG.vocab_size)
    assert len(d2t) == 48 and (np.diff(d2t) > 0).all()
    assert coverage(ds, ids, d2t, TCFG.vocab_size) > coverage(
        ds, ids, np.arange(48), TCFG.vocab_size)
    assert coverage(ds, ids, np.arange(128), TCFG.vocab_size) == 1.0
