"""DSpark drafters (docs/algorithm.md §3b): the Markov and confidence heads against NumPy, the
``dspark`` chain and the ``dsparktree`` tree lossless (equal to ``ar`` at T = 0 with batches,
stop ids, lookup branches and ``budget="auto"``; the target's distribution at T = 1), an oracle
reaching the longest acceptance, and DeepSpec's release layout loading (float32, bf16, orbax)
with its copies of the target's tables checked."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dominotree_jax as dj
from convert.__main__ import main as convert_main
from convert.errors import CheckpointError
from dominotree_jax import DecodeConfig
from dominotree_jax.config import ConfigError, DrafterConfig, check_drafter
from dominotree_jax.decoding.costs import CostTable
from dominotree_jax.markov_head import corrected_logits, markov_chain
from dominotree_jax.model.drafter import bind_drafter, drafter_graphdef, restrict_to_draft_vocab

import released_layouts as rl
from decode_helpers import (assert_equals_ar_on_a_batch,
                            assert_samples_follow_the_target,
                            assert_scripted_drafts_fully_accepted, jit_decode)
from spec_fixtures import sampling_case, tiny_pair

jdecode = jit_decode()


def _numpy_heads(dp, z_BJH, base_BJV, t0_B):
    """NumPy (float64) twins: the greedy Markov chain's tokens and log-probs, and the confidence
    logits along it."""
    w1 = np.asarray(dp["markov_head"]["markov_w1"]["weight"][...], np.float64)
    w2 = np.asarray(dp["markov_head"]["markov_w2"]["weight"][...], np.float64)
    proj = np.asarray(dp["confidence_head"]["proj"]["weight"][...], np.float64)
    bias = np.asarray(dp["confidence_head"]["proj"]["bias"][...], np.float64)
    z, base = np.asarray(z_BJH, np.float64), np.asarray(base_BJV, np.float64)
    B, J, _ = base.shape
    toks, lps, conf = np.zeros((B, J), int), np.zeros((B, J)), np.zeros((B, J))
    for b in range(B):
        prev = int(t0_B[b])
        for d in range(J):
            logits = base[b, d] + w2 @ w1[prev]
            conf[b, d] = np.concatenate([z[b, d], w1[prev]]) @ proj[0] + bias[0]
            toks[b, d] = int(np.argmax(logits))
            m = logits.max()
            lps[b, d] = m - (m + np.log(np.exp(logits - m).sum()))
            prev = toks[b, d]
    return toks, lps, conf


def test_heads_match_their_numpy_references():
    """The Markov chain (tokens, log-probs) and the confidence logits within 1e-5 of NumPy."""
    tcfg, dcfg, params = tiny_pair(dspark=True)
    drafter = bind_drafter(dcfg, params["drafter"])
    rng = np.random.default_rng(0)
    J, H, V = dcfg.num_draft_positions, dcfg.hidden_size, dcfg.vocab_size
    z = jnp.asarray(rng.normal(size=(3, J, H)), jnp.float32)
    base = jnp.asarray(rng.normal(size=(3, J, V)) * 3, jnp.float32)
    t0 = jnp.asarray([1, 7, 60], jnp.int32)
    toks, lps = markov_chain(drafter.markov_weights(), base, t0)
    ref_toks, ref_lps, ref_conf = _numpy_heads(params["drafter"], z, base, np.asarray(t0))
    np.testing.assert_array_equal(toks, ref_toks)
    np.testing.assert_allclose(lps, ref_lps, atol=1e-5, rtol=1e-5)
    prev = jnp.concatenate([t0[:, None], toks[:, :-1]], axis=1)
    np.testing.assert_allclose(drafter.confidence(z, prev), ref_conf, atol=1e-5, rtol=1e-5)
    # the head changes the draft: the corrected argmax differs from the base one somewhere
    assert (np.asarray(toks) != np.asarray(base).argmax(-1)).any()
    w1 = np.asarray(params["drafter"]["markov_head"]["markov_w1"]["weight"][...], np.float64)
    w2 = np.asarray(params["drafter"]["markov_head"]["markov_w2"]["weight"][...], np.float64)
    np.testing.assert_allclose(corrected_logits(drafter.markov_weights(), base[0, 0], t0[0]),
                               np.asarray(base[0, 0], np.float64) + w2 @ w1[1],
                               atol=1e-5, rtol=1e-5)


# method, extra settings: every path a round can take
CASES = [
    ("dspark", {}),
    ("dsparktree", {}),
    ("dspark", dict(lookup=2)),
    ("dsparktree", dict(lookup=2, top_m=0)),
    ("dspark", dict(budget="auto", auto_costs=CostTable())),
    ("dsparktree", dict(budget="auto", auto_costs=CostTable(), lookup=2)),
]


@pytest.mark.parametrize("method,extra", CASES)
def test_greedy_equals_ar_with_batches_stops_lookup_and_auto(method, extra):
    tcfg, dcfg, params = tiny_pair(dspark=True)
    assert_equals_ar_on_a_batch(tcfg, dcfg, params, method,
                                **{**dict(budget=6, node_topk=3, top_m=16), **extra})


def test_a_draft_vocabulary_keeps_the_heads_on_its_columns():
    """A DSpark drafter restricted to a draft vocabulary (``restrict_to_draft_vocab``): its
    chain is the NumPy chain over those columns, each previous token's Markov row read by its
    target id; both methods still equal ``ar``."""
    tcfg, dcfg, params = tiny_pair(dspark=True)
    ids = np.sort(np.random.default_rng(1).choice(63, 40, replace=False))
    vcfg, vparams = restrict_to_draft_vocab(dcfg, params["drafter"], ids)
    assert DrafterConfig.from_hf_dict(vcfg.to_hf_dict()) == vcfg   # the released layout
    drafter = bind_drafter(vcfg, vparams)
    rng = np.random.default_rng(2)
    base = jnp.asarray(rng.normal(size=(2, vcfg.num_draft_positions, 40)) * 3, jnp.float32)
    t0 = jnp.asarray([5, 62], jnp.int32)
    toks, _ = markov_chain(drafter.markov_weights(), base, t0)
    w1 = np.asarray(params["drafter"]["markov_head"]["markov_w1"]["weight"][...], np.float64)
    w2 = np.asarray(params["drafter"]["markov_head"]["markov_w2"]["weight"][...], np.float64)
    for b in range(2):
        prev = int(t0[b])
        for d in range(vcfg.num_draft_positions):
            col = int(np.argmax(np.asarray(base[b, d], np.float64) + w2[ids] @ w1[prev]))
            assert int(toks[b, d]) == col
            prev = int(ids[col])
    prompt = jnp.array([3, 17, 5, 9, 33, 2, 8])
    ar = jdecode(params, prompt, config=DecodeConfig(target=tcfg, method="ar", max_new_tokens=24))
    for method in ("dspark", "dsparktree"):
        cfg = DecodeConfig(target=tcfg, drafter=vcfg, method=method, max_new_tokens=24,
                           budget=6, node_topk=3, top_m=16)
        out = jdecode({**params, "drafter": vparams}, prompt, config=cfg)
        np.testing.assert_array_equal(out.tokens, ar.tokens, err_msg=method)


@pytest.mark.parametrize("method", ["dspark", "dsparktree"])
def test_oracle_reaches_the_longest_acceptance(method):
    """Base logits scripted to the target's continuation and the Markov head zeroed: every round
    accepts the whole draft (the chain's ``J`` = the block, slot 0 included)."""
    tcfg, dcfg, params = tiny_pair(dspark=True)
    params["drafter"]["markov_head"] = jax.tree.map(jnp.zeros_like,
                                                     params["drafter"]["markov_head"])
    assert_scripted_drafts_fully_accepted(tcfg, dcfg, params, method, dcfg.block_size,
                                          top_m=16)


@pytest.mark.parametrize("method", ["dspark", "dsparktree"])
def test_sampling_matches_the_target_distribution(method):
    assert_samples_follow_the_target(sampling_case(dspark=True), method, top_m=0)


def test_methods_need_their_head_and_dspark_refuses_what_it_cannot_run():
    tcfg, dcfg, _ = tiny_pair()   # a Domino drafter
    for method in ("dspark", "dsparktree"):
        with pytest.raises(ValueError, match=f"{method!r} needs a DSpark drafter"):
            DecodeConfig(target=tcfg, drafter=dcfg, method=method)
    _, ds, _ = tiny_pair(dspark=True)
    with pytest.raises(ValueError, match="'dominotree' needs a Domino drafter"):
        DecodeConfig(target=tcfg, drafter=ds, method="dominotree")
    for bad, match in ((dict(shift_label=False), "shift_label=True"),
                       (dict(projector_type="domino", gru_hidden_dim=4, emb_dim=4),
                        "not two")):
        with pytest.raises(ConfigError, match=match):
            check_drafter(dataclasses.replace(ds, **bad))


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    root = tmp_path_factory.mktemp("dspark")
    return (rl.write_target(str(root / "target")),
            rl.write_drafter(str(root / "dspark"), "dspark_qwen3"), root)


def test_release_loads_in_float32_bf16_and_orbax(release):
    target, drafter, root = release
    pair = dj.load_pair(target, drafter)
    assert pair.drafter_config.is_dspark and pair.drafter_config.confidence_head
    stored = rl._random_tensors(drafter_graphdef(pair.drafter_config, "float32")[1], 1)
    np.testing.assert_array_equal(pair.drafter_params["markov_head"]["markov_w2"]["weight"][...],
                                  stored["markov_head.markov_w2.weight"])
    bf16 = dj.load_pair(target, drafter, precision="bfloat16")
    assert bf16.drafter_params["markov_head"]["markov_w1"]["weight"][...].dtype == jnp.bfloat16
    out = str(root / "orbax")
    assert convert_main(["drafter", drafter, out]) == 0
    again = dj.load_pair(target, out)
    assert again.drafter_config == pair.drafter_config
    same = jax.tree.map(lambda a, b: bool((a == b).all()), again.drafter_params,
                        pair.drafter_params)
    assert all(jax.tree.leaves(same))


def test_release_with_another_targets_tables_is_refused(release, tmp_path):
    target, drafter, _ = release
    bad = str(tmp_path / "bad")
    shutil.copytree(drafter, bad)
    from convert.safetensors_io import read_safetensors, write_safetensors
    tensors = read_safetensors(os.path.join(bad, "model.safetensors"))
    tensors = {n: np.array(a) for n, a in tensors.items()}
    tensors["lm_head.weight"][3] += 1.0
    write_safetensors(os.path.join(bad, "model.safetensors"), tensors, {"format": "pt"})
    with pytest.raises(CheckpointError, match="lm_head.weight: differs from the target's"):
        dj.load_pair(target, bad)
    tensors["lm_head.weight"] = tensors["lm_head.weight"][:, :5]
    write_safetensors(os.path.join(bad, "model.safetensors"), tensors, {"format": "pt"})
    with pytest.raises(CheckpointError, match="lm_head.weight"):
        dj.load_pair(target, bad)
    with open(os.path.join(bad, "config.json")) as f:
        cfg = json.load(f)
    cfg.pop("markov_rank")
    with open(os.path.join(bad, "config.json"), "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ConfigError, match="needs markov_rank > 0"):
        dj.load_pair(target, bad)


def test_confidence_share_sets_the_chain_scores():
    """A ``dspark`` chain's node scores: share 1 the confidence head's cumulative log-survival,
    0 the chain's path log-probs, between them the log of the blend; refused without a head."""
    from dominotree_jax.decoding.draft import chain_draft
    tcfg, dcfg, params = tiny_pair(dspark=True)
    drafter = bind_drafter(dcfg, params["drafter"])
    rng = np.random.default_rng(3)
    J, H, V = dcfg.num_draft_positions, dcfg.hidden_size, dcfg.vocab_size
    z = jnp.asarray(rng.normal(size=(2, J, H)), jnp.float32)
    base = jnp.asarray(rng.normal(size=(2, J, V)) * 3, jnp.float32)
    t0 = jnp.asarray([2, 9], jnp.int32)
    toks, lps = markov_chain(drafter.markov_weights(), base, t0)
    prev = jnp.concatenate([t0[:, None], toks[:, :-1]], axis=1)
    surv = np.cumprod(np.asarray(jax.nn.sigmoid(drafter.confidence(z, prev)), np.float64), 1)
    path = np.exp(np.cumsum(np.asarray(lps, np.float64), 1))
    for share, want in ((1.0, surv), (0.0, path), (0.3, 0.3 * surv + 0.7 * path)):
        cfg = DecodeConfig(target=tcfg, drafter=dcfg, method="dspark", confidence_share=share)
        draft = chain_draft(cfg, None, drafter, z, base, t0)
        np.testing.assert_array_equal(draft.tokens_BN, toks)
        np.testing.assert_allclose(np.exp(np.asarray(draft.scores_BN, np.float64)), want,
                                   rtol=1e-5, atol=1e-7)
    assert DecodeConfig(target=tcfg, drafter=dcfg, method="dspark").confidence_weight == 0.0
    with pytest.raises(ValueError, match="needs method 'dspark'"):
        DecodeConfig(target=tcfg, drafter=dcfg, method="dsparktree", confidence_share=0.5)
    with pytest.raises(ValueError, match=r"lie in \[0, 1\]"):
        DecodeConfig(target=tcfg, drafter=dcfg, method="dspark", confidence_share=1.5)
