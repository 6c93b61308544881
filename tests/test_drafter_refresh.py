"""The drafter follows the policy: ``decode(..., return_features=True)`` returns the target's
tapped features of the committed tokens (equal to a teacher-forced forward's), and the jitted
drafter step trains on them with the offline loss, with no target forward and no
recompilation when policy or drafter parameters change."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from decode_helpers import FAST_XLA, jit_decode
from dominotree_jax import DecodeConfig
from dominotree_jax.decoding.draft import tap_layers_for
from dominotree_jax.model.target import TargetModel, bind_target
from dominotree_jax.rollout import DominoTreeRollout, RolloutConfig, masked_forward
from dominotree_jax.rollout.drafter_refresh import DrafterRefresher, rollout_drafter_batch
from spec_fixtures import tiny_pair

PROMPTS = [[3, 17, 5, 9], [40, 1], [5, 12, 40, 2, 2, 7], [7]]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


@pytest.fixture(scope="module")
def rollout(pair):
    """An engine (random drafter) and one T=1 rollout with features."""
    tcfg, dcfg, params = pair
    eng = DominoTreeRollout(rollout_actor=bind_target(tcfg, params["target"]),
                            drafter_config=dcfg, drafter_params=params["drafter"], budget=6,
                            node_topk=3, top_m=16, return_features=True,
                            compiler_options=FAST_XLA)
    rc = RolloutConfig(max_tokens_to_generate=12, temperature=1.0, top_p=1.0,
                       max_prompt_length=8, eos_tokens=[0], return_logprobs=True, seed=4)
    eng.generate(PROMPTS, rc)
    return eng, rc


def test_features_equal_teacher_forced_taps(pair, rollout):
    tcfg, dcfg, params = pair
    eng, _ = rollout
    last = eng.last
    out = last.out
    T = last.prompt_BT.shape[1]
    N = out.tokens.shape[1]
    assert out.features.shape == (len(PROMPTS), T + N, dcfg.num_taps * tcfg.hidden_size)
    taps = tap_layers_for(eng.decode_config(rollout[1]))
    for b, prompt in enumerate(PROMPTS):
        L, n = len(prompt), int(out.num_tokens[b])
        seq = jnp.asarray(prompt + out.tokens[b, :n].tolist(), jnp.int32)[None]
        ref = masked_forward(bind_target(tcfg, params["target"]), seq,
                             jnp.ones(seq.shape, bool), taps).taps[0]
        np.testing.assert_allclose(np.asarray(out.features[b, :L + n - 1]),
                                   np.asarray(ref[:L + n - 1]), atol=2e-4)


def test_features_off_by_default(pair):
    tcfg, dcfg, params = pair
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method="dominotree", max_new_tokens=4,
                       budget=4, node_topk=2, top_m=8)
    out = jit_decode()(
        params, jnp.asarray([[3, 4, 5]], jnp.int32), config=cfg)
    assert out.features is None
    with pytest.raises(ValueError, match="return_features needs a drafter config"):
        cfg.replace(method="ar", drafter=None, return_features=True)


@pytest.mark.parametrize("method", ["ar", "lookup"])
def test_methods_without_a_drafter_tap_its_features_when_given_its_config(pair, method):
    """``ar`` and ``lookup`` with a drafter config return the features it would read (the
    rollout engine's plain calls feed the drafter refresh so), equal to a teacher-forced
    forward's at the committed tokens."""
    tcfg, dcfg, params = pair
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method=method, max_new_tokens=6,
                       return_features=True, **({"budget": 4} if method == "lookup" else {}))
    prompt = [3, 17, 5, 9, 3, 17]
    out = jit_decode()({"target": params["target"], "drafter": None},
                       jnp.asarray([prompt], jnp.int32), config=cfg)
    n = int(out.num_tokens[0])
    seq = jnp.asarray(prompt + out.tokens[0, :n].tolist(), jnp.int32)[None]
    taps = tap_layers_for(cfg)
    assert taps == tuple(dcfg.target_layer_ids)
    ref = masked_forward(bind_target(tcfg, params["target"]), seq, jnp.ones(seq.shape, bool),
                         taps).taps[0]
    L = len(prompt)
    np.testing.assert_allclose(np.asarray(out.features[0, :L + n - 1]),
                               np.asarray(ref[:L + n - 1]), atol=2e-4)
    assert tap_layers_for(cfg.replace(return_features=False)) == ()


def test_rollout_batch_layout(rollout):
    eng, _ = rollout
    last = eng.last
    out = last.out
    block = eng.dcfg.num_draft_positions
    batch = rollout_drafter_batch(last.prompt_BT, last.lengths_B, out.tokens, out.num_tokens,
                                  out.features, jax.random.key(0), anchors=5, block=block)
    for b, prompt in enumerate(PROMPTS):
        L, n = len(prompt), int(out.num_tokens[b])
        seq = prompt + out.tokens[b, :n].tolist()
        assert batch["tokens"][b, :L + n].tolist() == seq
        assert not np.asarray(batch["feats"][b, L + n - 1:]).any()   # unknown: zeroed
        for a, lab in zip(batch["anchors"][b].tolist(), batch["labels"][b].tolist()):
            assert L - 1 <= a <= max(L + n - 2, L - 1)
            want = [seq[i] if i < L + n else -1 for i in range(a, a + block + 1)]
            assert lab == want


def test_refresh_step_learns_without_target_forward_or_recompiling(pair, rollout,
                                                                   monkeypatch):
    tcfg, dcfg, params = pair
    eng, rc = rollout
    calls = []
    original = TargetModel.__call__

    def counting(self, *a, **k):
        calls.append(1)
        return original(self, *a, **k)

    monkeypatch.setattr(TargetModel, "__call__", counting)
    ref = DrafterRefresher(dcfg, tcfg, params["drafter"], lr=3e-3, anchors=6,
                           compiler_options=FAST_XLA)
    losses = []
    for i in range(6):
        tparams = jax.tree.map(lambda x: x * (1.0 + 0.01 * i), params["target"])  # a policy
        losses.append(ref.step(tparams, eng.last, jax.random.key(0))["loss"])
    assert calls == []                      # the step never runs the target's layers
    assert len(ref.traces) == 1             # new policy / drafter values: one compilation
    assert losses[-1] < losses[0] - 0.05    # it learns (same batch, same anchors)
    monkeypatch.undo()
    # the refreshed drafter loads into the engine without recompiling decode
    compiled = eng.num_compilations
    eng.update_drafter_params(ref.state)
    greedy = dataclasses.replace(rc, temperature=0.0, top_p=None)
    before = eng.generate(PROMPTS, greedy)
    eng.update_drafter_params(params["drafter"])
    after = eng.generate(PROMPTS, greedy)
    assert eng.num_compilations == compiled + 1     # (the greedy config, once)
    for x, y in zip(before.tokens, after.tokens):   # lossless: the drafter changes speed only
        np.testing.assert_array_equal(x, y)
