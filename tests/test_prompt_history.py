"""Drafts from the group and the history in the rollout engine (``lookup_group``,
``lookup_history``; ``rollout/prompt_history.py``): the engine keeps each prompt's last
rollouts, bounded, and a prompt seen before drafts from them (τ up, tokens still ``ar``'s);
the history survives an engine checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

from dominotree_jax.rollout.prompt_history import PromptHistory
from dominotree_jax.rollout.state_file import read_state_file, write_state_file
from spec_fixtures import tiny_pair
from test_tunix_engine import make_engine, rcfg


def test_history_is_bounded_newest_first_and_cut_to_the_width():
    h = PromptHistory(per_prompt=2, max_prompts=2)
    prompts = np.array([[1, 2, 0], [1, 2, 9], [3, 0, 0]], np.int32)
    lengths = np.array([2, 2, 1])
    h.add(prompts[:2], lengths[:2], np.array([[5, 6, 7], [8, -1, -1]]), np.array([3, 1]))
    assert len(h.texts) == 1   # rows 0 and 1 continue the same prompt (padding ignored)
    got = h.array(prompts, lengths, width=2)
    np.testing.assert_array_equal(got[0], [[8, -1], [5, 6]])   # newest first, cut to 2
    np.testing.assert_array_equal(got[2], [[-1, -1], [-1, -1]])
    h.add(prompts[2:], lengths[2:], np.array([[4, 4, 4]]), np.array([3]))
    h.add(prompts[:1], lengths[:1], np.array([[9, 9, 9]]), np.array([2]))
    assert [t.tolist() for t in h.texts[h.key([1, 2])]] == [[9, 9], [8]]   # two kept
    h.add(np.array([[7, 7, 7]]), np.array([3]), np.array([[1, 1, 1]]), np.array([1]))
    assert h.key([3]) not in h.texts and len(h.texts) == 2   # the least recently used left
    back = PromptHistory.from_checkpoint(h.checkpoint_state())
    assert {k: [t.tolist() for t in v] for k, v in back.texts.items()} == \
        {k: [t.tolist() for t in v] for k, v in h.texts.items()}
    with pytest.raises(ValueError, match="per_prompt >= 1"):
        PromptHistory(0)


def test_a_prompt_seen_before_drafts_from_its_history(tmp_path):
    pair = tiny_pair()
    prompts = ["3 17 5 9", "3 17 5 9", "40 1", "40 1"]
    greedy = rcfg(max_tokens_to_generate=16)
    ar = make_engine(pair, method="ar")
    ref = [t.tolist() for t in ar.generate(prompts, greedy).tokens]
    eng = make_engine(pair, method="lookup", budget=6, lookup=2, lookup_group=2,
                      lookup_history=2)
    taus = []
    for _ in range(2):
        out = eng.generate(prompts, greedy)
        assert [t.tolist() for t in out.tokens] == ref
        taus.append(eng.last.tau)
    assert taus[1] > taus[0] + 1.0, taus   # the second call copies the first one's answers
    assert len(eng.history.texts) == 2 and eng.num_compilations == 1
    assert all(len(v) == 2 for v in eng.history.texts.values())
    path = str(tmp_path / "engine.npz")
    write_state_file(path, eng.checkpoint_state())
    fresh = make_engine(pair, method="lookup", budget=6, lookup=2, lookup_group=2,
                        lookup_history=2)
    fresh.restore_checkpoint_state(read_state_file(path)[1])
    assert {k: [t.tolist() for t in v] for k, v in fresh.history.texts.items()} == \
        {k: [t.tolist() for t in v] for k, v in eng.history.texts.items()}
