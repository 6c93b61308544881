"""A draft vocabulary (docs/algorithm.md §3): the drafter proposes only the target ids of its
``d2t`` map. Every method stays lossless (T = 0 identical to ``ar``; T = 1 the target's
distribution), drafts are handed to the target as target ids, bad maps are refused by name,
the map travels with the released layout, and the trainer trains over it."""

from __future__ import annotations

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from convert.drafter import load_drafter, save_drafter
from convert.errors import CheckpointError
from convert.safetensors_io import read_safetensors, write_safetensors
from dominotree_jax import DecodeConfig
from dominotree_jax.config import ConfigError
from dominotree_jax.model.drafter import (Drafter, check_draft_vocab, init_drafter_params,
                                          with_draft_vocab)
from dominotree_jax.train.loss import draft_column_index
from decode_helpers import SAMPLING_XLA, fresh_jit_decode, jit_decode
from spec_fixtures import exact_joint, first_tokens_chi_square_p, tiny_pair

METHODS = ("dflash", "domino", "ddtree", "condstatic", "dominotree")
jdecode = jit_decode()


def _pair_with_vocab(d2t, vocab=64, seed=0):
    tcfg, dcfg, params = tiny_pair(vocab=vocab, block_size=4, seed=seed)
    dcfg = dataclasses.replace(dcfg, draft_vocab_size=len(d2t))
    params["drafter"] = init_drafter_params(dcfg, seed + 1, d2t=d2t)
    return tcfg, dcfg, params


def _cfg(tcfg, dcfg, method, **kw):
    kw.setdefault("budget", 6)
    kw.setdefault("node_topk", 3)
    kw.setdefault("top_m", 8)
    return DecodeConfig(target=tcfg, drafter=dcfg, method=method, **kw)


@contextlib.contextmanager
def oracle_in_draft_columns(continuation, d2t, vocab):
    """``Drafter.draft`` whose depth ``d`` strongly predicts the true next token, in the draft
    vocabulary's columns (nothing where the token lies outside it)."""
    seq = jnp.asarray(continuation, jnp.int32)
    col = draft_column_index(jnp.asarray(d2t), vocab)
    original = Drafter.draft

    def draft(self, target, ctx, t0_B, start_B, head_rows_CH=None):
        z, base_BJD = original(self, target, ctx, t0_B, start_B, head_rows_CH)
        J, D = base_BJD.shape[1:]
        idx = jnp.clip(start_B[:, None] + 1 + jnp.arange(J)[None], 0, seq.shape[0] - 1)
        return z, base_BJD * 0.01 + 30.0 * jax.nn.one_hot(col[seq[idx]], D)   # -1: all zero

    Drafter.draft = draft
    try:
        yield
    finally:
        Drafter.draft = original


def test_every_method_is_identical_to_ar_and_drafts_target_ids():
    prompt = jnp.array([3, 17, 5, 9, 33, 2, 8])
    tcfg, dcfg, params = tiny_pair(vocab=64, block_size=4)
    ref = jdecode(params, prompt, config=_cfg(tcfg, dcfg, "ar", max_new_tokens=30))
    seq = np.concatenate([np.asarray(prompt), np.asarray(ref.tokens[0])])
    # D holds most of the answer's tokens but not all: drafts must stop where D does not reach
    rng = np.random.default_rng(0)
    answer, counts = np.unique(np.asarray(ref.tokens[0]), return_counts=True)
    missing = answer[np.argmax(counts)]          # the answer's most frequent token
    assert counts.max() >= 3
    d2t = np.setdiff1d(np.union1d(answer, rng.choice(64, 10, replace=False)), [missing])
    tcfg, dcfg, params = _pair_with_vocab(d2t)
    assert params["drafter"]["embed_proj"][2]["weight"][...].shape == (len(d2t), dcfg.emb_dim)
    for method in METHODS:
        cfg = _cfg(tcfg, dcfg, method, max_new_tokens=30)
        out = jdecode(params, prompt, config=cfg)
        np.testing.assert_array_equal(out.tokens, ref.tokens, err_msg=method)
        with oracle_in_draft_columns(seq, d2t, tcfg.vocab_size):
            out = fresh_jit_decode()(params, prompt[None], None, config=cfg)
        np.testing.assert_array_equal(out.tokens, ref.tokens, err_msg=method)
        taus = np.asarray(out.accept_lengths[0, :int(out.num_rounds[0])])
        # the oracle's drafts are accepted (target ids reach the verifier), yet never past the
        # token outside D: more rounds than a full-vocabulary oracle's ceil(29 / 5)
        assert taus.max() == cfg.max_depth + 1, (method, taus)
        assert len(taus) > -(-29 // (cfg.max_depth + 1)), (method, taus)


@pytest.mark.parametrize("method", ["domino", "dominotree"])
def test_sampling_with_a_draft_vocabulary_is_the_targets_distribution(method):
    runs = 20000
    tcfg, dcfg, params = _pair_with_vocab(np.array([0, 2, 3, 5]), vocab=6, seed=3)
    prompt = np.array([1, 4, 2])
    exact = exact_joint(tcfg, params["target"], prompt).reshape(-1)
    cfg = _cfg(tcfg, dcfg, method, max_new_tokens=3, temperature=1.0, node_topk=2, top_m=0)
    out = jit_decode(SAMPLING_XLA)(params, jnp.tile(prompt, (runs, 1)), config=cfg,
                                   key=jax.random.key(7))
    toks = np.asarray(out.tokens)
    assert first_tokens_chi_square_p(toks, exact, tcfg.vocab_size) > 1e-3
    assert int(np.asarray(out.accept_lengths).max()) > 1


@pytest.mark.parametrize("bad,match", [
    (np.array([1, 2, 64]), "outside the target's vocabulary"),
    (np.array([-1, 2, 3]), "outside the target's vocabulary"),
    (np.array([1, 2, 2]), "repeated ids"),
    (np.array([1, 2]), "2 ids for draft_vocab_size=3"),
    (np.array([[1, 2, 3]]), "1-D integer array"),
    (np.array([1.0, 2.0, 3.0]), "1-D integer array"),
])
def test_bad_maps_are_refused_by_name(bad, match):
    with pytest.raises(ConfigError, match=match):
        check_draft_vocab(bad, 64, 3)


def test_the_map_travels_with_the_released_layout_and_bad_files_are_refused(tmp_path):
    d2t = np.array([0, 3, 4, 9, 20, 33, 40, 63])
    tcfg, dcfg, params = _pair_with_vocab(d2t)
    out = str(tmp_path / "d")
    save_drafter(out, dcfg, params["drafter"], dtype="bfloat16")
    cfg, loaded = load_drafter(out, target_cfg=tcfg)
    assert cfg == dcfg and cfg.draft_vocab_size == 8
    np.testing.assert_array_equal(np.asarray(loaded["d2t"][...]), d2t)
    assert loaded["d2t"][...].dtype == jnp.int32
    tensors = dict(read_safetensors(str(tmp_path / "d" / "model.safetensors")))
    for bad, match in ((np.array([0, 3, 4, 9, 20, 33, 40, 64]), "outside"),
                       (np.array([0, 3, 3, 9, 20, 33, 40, 63]), "repeated"),
                       (np.array([3, 0, 4, 9, 20, 33, 40, 63]), "increasing order"),
                       (np.array([0, 3, 4, 9]), "shape mismatch: d2t")):
        write_safetensors(str(tmp_path / "d" / "model.safetensors"),
                          {**tensors, "d2t": bad.astype(np.int32)}, {"format": "pt"})
        with pytest.raises(CheckpointError, match=match):
            load_drafter(out, target_cfg=tcfg)
    with pytest.raises(ConfigError, match="no draft vocabulary"):
        with_draft_vocab(dataclasses.replace(dcfg, draft_vocab_size=None), params["drafter"], d2t)
    with pytest.raises(ConfigError, match="draft_vocab_size=99 is outside"):
        from dominotree_jax.config import check_drafter
        check_drafter(dataclasses.replace(dcfg, draft_vocab_size=99))


def test_auto_budget_over_a_draft_vocabulary_is_identical_to_ar():
    from dominotree_jax.decoding.costs import CostTable
    prompt = jnp.array([3, 17, 5, 9, 33, 2, 8])
    tcfg, dcfg, params = tiny_pair(vocab=64, block_size=4)
    ref = jdecode(params, prompt, config=_cfg(tcfg, dcfg, "ar", max_new_tokens=24))
    seq = np.concatenate([np.asarray(prompt), np.asarray(ref.tokens[0])])
    d2t = np.union1d(np.asarray(ref.tokens[0]), [0, 1, 2])
    tcfg, dcfg, params = _pair_with_vocab(d2t)
    cheap = CostTable(verify=((1, 1.0), (17, 1.6)),
                      draft=tuple((m, 0.1) for m in METHODS), source="test")
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method="dominotree", budget="auto",
                       node_topk=3, top_m=8, auto_costs=cheap, max_new_tokens=24)
    with oracle_in_draft_columns(seq, d2t, tcfg.vocab_size):
        out = fresh_jit_decode()(params, prompt[None], None, config=cfg)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    assert int(np.asarray(out.accept_lengths).max()) > 1


def test_the_rollout_refresher_keeps_the_map_fixed():
    from dominotree_jax.rollout.drafter_refresh import DrafterRefresher
    d2t = np.array([0, 3, 4, 9, 20, 33, 40, 63])
    tcfg, dcfg, params = _pair_with_vocab(d2t)
    ref = DrafterRefresher(dcfg, tcfg, params["drafter"], lr=1e-3, anchors=2)
    assert "d2t" not in ref.flat and all(v.dtype == jnp.float32 for v in ref.flat.values())
    np.testing.assert_array_equal(np.asarray(ref.state["d2t"][...]), d2t)
    assert ref.vocab_size == 8


def test_restricting_a_full_drafter_keeps_its_columns():
    from dominotree_jax.model.drafter import bind_drafter, restrict_to_draft_vocab
    from dominotree_jax.model.target import bind_target
    tcfg, dcfg, params = tiny_pair(vocab=64, block_size=4)
    d2t = np.array([1, 5, 7, 20, 33, 60])
    cfg2, p2 = restrict_to_draft_vocab(dcfg, params["drafter"], d2t)
    assert cfg2.draft_vocab_size == 6
    target = bind_target(tcfg, params["target"])
    z = jax.random.normal(jax.random.key(0), (3, tcfg.hidden_size))
    full = bind_drafter(dcfg, params["drafter"])
    sub = bind_drafter(cfg2, p2)
    np.testing.assert_allclose(np.asarray(sub.base_logits(target, z)),
                               np.asarray(full.base_logits(target, z))[:, d2t], rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_array_equal(np.asarray(sub.embed_proj[2].weight[...]),
                                  np.asarray(full.embed_proj[2].weight[...])[d2t])


def test_orbax_drafter_keeps_the_map_and_honours_the_dtype(tmp_path):
    from convert.orbax_io import save_params
    d2t = np.array([0, 3, 4, 9, 20, 33, 40, 63])
    tcfg, dcfg, params = _pair_with_vocab(d2t)
    out = str(tmp_path / "orbax")
    save_params(out, "drafter", dcfg, params["drafter"])
    cfg, loaded = load_drafter(out, dtype="bfloat16", target_cfg=tcfg)
    assert cfg == dcfg
    np.testing.assert_array_equal(np.asarray(loaded["d2t"][...]), d2t)
    leaves = jax.tree.leaves(loaded)
    assert {x.dtype for x in leaves if x.dtype != jnp.int32} == {jnp.dtype("bfloat16")}


def test_a_draft_head_made_beforehand_decodes_as_the_one_gathered_in_the_call():
    """``decode(..., draft_head=draft_head(params, config))`` (what a rollout engine passes
    between parameter updates) draws the same tokens as a call that gathers the head itself; a
    head of other parameters draws other ones; bad heads are refused by name."""
    from dominotree_jax.decoding.decode import draft_head
    tcfg, dcfg, params = _pair_with_vocab(np.array([0, 2, 3, 5, 8, 13, 21, 34, 40, 55, 63]))
    cfg = _cfg(tcfg, dcfg, "dominotree", temperature=1.0, max_new_tokens=16)
    prompt, key = jnp.array([[3, 17, 5, 9], [40, 1, 2, 7]]), jax.random.key(3)
    gathered = jdecode(params, prompt, config=cfg, key=key)
    head = jax.jit(draft_head, static_argnames="config")(params, config=cfg)
    assert head.shape == (11, tcfg.hidden_size)
    given = jdecode(params, prompt, config=cfg, key=key, draft_head=head)
    for a, b in zip(jax.tree.leaves(gathered), jax.tree.leaves(given)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    other = jdecode(params, prompt, config=cfg, key=key, draft_head=head[::-1])
    assert not np.array_equal(np.asarray(other.tokens), np.asarray(given.tokens))
    with pytest.raises(ValueError, match=r"draft_head must be \[C, H\] = \[11, 32\]"):
        jdecode(params, prompt, config=cfg, key=key, draft_head=head[1:])
    with pytest.raises(ValueError, match="LM head's dtype"):
        jdecode(params, prompt, config=cfg, key=key, draft_head=head.astype(jnp.bfloat16))
    with pytest.raises(ValueError, match="draft_head is only for a drafter"):
        jdecode(params, prompt, config=_cfg(tcfg, None, "ar", max_new_tokens=4), draft_head=head)
    assert draft_head(params, _cfg(tcfg, None, "ar")) is None
