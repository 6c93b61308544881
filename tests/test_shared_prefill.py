"""One prefill shared by the rows that continue the same prompt (GRPO's G samples):
``decode(prompt_UT, prompt_rows=rows_B)`` equals ``decode(prompt_UT[rows_B])`` -- every field at
temperature 0, the same tokens from the same key at T > 0 -- while prefilling only the ``U``
distinct prompts; the engine (``share_prefill=True``, the default) finds the repeats itself."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import dominotree_jax.decoding.decode as decode_module
from decode_helpers import FAST_XLA, fresh_jit_decode
from dominotree_jax import DecodeConfig
from spec_fixtures import IntTokenizer, tiny_pair

PROMPT_UT = np.array([[3, 17, 5, 9, 33, 2], [40, 1, 0, 0, 0, 0], [7, 7, 21, 30, 0, 0]],
                     np.int32)
LENGTHS_U = np.array([6, 2, 4], np.int32)
ROWS_B = np.array([0, 0, 1, 2, 2, 1, 0, 2], np.int32)   # G copies, interleaved
FIELDS = ("tokens", "num_tokens", "accept_lengths", "num_rounds", "draft_sizes")


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


@pytest.fixture
def prefill_rows(monkeypatch):
    """The batch sizes ``decode`` prefilled (recorded while tracing)."""
    seen, real = [], decode_module.prefill_context

    def spy(**kw):
        seen.append(kw["prompt_BT"].shape[0])
        return real(**kw)

    monkeypatch.setattr(decode_module, "prefill_context", spy)
    return seen


@pytest.mark.parametrize("method,temperature,budget", [
    ("dominotree", 0.0, 6), ("dominotree", 0.9, 6), ("dominotree", 0.9, "auto"),
    ("ar", 0.9, 6)])
def test_shared_prefill_equals_repeated_prompts(pair, prefill_rows, method, temperature,
                                                budget):
    tcfg, dcfg, params = pair
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method=method, max_new_tokens=12,
                       temperature=temperature, budget=budget, node_topk=3, top_m=16,
                       return_logprobs=True, return_features=method != "ar")
    key = jax.random.key(7)

    def run_shared(params, prompt_UT, lengths_U, rows_B, key, *, config):
        return decode_module.decode(params, prompt_UT, config=config, key=key,
                                    prompt_lengths=lengths_U, prompt_rows=rows_B)

    shared = jax.jit(run_shared, static_argnames="config", compiler_options=FAST_XLA)(
        params, PROMPT_UT, LENGTHS_U, ROWS_B, key, config=cfg)
    assert prefill_rows == [len(PROMPT_UT)]
    plain = fresh_jit_decode()(params, PROMPT_UT[ROWS_B], LENGTHS_U[ROWS_B], key, config=cfg)
    assert prefill_rows[-1] == len(ROWS_B)
    for field in FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(shared, field)),
                                      np.asarray(getattr(plain, field)), err_msg=field)
    np.testing.assert_allclose(np.asarray(shared.logprobs), np.asarray(plain.logprobs),
                               atol=1e-5)
    if method != "ar":
        np.testing.assert_allclose(np.asarray(shared.features), np.asarray(plain.features),
                                   atol=1e-5)
    if temperature > 0:   # the copies of a prompt sampled different completions
        toks = np.asarray(shared.tokens)
        assert not np.array_equal(toks[0], toks[1]) or not np.array_equal(toks[0], toks[6])


def test_prompt_rows_bad_input(pair):
    tcfg, dcfg, params = pair
    cfg = DecodeConfig(target=tcfg, method="ar", max_new_tokens=4)
    with pytest.raises(ValueError, match="must index the 3 prompts"):
        decode_module.decode(params, PROMPT_UT, config=cfg, prompt_lengths=LENGTHS_U,
                             prompt_rows=np.array([0, 3]))
    with pytest.raises(ValueError, match=r"integer \[B\] array"):
        decode_module.decode(params, PROMPT_UT, config=cfg, prompt_lengths=LENGTHS_U,
                             prompt_rows=np.zeros((2, 2), np.int32))


def test_engine_shares_the_prefill_of_repeated_prompts(pair, prefill_rows):
    pytest.importorskip("tunix", reason="google-tunix is not installed (make test installs it)")
    from tunix.rl.rollout import base_rollout

    from dominotree_jax.rollout import DominoTreeRollout, TunixCausalLM

    tcfg, dcfg, params = pair
    prompts = [" ".join(str(t) for t in PROMPT_UT[u, :LENGTHS_U[u]]) for u in ROWS_B]

    def engine(share):
        return DominoTreeRollout(
            rollout_actor=TunixCausalLM.from_params(tcfg, params["target"], 0),
            tokenizer=IntTokenizer(), drafter_config=dcfg, drafter_params=params["drafter"],
            budget=6, node_topk=3, share_prefill=share, compiler_options=FAST_XLA)

    rc = base_rollout.RolloutConfig(max_tokens_to_generate=10, max_prompt_length=8,
                                    temperature=0.9, top_p=None, seed=4, return_logprobs=True)
    shared, plain = engine(True).generate(prompts, rc), engine(False).generate(prompts, rc)
    assert prefill_rows == [len(PROMPT_UT), len(prompts)]
    for a, b, x, y in zip(shared.tokens, plain.tokens, shared.logprobs, plain.logprobs):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(x, y, atol=1e-5)
    np.testing.assert_array_equal(shared.left_padded_prompt_tokens,
                                  plain.left_padded_prompt_tokens)
