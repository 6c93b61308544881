"""The stale-drafter guard (``rollout/drafter_guard.py``): its record, collapse, probes and
recovery on given figures, and in the engine a drafter corrupted inside an update: the engine
falls back to plain calls, reports it (metric, log, events), samples exactly what ``ar`` samples
meanwhile, and drafts again once a healthy drafter is handed in."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dominotree_jax.rollout.drafter_guard import (COLLAPSE, MAX_GUARD_GAP, MIN_EXCESS,
                                                  DrafterGuard)
from dominotree_jax.rollout.engine_metrics import tunix_metrics
from dominotree_jax.rollout.state_file import read_state_file, write_state_file
from spec_fixtures import scripted_drafter
from test_tunix_engine import make_engine, rcfg

CFG = "config"   # the guard keys its records by (config, rows); any hashable stands in here


def test_record_collapse_probes_and_recovery():
    g = DrafterGuard()
    assert g.allows_draft() and g.observe(CFG, 2, None, 1) is None   # nothing drafted
    for call, tau in enumerate((3.0, 3.2, 2.8), start=1):
        assert g.observe(CFG, 2, tau, call) is None
    record = g.records[(CFG, 2)]
    assert 2.8 < record < 3.2
    # a noisy call above the collapse line feeds the record, a collapse does not
    assert g.observe(CFG, 2, 1.0 + 1.05 * COLLAPSE * (record - 1.0), 4) is None
    record = g.records[(CFG, 2)]
    event = g.observe(CFG, 2, 1.0, 5)
    assert event == {"event": "collapsed", "call": 5, "tau": 1.0, "record": record}
    assert g.stale and g.records[(CFG, 2)] == record
    gaps = []
    for call in range(6, 60):   # plain calls between probes; the probes stay collapsed
        if g.allows_draft():
            assert g.observe(CFG, 2, 1.1, call) is None
            gaps.append(g.gap)
        else:
            g.plain_call()
    assert gaps[:4] == [4, 8, 16, 16] and MAX_GUARD_GAP == 16 and g.stale
    g.new_drafter()   # the caller hands in a drafter: probed in the next call
    assert g.allows_draft()
    assert g.observe(CFG, 2, 2.9, 60)["event"] == "recovered"
    assert not g.stale and g.gap == 1 and [e["event"] for e in g.events] == ["collapsed",
                                                                              "recovered"]
    # another config's probe while stale is judged against the lowest record
    g.observe(CFG, 2, 1.0, 61)
    assert g.stale and g.observe("other", 4, 1.0, 62) is None and g.stale


def test_a_drafter_that_never_paid_cannot_collapse():
    g = DrafterGuard()
    for call in range(5):
        g.observe(CFG, 1, 1.0 + 0.9 * MIN_EXCESS, call)
    assert g.observe(CFG, 1, 1.0, 5) is None and not g.stale


def test_the_guard_state_round_trips_through_a_state_file(tmp_path):
    g = DrafterGuard()
    g.observe(CFG, 2, 3.0, 1)
    g.observe(CFG, 2, 1.0, 2)
    path = str(tmp_path / "guard.npz")
    write_state_file(path, g.checkpoint_state())
    back = DrafterGuard.from_checkpoint(read_state_file(path)[1])
    assert back.stale and back.gap == g.gap and back.records == g.records
    assert DrafterGuard.from_checkpoint(None) == DrafterGuard()


def weight_gated_oracle(continuation):
    """An oracle drafter while its final norm weights are positive, always wrong once they are
    negated: a corruption of the drafter's *weights*, which an update hands to the same
    compiled program."""
    return scripted_drafter(continuation,
                            sign_of=lambda drafter: jnp.sign(jnp.mean(drafter.norm.weight[...])))


def _negated_norm(drafter_params):
    """The same parameters with the final norm's weights negated."""
    def negate(path, x):
        names = [getattr(k, "key", getattr(k, "name", None)) for k in path]
        return -x if names[:2] == ["norm", "weight"] else x
    return jax.tree_util.tree_map_with_path(negate, drafter_params)


@pytest.fixture(scope="module")
def pair():
    from spec_fixtures import tiny_pair
    return tiny_pair()


def test_a_corrupted_drafter_falls_back_reports_and_samples_as_ar(pair, caplog):
    prompts = ["3 17 5 9"] * 2
    greedy, sampled = rcfg(max_tokens_to_generate=16), rcfg(max_tokens_to_generate=16,
                                                            temperature=1.0, top_p=1.0)
    ar = make_engine(pair, method="ar", seed=7)
    ar_calls = [ar.generate(prompts, rc) for rc in (greedy, greedy, greedy, sampled, greedy)]
    ref = [int(t) for t in "3 17 5 9".split()] + ar_calls[0].tokens[0].tolist()
    healthy = pair[2]["drafter"]
    with weight_gated_oracle(ref):
        eng = make_engine(pair, seed=7)
        for _ in range(2):   # a healthy drafter: the record
            out = eng.generate(prompts, greedy)
            assert eng.last.method == "dominotree" and eng.last.tau > 2.5
            assert eng.tunix_metrics()["rollout/drafter_stale"][0] == 0.0
        eng.update_drafter_params(_negated_norm(healthy))   # corrupted inside an update
        with caplog.at_level(logging.WARNING, logger="dominotree_jax.rollout"):
            out = eng.generate(prompts, greedy)
        assert eng.last.method == "dominotree" and eng.last.tau == 1.0
        assert [e["event"] for e in eng.guard.events] == ["collapsed"]
        assert "drafter collapsed" in caplog.text
        assert eng.tunix_metrics()["rollout/drafter_stale"][0] == 1.0
        np.testing.assert_array_equal(np.stack(out.tokens), np.stack(ar_calls[2].tokens))
        # plain calls while stale: exactly ar's samples with the same keys, at T = 1 too
        out = eng.generate(prompts, sampled)
        assert eng.last.method == "ar" and eng.last.plain
        for a, b in zip(out.tokens, ar_calls[3].tokens, strict=True):
            np.testing.assert_array_equal(a, b)
        out = eng.generate(prompts, greedy)   # the probe: still collapsed
        assert eng.last.method == "dominotree" and eng.guard.stale and eng.guard.gap == 4
        assert eng.num_compilations == 2   # dominotree at T 0, ar at T 1
        eng.update_drafter_params(healthy)   # a healthy drafter: probed next call
        eng.generate(prompts, greedy)
        assert eng.last.method == "dominotree" and eng.last.tau > 2.5 and not eng.guard.stale
        assert [e["event"] for e in eng.guard.events] == ["collapsed", "recovered"]
        assert eng.tunix_metrics()["rollout/drafter_stale"][0] == 0.0
        assert "rollout/drafter_stale" not in tunix_metrics(eng.last, [], guarded=False)
        assert make_engine(pair, seed=7, drafter_guard=False).guard is None
