"""``return_logprobs=True``: each generated token's log-prob equals the one a separate
teacher-forced target forward over prompt + generated tokens gives under the same sampling
distribution (temperature, top-k, top-p), for AR, a chain and a tree method, greedy and sampled.
Rows of a right-padded batch of two prompts; a lookup oracle makes drafts accepted."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from decode_helpers import fresh_jit_decode, lookup_drafter, oracle_table
from dominotree_jax import DecodeConfig
from dominotree_jax.api import _plain_forward
from dominotree_jax.sampling import sampling_logprobs
from spec_fixtures import tiny_pair

MAX_NEW = 16
SAMPLING = {"greedy": dict(temperature=0.0), "t0.8": dict(temperature=0.8, top_k=20, top_p=0.9)}
jdecode = fresh_jit_decode()        # always traced with the greedy oracle patched in
jdecode_plain = fresh_jit_decode()  # never patched


@pytest.fixture(scope="module")
def setup():
    tcfg, dcfg, params = tiny_pair()
    prompt_BT = np.array([[3, 17, 5, 9, 33, 2, 8], [40, 1, 12, 0, 0, 0, 0]], np.int32)
    lengths_B = np.array([7, 3], np.int32)
    greedy = jdecode(params, prompt_BT, lengths_B,
                     config=DecodeConfig(target=tcfg, method="ar", max_new_tokens=MAX_NEW))
    table = oracle_table(prompt_BT, lengths_B, np.asarray(greedy.tokens), tcfg.vocab_size,
                         dcfg.block_size)
    return tcfg, dcfg, params, prompt_BT, lengths_B, table


def _teacher_forced_logprobs(params, tcfg, prompt_BT, lengths_B, out, sampling):
    """``[B, MAX_NEW]``: log-prob of each generated token from one causal forward over
    prompt + generated tokens (right-padded), under ``sampling``'s distribution."""
    B = prompt_BT.shape[0]
    n_B = np.asarray(out.num_tokens)
    gen_BY = np.asarray(out.tokens)
    seq_BW = np.zeros((B, prompt_BT.shape[1] + MAX_NEW), np.int32)
    for b in range(B):
        seq_BW[b, :lengths_B[b] + n_B[b]] = np.concatenate(
            [prompt_BT[b, :lengths_B[b]], gen_BY[b, :n_B[b]]])
    logits_BWV = _plain_forward(params["target"], jax.numpy.asarray(seq_BW), tcfg)
    lp_BWV = np.asarray(sampling_logprobs(logits_BWV, sampling["temperature"],
                                          sampling.get("top_k", 0), sampling.get("top_p", 1.0)))
    expected = np.zeros((B, MAX_NEW), np.float32)
    for b in range(B):
        for j in range(n_B[b]):
            expected[b, j] = lp_BWV[b, lengths_B[b] - 1 + j, gen_BY[b, j]]
    return expected


def _check(params, tcfg, prompt_BT, lengths_B, out, sampling):
    got = np.asarray(out.logprobs)
    assert np.isfinite(got).all() and (got <= 0).all()
    expected = _teacher_forced_logprobs(params, tcfg, prompt_BT, lengths_B, out, sampling)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)
    return expected


@pytest.mark.parametrize("name", list(SAMPLING))
@pytest.mark.parametrize("method", ["ar", "dflash", "dominotree"])
def test_logprobs_equal_a_teacher_forced_forward(setup, method, name):
    tcfg, dcfg, params, prompt_BT, lengths_B, greedy_table = setup
    sampling = SAMPLING[name]
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method=method, max_new_tokens=MAX_NEW,
                       budget=6, node_topk=3, top_m=16, return_logprobs=True, **sampling)
    key = jax.random.key(11)
    if name == "greedy" or method == "ar":
        with lookup_drafter(greedy_table):
            out = jdecode(params, prompt_BT, lengths_B, key, config=cfg)
    else:
        # a sampled continuation leaves the greedy one at once: first decode with the random
        # drafter, then with an oracle built from that output (same key, so at least the first
        # round's draft is accepted), in a jit of its own (the table is a traced constant)
        first = jdecode_plain(params, prompt_BT, lengths_B, key, config=cfg)
        _check(params, tcfg, prompt_BT, lengths_B, first, sampling)
        table = oracle_table(prompt_BT, lengths_B, np.asarray(first.tokens), tcfg.vocab_size,
                             dcfg.block_size)
        with lookup_drafter(table):
            out = fresh_jit_decode()(params, prompt_BT, lengths_B, key, config=cfg)
    if method != "ar":
        assert int(np.asarray(out.accept_lengths).max()) > 1  # accepted nodes were scored too
    expected = _check(params, tcfg, prompt_BT, lengths_B, out, sampling)
    if name != "greedy":  # the filters did bite: some tokens had mass moved onto them
        unfiltered = _teacher_forced_logprobs(params, tcfg, prompt_BT, lengths_B, out,
                                              {"temperature": 0.8})
        assert (expected - unfiltered).max() > 1e-3
