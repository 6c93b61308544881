"""``condstatic``: one Domino correction per depth along the greedy path, shared by every node of
that depth (docs/algorithm.md §4). The builder against the NumPy reference, its relation to
the Domino chain, ``ddtree`` and ``dominotree``, and decoding with it: token-identical to ``ar``
at T=0 and distributed as the target at T=1."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dominotree_jax import DecodeConfig
from dominotree_jax.decoding.config import METHODS
from dominotree_jax.domino_head import DominoHeadWeights, domino_chain
from dominotree_jax.tree import build_tree
from dominotree_jax.tree.reference import build_tree_numpy
from decode_helpers import SAMPLING_XLA, fresh_jit_decode, jit_decode
from spec_fixtures import first_tokens_chi_square_p, sampling_case, scripted_drafter, tiny_pair
from test_tree_builder import CONFIGS, FAMILIES, assert_same_tree, check_invariants, make_case

jdecode = jit_decode()
CS_CONFIGS = {name.replace("dt_", "cs_"): cfg._replace(method="condstatic")
              for name, cfg in CONFIGS.items() if cfg.method == "dominotree"}


def test_condstatic_is_a_method():
    assert "condstatic" in METHODS


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", sorted(CS_CONFIGS))
def test_matches_reference(name, family):
    cfg = CS_CONFIGS[name]
    for seed in (0, 1):
        case = make_case(cfg, seed, family)
        got = build_tree(**case, **cfg.statics(), use_pallas=False)
        ref = build_tree_numpy(**case, **cfg.statics())
        assert_same_tree(got, ref, exact_scores=family == "peaked", cond_from=cfg.prefix_len,
                         logit_scale=float(np.abs(case["base_logits"]).max()))
        check_invariants(ref, cfg.J)


def test_pallas_interpret_matches_reference():
    cfg = CS_CONFIGS["cs_default"]
    case = make_case(cfg, 3, "normal")
    got = build_tree(**case, **cfg.statics(), use_pallas="interpret")
    ref = build_tree_numpy(**case, **cfg.statics())
    assert_same_tree(got, ref, cond_from=cfg.prefix_len,
                     logit_scale=float(np.abs(case["base_logits"]).max()))


def test_children_are_shared_by_depth_and_follow_the_domino_chain():
    cfg = CS_CONFIGS["cs_default"]._replace(top_m=0)
    case = make_case(cfg, 4, "normal")
    case["proj_w2"] = case["proj_w2"] * 8          # a strong correction
    tree = build_tree(**case, **cfg.statics())
    tok, par, dep = (np.asarray(x) for x in (tree.tokens, tree.parents, tree.depths))
    # Every expanded node of a depth gets the same children (the same order of tokens).
    kids: dict[int, list[int]] = {}
    for i in range(len(tok)):
        if dep[i] >= 1:
            kids.setdefault(int(par[i]), []).append(int(tok[i]))
    deep = [p for p in kids if len(kids[p]) >= 2]
    for p in deep:
        for q in deep:
            if dep[p] == dep[q]:
                n = min(len(kids[p]), len(kids[q]))
                assert kids[p][:n] == kids[q][:n]
    # The top child of each depth is the Domino chain's greedy token (full vocabulary).
    head = DominoHeadWeights(*(jnp.asarray(case[k]) for k in (
        "embed", "gru_w_ih", "gru_w_hh", "proj_w1", "proj_w2")))
    chain, _ = domino_chain(head, jnp.asarray(case["hidden"])[None],
                            jnp.asarray(case["base_logits"])[None],
                            jnp.asarray(case["root_token"])[None], cfg.prefix_len)
    k1 = build_tree(**case, **{**cfg.statics(), "node_topk": 1, "budget": cfg.J})
    np.testing.assert_array_equal(np.asarray(k1.tokens), np.asarray(chain[0]))
    # ... which differs from the marginal tree's and from the per-path tree's here.
    dd = build_tree(**case, **{**cfg.statics(), "method": "ddtree"})
    dt = build_tree(**case, **{**cfg.statics(), "method": "dominotree"})
    assert not np.array_equal(np.asarray(dd.tokens), tok)
    assert not np.array_equal(np.asarray(dt.tokens), tok)


def _cfg(tcfg, dcfg, method, **kw):
    kw.setdefault("budget", 6)
    kw.setdefault("node_topk", 3)
    kw.setdefault("top_m", 16)
    return DecodeConfig(target=tcfg, drafter=dcfg, method=method, **kw)


def test_greedy_is_token_identical_to_ar():
    tcfg, dcfg, params = tiny_pair(block_size=4)
    prompt = jnp.array([3, 17, 5, 9, 33, 2, 8])
    ref = jdecode(params, prompt, config=_cfg(tcfg, dcfg, "ar", max_new_tokens=40))
    out = jdecode(params, prompt, config=_cfg(tcfg, dcfg, "condstatic", max_new_tokens=40))
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    # An oracle drafter reaches the maximal τ; a wrong one gets 1.
    seq = np.concatenate([np.asarray(prompt), np.asarray(ref.tokens[0])])
    cfg = _cfg(tcfg, dcfg, "condstatic", max_new_tokens=30, budget=8, node_topk=2)
    # a fresh jit per drafter (each patches Drafter.draft): traces are never shared
    with scripted_drafter(seq):
        out = fresh_jit_decode()(params, prompt[None], None, config=cfg)
    taus = np.asarray(out.accept_lengths[0, :int(out.num_rounds[0])])
    assert (taus[:-1] == cfg.max_depth + 1).all()
    with scripted_drafter(seq, wrong=True):
        out = fresh_jit_decode()(params, prompt[None], None, config=cfg)
    np.testing.assert_array_equal(out.tokens[0], ref.tokens[0, :30])
    assert (np.asarray(out.accept_lengths[0, :int(out.num_rounds[0])]) == 1).all()


def test_sampling_matches_the_target_distribution():
    runs = 20000
    tcfg, dcfg, params, prompt, exact = sampling_case()
    cfg = _cfg(tcfg, dcfg, "condstatic", max_new_tokens=3, temperature=1.0, budget=6,
               node_topk=2, top_m=0)
    out = jit_decode(SAMPLING_XLA)(
        params, jnp.tile(prompt, (runs, 1)), config=cfg, key=jax.random.key(7))
    toks = np.asarray(out.tokens)
    assert (toks >= 0).all()
    p = first_tokens_chi_square_p(toks, exact, tcfg.vocab_size)
    assert p > 1e-3, p
    assert int(np.asarray(out.accept_lengths).max()) > 1   # drafts were accepted


def test_needs_a_domino_drafter():
    tcfg, dcfg, _ = tiny_pair(domino=False)
    with pytest.raises(ValueError, match="Domino drafter"):
        _cfg(tcfg, dcfg, "condstatic")


