"""Batched decoding is row-independent: each row of a right-padded batch of prompts of different
lengths decodes exactly as that prompt alone (tokens, lengths, acceptance per round), for every
method at temperature 0, with rows finishing at different rounds on a stop id.

The drafter is the tiny random one plus a lookup "oracle" keyed on ``(start, t0)`` that is right
for some depths and silent for others, so rows accept different numbers of tokens per round and
fall out of step with each other (a random drafter alone almost never gets a draft accepted).
"""

from __future__ import annotations

import numpy as np
import pytest

from decode_helpers import fresh_jit_decode, lookup_drafter, oracle_table
from dominotree_jax import DecodeConfig
from spec_fixtures import tiny_pair

METHODS = ("ar", "dflash", "domino", "ddtree", "dominotree")
LENGTHS = (3, 7, 5, 10)
MAX_NEW = 24
jdecode = fresh_jit_decode()


def _prompts(pad_seed: int):
    """``[4, 10]`` right-padded prompts (padding = random junk ids) and their lengths."""
    rng = np.random.default_rng(0)
    width = max(LENGTHS)
    prompt_BT = np.random.default_rng(pad_seed).integers(0, 63, (len(LENGTHS), width))
    for b, n in enumerate(LENGTHS):
        prompt_BT[b, :n] = rng.integers(0, 63, n)
    return prompt_BT.astype(np.int32), np.array(LENGTHS, np.int32)


def _config(tcfg, dcfg, method, stop_ids=()):
    return DecodeConfig(target=tcfg, drafter=dcfg, method=method, max_new_tokens=MAX_NEW,
                        stop_ids=tuple(stop_ids), budget=6, node_topk=3, top_m=16)


def _pick_stop_id(gen_BY):
    """The token whose first occurrence gives the most distinct row lengths (smallest id wins)."""
    def lengths(v):
        return tuple(int(np.argmax(row == v)) + 1 if (row == v).any() else MAX_NEW
                     for row in gen_BY)
    return max(range(int(gen_BY.max()) + 1), key=lambda v: (len(set(lengths(v))), -v))


@pytest.fixture(scope="module")
def setup():
    tcfg, dcfg, params = tiny_pair()
    prompt_BT, lengths_B = _prompts(pad_seed=1)
    ref = jdecode(params, prompt_BT, lengths_B, config=_config(tcfg, dcfg, "ar"))
    gen_BY = np.asarray(ref.tokens)
    table = oracle_table(prompt_BT, lengths_B, gen_BY, tcfg.vocab_size, dcfg.block_size)
    return tcfg, dcfg, params, prompt_BT, lengths_B, table, _pick_stop_id(gen_BY)


def _assert_row_equal(batch, b, single, what):
    for field in ("tokens", "num_tokens", "accept_lengths", "num_rounds"):
        np.testing.assert_array_equal(np.asarray(getattr(batch, field))[b],
                                      np.asarray(getattr(single, field))[0],
                                      err_msg=f"{what}: row {b}, {field}")


@pytest.mark.parametrize("method", METHODS)
def test_batch_rows_equal_single_prompt_decodes(setup, method):
    tcfg, dcfg, params, prompt_BT, lengths_B, table, stop = setup
    cfg = _config(tcfg, dcfg, method, stop_ids=(stop,))
    with lookup_drafter(table):
        batch = jdecode(params, prompt_BT, lengths_B, config=cfg)
        n_B = np.asarray(batch.num_tokens)
        assert len(set(n_B.tolist())) >= 3, n_B  # rows really finish at different rounds
        assert np.asarray(batch.tokens)[np.arange(4), n_B - 1].tolist().count(stop) >= 2
        if method != "ar":  # drafts were accepted, unevenly across rows
            taus = np.asarray(batch.accept_lengths)
            assert taus.max() > 1 and len({tuple(r) for r in taus}) == 4, taus
        # each prompt alone, as a batch of one. "ar" compiles fast: every prompt unpadded
        # (shapes [1, 3], [1, 7], ...). Drafting methods compile slowly, so one shape [1, 10]:
        # the longest prompt unpadded and the others right-padded with other junk than in the
        # batch; "dominotree" also runs the shortest prompt unpadded (cache extents differ).
        other_pad, _ = _prompts(pad_seed=2)
        if method == "ar":
            alone = [(b, prompt_BT[b:b + 1, :LENGTHS[b]]) for b in range(4)]
        else:
            alone = [(b, other_pad[b:b + 1]) for b in range(4)]
            if method == "dominotree":
                alone.append((0, prompt_BT[:1, :LENGTHS[0]]))
        for b, prompt_1T in alone:
            single = jdecode(params, prompt_1T, lengths_B[b:b + 1], config=cfg)
            _assert_row_equal(batch, b, single, f"{method}, prompt {b} alone {prompt_1T.shape}")
