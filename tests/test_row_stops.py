"""Per-row stop sets: ``decode(..., row_stop_ids=[B, K])`` and ``DominoTreeRollout.generate(
..., stop_tokens=[[...], ...])``. At temperature 0 each row of a batch with its own stop ids
equals that prompt decoded alone with those ids as ``DecodeConfig.stop_ids``."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from decode_helpers import FAST_XLA, fresh_jit_decode
from dominotree_jax import DecodeConfig, decode
from spec_fixtures import IntTokenizer, tiny_pair

PROMPT_BT = np.array([[3, 17, 5, 9, 33], [40, 1, 0, 0, 0], [7, 7, 21, 0, 0], [5, 60, 2, 8, 1]],
                     np.int32)
LENGTHS_B = np.array([5, 2, 3, 5], np.int32)
MAX_NEW = 16
jdecode = fresh_jit_decode()
# the batch with per-row stop ids, jitted as the rows alone are (not eager loops)
jdecode_rows = jax.jit(lambda params, prompt_BT, lengths_B, stops_Be, *, config: decode(
    params, prompt_BT, config=config, prompt_lengths=lengths_B, row_stop_ids=stops_Be),
    static_argnames="config", compiler_options=FAST_XLA)


def _config(tcfg, dcfg, method, stop_ids=()):
    return DecodeConfig(target=tcfg, drafter=dcfg, method=method, max_new_tokens=MAX_NEW,
                        stop_ids=tuple(stop_ids), budget=6, node_topk=3, top_m=16)


def _row_stops(gen_BN):
    """Per row: a token it generates after its first few (so the row stops early, each row at
    another place), plus a token it never generates; -1 pads."""
    stops_Be = np.full((len(gen_BN), 3), -1, np.int32)
    for b, row in enumerate(gen_BN):
        stops_Be[b, 0] = row[3 + b]
        stops_Be[b, 1] = min(set(range(1, 64)) - set(row.tolist()))
    return stops_Be


@pytest.fixture(scope="module")
def setup():
    tcfg, dcfg, params = tiny_pair()
    free = jdecode(params, PROMPT_BT, LENGTHS_B, config=_config(tcfg, dcfg, "ar"))
    return tcfg, dcfg, params, _row_stops(np.asarray(free.tokens))


@pytest.mark.parametrize("method", ["ar", "dominotree"])
def test_row_stop_ids_equal_each_row_alone(setup, method):
    tcfg, dcfg, params, stops_Be = setup
    shared = (11,)    # a config stop id on top of the rows' own
    batch = jdecode_rows(params, PROMPT_BT, LENGTHS_B, stops_Be,
                         config=_config(tcfg, dcfg, method, shared))
    lengths = set()
    for b in range(len(PROMPT_BT)):
        own = tuple(int(s) for s in stops_Be[b] if s >= 0) + shared
        alone = jdecode(params, PROMPT_BT[b:b + 1, :LENGTHS_B[b]], LENGTHS_B[b:b + 1],
                        config=_config(tcfg, dcfg, method, own))
        for field in ("tokens", "num_tokens", "accept_lengths", "num_rounds"):
            np.testing.assert_array_equal(np.asarray(getattr(batch, field))[b],
                                          np.asarray(getattr(alone, field))[0],
                                          err_msg=f"{method} row {b} {field}")
        n = int(batch.num_tokens[b])
        assert n < MAX_NEW and int(batch.tokens[b, n - 1]) in own
        lengths.add(n)
    assert len(lengths) > 1   # the rows stopped at different places


def test_row_stop_ids_bad_input(setup):
    tcfg, dcfg, params, stops_Be = setup
    cfg = _config(tcfg, dcfg, "ar")
    with pytest.raises(ValueError, match=r"integer \[B=4, e\]"):
        decode(params, PROMPT_BT, config=cfg, prompt_lengths=LENGTHS_B,
               row_stop_ids=stops_Be[:2])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        decode(params, PROMPT_BT, config=cfg, prompt_lengths=LENGTHS_B,
               row_stop_ids=np.full((4, 1), 64))


def test_engine_stop_tokens_per_prompt(setup):
    pytest.importorskip("tunix", reason="google-tunix is not installed (make test installs it)")
    from tunix.rl.rollout import base_rollout

    from dominotree_jax.rollout import DominoTreeRollout, TunixCausalLM

    tcfg, dcfg, params, stops_Be = setup
    engine = DominoTreeRollout(rollout_actor=TunixCausalLM.from_params(tcfg, params["target"],
                                                                       0),
                               tokenizer=IntTokenizer(), drafter_config=dcfg,
                               drafter_params=params["drafter"], budget=6, node_topk=3,
                               compiler_options=FAST_XLA)
    prompts = [" ".join(str(t) for t in p[:n]) for p, n in zip(PROMPT_BT, LENGTHS_B)]
    rc = base_rollout.RolloutConfig(max_tokens_to_generate=MAX_NEW, max_prompt_length=8,
                                    temperature=0.0, top_p=None, return_logprobs=True)
    free = engine.generate(prompts, rc)
    stops = [[int(s) for s in row if s >= 0] for row in stops_Be]
    stopped = engine.generate(prompts, rc, stop_tokens=stops)
    for b, (f, s) in enumerate(zip(free.tokens, stopped.tokens)):
        cut = [j for j, t in enumerate(f) if t in stops[b]]
        assert cut, (b, f, stops[b])     # the row's stop id occurs in its free completion
        np.testing.assert_array_equal(s, f[:cut[0]])   # ends there, the stop id dropped
        np.testing.assert_allclose(stopped.logprobs[b], free.logprobs[b][:cut[0]], atol=1e-5)
    with pytest.raises(ValueError, match="one list per prompt"):
        engine.generate(prompts, rc, stop_tokens=stops[:1])
    with pytest.raises(ValueError, match="stop_tokens outside the vocabulary"):
        engine.generate(prompts, rc, stop_tokens=[[64]] * len(prompts))
