"""Lookup drafting (decoding/lookup.py): the in-jit search equals its plain-Python reference;
merged trees are budget-sized, ancestor-closed and free of repeated paths; every method with
lookup (and ``method="lookup"`` without a drafter) is identical to ``ar`` at T = 0 (batches,
stop ids, ``budget="auto"``) and samples the target's distribution at T = 1; bad settings are
refused by name."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dominotree_jax import DecodeConfig, decode
from dominotree_jax.decoding.costs import CostTable
from dominotree_jax.decoding.lookup import (DEFAULT_ACCEPT, Group, history, log_accept_table,
                                            group_of, lookup_candidates, merge_row,
                                            reference_candidates)
from decode_helpers import SAMPLING_XLA, jit_decode
from spec_fixtures import first_tokens_chi_square_p, sampling_case, tiny_pair

jdecode = jit_decode()
PROMPT = np.array([3, 17, 5, 9, 33, 2, 8, 3, 17, 5, 9, 33, 2, 8, 41, 3, 17])


def _check_row(seq, total, got, **kw):
    want = reference_candidates(seq, total, **kw)
    K = kw["num"]
    for k in range(K):
        if k < len(want):
            n, _, c, toks = want[k]
            assert int(got.ngram_BK[k]) == n, (k, want, got)
            valid = np.asarray(got.valid_BKL[k])
            assert valid.sum() == len(toks)
            np.testing.assert_array_equal(np.asarray(got.tokens_BKL[k])[valid], toks)
        else:
            assert int(got.ngram_BK[k]) == 0 and not np.asarray(got.valid_BKL[k]).any()


@pytest.mark.parametrize("kind", ["random", "repetitive"])
def test_candidates_equal_the_python_reference(kind):
    rng = np.random.default_rng(1 if kind == "random" else 2)
    B, W = 6, 48
    vocab = 9 if kind == "random" else 4
    seq = rng.integers(0, vocab, size=(B, W)).astype(np.int32)
    if kind == "repetitive":
        seq[:, 20:40] = np.tile(seq[:, :5], (1, 4))
    totals = np.array([1, 2, 10, 25, 40, 48], np.int32)
    for kw in (dict(num=4, length=5, ngram_min=1, ngram_max=4, window=None),
               dict(num=3, length=3, ngram_min=2, ngram_max=3, window=12)):
        got = lookup_candidates(jnp.asarray(seq), jnp.asarray(totals), **kw)
        for b in range(B):
            _check_row(seq[b], int(totals[b]), jax.tree.map(lambda x: x[b], got), **kw)


@pytest.mark.parametrize("kind", ["random", "repetitive"])
def test_group_candidates_equal_the_python_reference(kind):
    """``lookup_group``: a row also copies from its siblings (their text past ``from``, up to
    their own totals), ranked after its own starts of the same n."""
    rng = np.random.default_rng(3 if kind == "random" else 4)
    B, W, G = 6, 40, 4
    seq = rng.integers(0, 9 if kind == "random" else 4, size=(B, W)).astype(np.int32)
    if kind == "repetitive":
        seq[:, 10:30] = np.tile(seq[:1, :5], (B, 4))
    totals = np.array([3, 12, 25, 40, 18, 30], np.int32)
    from_B = np.array([2, 2, 2, 5, 5, 1], np.int32)
    rows = np.array([[b // G * G + j for j in range(G)] for b in range(B)])
    ok = (rows < B) & (rows != np.arange(B)[:, None]) & (np.arange(B)[:, None] != 2)
    group = Group(jnp.asarray(np.minimum(rows, B - 1), jnp.int32), jnp.asarray(ok),
                  jnp.asarray(from_B))
    for kw in (dict(num=4, length=5, ngram_min=1, ngram_max=4, window=None),
               dict(num=6, length=3, ngram_min=2, ngram_max=3, window=8)):
        got = lookup_candidates(jnp.asarray(seq), jnp.asarray(totals), group=group, **kw)
        for b in range(B):
            sibs = [(j, seq[s], int(totals[s]), int(from_B[s]))
                    for j, s in enumerate(rows[b], start=1) if ok[b, j - 1]]
            _check_row(seq[b], int(totals[b]), jax.tree.map(lambda x: x[b], got),
                       siblings=sibs, **kw)
    assert any(c[1] > 0 for c in reference_candidates(
        seq[1], 12, num=6, length=3, siblings=[(3, seq[2], 25, 2)]))


def test_history_candidates_equal_the_python_reference():
    """``history_BhW``: earlier texts searched too, after the row's own and its siblings'
    starts of the same n."""
    rng = np.random.default_rng(5)
    B, W, H = 4, 32, 3
    seq = rng.integers(0, 5, size=(B, W)).astype(np.int32)
    totals = np.array([4, 13, 20, 32], np.int32)
    hist = rng.integers(0, 5, size=(B, H, W)).astype(np.int32)
    ends = rng.integers(0, W + 1, size=(B, H))
    ends[0, 1] = 0                               # an empty history entry
    hist[np.arange(W)[None, None] >= ends[..., None]] = -1
    rows = np.array([[1], [0], [3], [2]])
    ok = np.array([[True], [True], [False], [True]])
    group = Group(jnp.asarray(rows, jnp.int32), jnp.asarray(ok), jnp.asarray([2, 2, 3, 3]))
    kw = dict(num=6, length=4, ngram_min=1, ngram_max=3, window=None)
    got = lookup_candidates(jnp.asarray(seq), jnp.asarray(totals), group=group,
                            history_BhW=jnp.asarray(hist), **kw)
    for b in range(B):
        sibs = [(1, seq[rows[b, 0]], int(totals[rows[b, 0]]), [2, 2, 3, 3][rows[b, 0]])] \
            if ok[b, 0] else []
        history = [(2 + h, hist[b, h, :ends[b, h]]) for h in range(H)]
        _check_row(seq[b], int(totals[b]), jax.tree.map(lambda x: x[b], got), siblings=sibs,
                   history=history, **kw)
    assert any(c[1] >= 2 for c in reference_candidates(seq[0], 4, siblings=(), history=[
        (2, hist[0, 0, :ends[0, 0]])], **kw))


def test_groups_are_blocks_of_rows_with_the_same_prompt():
    prompt = jnp.array([[5, 6, 7, 0], [5, 6, 7, 9], [5, 6, 0, 0], [5, 6, 7, 4], [5, 6, 7, 1]])
    g = group_of(prompt, jnp.array([3, 3, 2, 3, 3]), 2)   # blocks {0, 1}, {2, 3}, {4}
    np.testing.assert_array_equal(np.asarray(g.rows_Bg), [[0, 1], [0, 1], [2, 3], [2, 3],
                                                          [4, 4]])
    np.testing.assert_array_equal(np.asarray(g.ok_Bg), [[0, 1], [1, 0], [0, 0], [0, 0],
                                                        [0, 0]])
    np.testing.assert_array_equal(np.asarray(g.from_B), [3, 3, 2, 3, 3])


def test_history_packs_prompt_then_output():
    prompt = jnp.array([[5, 6, 7, 0], [1, 2, 0, 0]])
    out = jnp.array([[8, 9, -1], [3, -1, -1]])
    seq, total = history(prompt, jnp.array([3, 2]), out, jnp.array([2, 1]))
    np.testing.assert_array_equal(np.asarray(total), [5, 3])
    np.testing.assert_array_equal(np.asarray(seq[0, :5]), [5, 6, 7, 8, 9])
    np.testing.assert_array_equal(np.asarray(seq[1, :3]), [1, 2, 3])


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000))
def test_merged_trees_are_closed_sized_and_free_of_repeats(seed):
    rng = np.random.default_rng(seed)
    N, K, L, J, V = 6, 3, 4, 4, 5
    # a random drafter tree in pop order (parents first), scores non-increasing along paths
    parents, depths, scores, tokens = [], [], [], []
    for i in range(N):
        par = int(rng.integers(-1, i)) if i else -1
        while par >= 0 and depths[par] >= J - 1:
            par = parents[par]
        parents.append(par)
        depths.append(0 if par < 0 else depths[par] + 1)
        scores.append((scores[par] if par >= 0 else 0.0) - float(rng.uniform(0.05, 2.0)))
        used = {tokens[c] for c in range(i) if parents[c] == par}
        tokens.append(int(rng.choice([t for t in range(V) if t not in used] or [0])))
    valid = np.array([rng.random() > 0.1 for _ in range(N)])
    for i in range(N):   # invalid nodes take their subtrees with them
        if parents[i] >= 0 and not valid[parents[i]]:
            valid[i] = False
    cand = rng.integers(0, V, size=(K, L))
    cvalid = np.arange(L)[None] < rng.integers(0, L + 1, size=(K, 1))
    ngram = rng.integers(1, 5, size=K)
    logacc = jnp.asarray(log_accept_table(DEFAULT_ACCEPT, L, 4))
    cscore = jnp.where(jnp.asarray(cvalid), logacc[jnp.asarray(ngram)], -jnp.inf)
    out = merge_row(jnp.asarray(tokens), jnp.asarray(parents), jnp.asarray(depths),
                    jnp.asarray(valid), jnp.asarray(scores, jnp.float32), jnp.asarray(cand),
                    jnp.asarray(cvalid), cscore, budget=N, depth=J)
    tok, par, dep, ok, sc = (np.asarray(x) for x in out)
    assert len(tok) == N
    paths = set()
    for i in np.flatnonzero(ok):
        assert par[i] < i and (par[i] < 0 or ok[par[i]])           # parents first, kept
        assert dep[i] == (0 if par[i] < 0 else dep[par[i]] + 1)
        path, j = [], i
        while j >= 0:
            path.append(int(tok[j]))
            j = par[j]
        assert tuple(path) not in paths                               # no repeated path
        paths.add(tuple(path))
    assert (np.diff(sc[ok]) <= 1e-6).all()                           # pop order
    # a drafter node left out scores no better than any node kept (the budget went to better)
    for i in range(N):
        if not valid[i]:
            continue
        path, j = [], i
        while j >= 0:
            path.append(tokens[j])
            j = parents[j]
        if tuple(path) not in paths:
            assert ok.all() and scores[i] <= sc.min() + 1e-6


def _ar(tcfg, dcfg, params, prompt, n, **kw):
    return jdecode(params, prompt, config=DecodeConfig(target=tcfg, drafter=dcfg, method="ar",
                                                       max_new_tokens=n, **kw), **{})


@pytest.mark.parametrize("method,kw", [
    ("lookup", {}), ("lookup", dict(lookup=1, lookup_length=3)),
    ("dominotree", dict(lookup=4)), ("ddtree", dict(lookup=2)), ("domino", dict(lookup=3)),
    ("dflash", dict(lookup=2, lookup_ngram=(2, 3)))])
def test_identical_to_ar_at_temperature_zero(method, kw):
    tcfg, dcfg, params = tiny_pair(vocab=64, block_size=4)
    prompt = jnp.asarray(PROMPT)
    ref = _ar(tcfg, dcfg, params, prompt, 40)
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method=method, max_new_tokens=40, budget=6,
                       node_topk=3, top_m=8, **kw)
    out = jdecode(params if method != "lookup" else {"target": params["target"]}, prompt,
                  config=cfg)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    assert float(out.mean_tau()) > 1.0   # this target repeats itself: copies get accepted


@pytest.mark.parametrize("budget", [12, "auto"])
def test_lookup_paths_reach_deeper_than_the_drafters_block(budget):
    """In a tree, lookup paths of ``lookup_length`` > the drafter's ``J`` tokens: a round on a
    text that repeats itself commits more than ``J + 1`` tokens, identical to ``ar``."""
    tcfg, dcfg, params = tiny_pair(vocab=64, block_size=4)
    J = dcfg.num_draft_positions
    prompt = jnp.asarray(np.tile(PROMPT[:7], 4))
    ref = _ar(tcfg, dcfg, params, prompt, 40)
    kw = dict(auto_costs=CostTable(verify=((1, 1.0), (17, 1.2)), source="test"),
              auto_sizes=(0, 4, 12)) if budget == "auto" else {}
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method="dominotree", max_new_tokens=40,
                       budget=budget, node_topk=3, top_m=8, lookup=2, lookup_length=10, **kw)
    assert cfg.draft_depth == 10 > J and cfg.max_depth == 10
    out = jdecode(params, prompt, config=cfg)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    assert int(np.asarray(out.accept_lengths).max()) > J + 1
    chain = DecodeConfig(target=tcfg, drafter=dcfg, method="domino", lookup=2, lookup_length=10)
    assert chain.draft_depth == J   # a chain's lookup path stays within its rows


def test_batches_and_stop_ids_with_lookup():
    tcfg, dcfg, params = tiny_pair(vocab=64, block_size=4)
    prompts = np.stack([PROMPT, np.roll(PROMPT, 3), PROMPT[::-1].copy()])
    lengths = np.array([17, 12, 9])
    ref = jdecode(params, jnp.asarray(prompts), prompt_lengths=jnp.asarray(lengths),
                  config=DecodeConfig(target=tcfg, method="ar", max_new_tokens=30,
                                      stop_ids=(30,)))
    for method in ("lookup", "dominotree"):
        cfg = DecodeConfig(target=tcfg, drafter=dcfg, method=method, max_new_tokens=30,
                           budget=6, node_topk=3, top_m=8, lookup=3, stop_ids=(30,))
        out = jdecode(params, jnp.asarray(prompts), prompt_lengths=jnp.asarray(lengths),
                      config=cfg)
        np.testing.assert_array_equal(out.tokens, ref.tokens, err_msg=method)
        np.testing.assert_array_equal(out.num_tokens, ref.num_tokens, err_msg=method)


def test_group_lookup_is_identical_to_ar_and_reads_the_siblings():
    """``lookup_group=2`` on a batch of two prompts, each twice: the same tokens as ``ar`` at
    T = 0. (Greedy siblings are identical, so neither gets ahead of the other; the search over
    siblings is checked against its reference above, and rows drafting from each other at
    T = 1 in the distribution test below.) A group without lookup paths is refused."""
    tcfg, dcfg, params = tiny_pair(vocab=64, block_size=4)
    prompts = np.stack([PROMPT, PROMPT, np.roll(PROMPT, 3), np.roll(PROMPT, 3)])
    lengths = np.array([17, 17, 12, 12])
    ref = jdecode(params, jnp.asarray(prompts), prompt_lengths=jnp.asarray(lengths),
                  config=DecodeConfig(target=tcfg, method="ar", max_new_tokens=30))
    for method in ("lookup", "dominotree"):
        cfg = DecodeConfig(target=tcfg, drafter=dcfg, method=method, max_new_tokens=30,
                           budget=6, node_topk=3, top_m=8, lookup=3, lookup_group=2)
        out = jdecode(params, jnp.asarray(prompts), prompt_lengths=jnp.asarray(lengths),
                      config=cfg)
        np.testing.assert_array_equal(out.tokens, ref.tokens, err_msg=method)
    with pytest.raises(ValueError, match="lookup_group=2 searches more text for lookup paths"):
        DecodeConfig(target=tcfg, drafter=dcfg, method="dominotree", lookup_group=2)
    with pytest.raises(ValueError, match="lookup_group must be an int >= 0"):
        DecodeConfig(target=tcfg, method="lookup", lookup_group=True)


def test_history_lookup_copies_earlier_texts_and_equals_ar():
    """``lookup_history=2``: a row whose earlier text is the target's own continuation copies
    it (τ far above the rounds without), the tokens still ``ar``'s; bad histories refused."""
    tcfg, _, params = tiny_pair(vocab=64, block_size=4)
    prompts = jnp.asarray(np.stack([np.roll(PROMPT, 5), np.roll(PROMPT, 9)]))
    kw = dict(target=tcfg, max_new_tokens=24)
    ref = jdecode(params, prompts, config=DecodeConfig(method="ar", **kw))
    hist = np.full((2, 2, 24), -1, np.int32)
    hist[:, 1, :] = np.asarray(ref.tokens)          # slot 0 empty, slot 1 the continuation
    cfg = DecodeConfig(method="lookup", budget=6, lookup=2, lookup_length=6, lookup_history=2,
                       **kw)
    target = {"target": params["target"]}
    out = jdecode(target, prompts, config=cfg, lookup_history=jnp.asarray(hist))
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    without = jdecode(target, prompts, config=cfg)   # the same config, no texts given
    np.testing.assert_array_equal(without.tokens, ref.tokens)
    assert float(out.mean_tau()) > float(without.mean_tau()) + 1.0
    for bad, match in ((hist[:, :1], r"lookup_history must be an integer \[B=2, H=2, C\]"),
                       (np.full((2, 2, 99), -1), "1 to 41 tokens wide"),
                       (np.full((2, 2, 3), 64), "lookup_history outside the vocabulary")):
        with pytest.raises(ValueError, match=match):   # refused before anything compiles
            decode(target, prompts, config=cfg, lookup_history=jnp.asarray(bad))
    with pytest.raises(ValueError, match="need a config with lookup_history=H"):
        decode(target, prompts, config=cfg.replace(lookup_history=0),
               lookup_history=jnp.asarray(hist))


def test_auto_with_lookup_is_identical_to_ar_and_uses_lookup_only_rounds():
    tcfg, dcfg, params = tiny_pair(vocab=64, block_size=4)
    prompt = jnp.asarray(PROMPT)
    ref = _ar(tcfg, dcfg, params, prompt, 40)
    # the drafter never pays here (dear), lookup rounds cost only their verify
    dear = CostTable(verify=((1, 1.0), (17, 1.6)),
                     draft=tuple((m, 50.0) for m in ("dflash", "domino", "ddtree",
                                                      "dominotree")), source="test")
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method="dominotree", budget="auto",
                       node_topk=3, top_m=8, lookup=4, auto_costs=dear, max_new_tokens=40)
    out = jdecode(params, prompt, config=cfg)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    sizes = np.asarray(out.draft_sizes[0, :int(out.num_rounds[0])])
    assert (sizes > 0).any() and float(out.mean_tau()) > 1.0


@pytest.mark.parametrize("batch", [1, 3])
def test_lookup_without_a_drafter_takes_auto_sizes_and_equals_ar(batch):
    """``method="lookup", budget="auto"``: no drafter; each round verifies a plain step or the
    lookup paths at one of the auto sizes, identical to ``ar`` at T = 0 (batches, stop ids),
    plain steps where no path is worth its verify and lookup rounds where one is."""
    tcfg, _, params = tiny_pair(vocab=64, block_size=4)
    prompts = np.stack([PROMPT, np.roll(PROMPT, 3), PROMPT[::-1].copy()])[:batch]
    lengths = np.array([17, 12, 9])[:batch]
    kw = dict(target=tcfg, max_new_tokens=40, stop_ids=(61,))
    ref = jdecode(params, jnp.asarray(prompts), prompt_lengths=jnp.asarray(lengths),
                  config=DecodeConfig(method="ar", **kw))
    cheap = CostTable(verify=((1, 1.0), (17, 1.2)), source="test")
    cfg = DecodeConfig(method="lookup", budget="auto", auto_costs=cheap, lookup=2,
                       lookup_length=6, **kw)
    assert cfg.is_auto and cfg.size_options == (0, 2, 4, 8, 16) and cfg.num_draft_nodes == 16
    out = jdecode({"target": params["target"]}, jnp.asarray(prompts),
                  prompt_lengths=jnp.asarray(lengths), config=cfg)
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    np.testing.assert_array_equal(out.num_tokens, ref.num_tokens)
    sizes = np.asarray(out.draft_sizes[0, :int(out.num_rounds[0])])
    assert (sizes > 0).any() and float(out.mean_tau()) > 1.0
    # dear verifies: no lookup path is worth one, every round is a plain step
    dear = CostTable(verify=((1, 1.0), (3, 50.0)), source="test")
    out = jdecode({"target": params["target"]}, jnp.asarray(prompts),
                  prompt_lengths=jnp.asarray(lengths), config=cfg.replace(auto_costs=dear))
    np.testing.assert_array_equal(out.tokens, ref.tokens)
    assert int(np.asarray(out.draft_sizes).max()) == 0


@pytest.mark.parametrize("method,budget,group,hist", [
    ("lookup", 6, 0, 0), ("lookup", "auto", 0, 0), ("dominotree", 6, 0, 0), ("lookup", 6, 4, 2),
    ("dominotree", "auto", 4, 2)])
def test_sampling_with_lookup_is_the_targets_distribution(method, budget, group, hist):
    """``group``/``hist``: rows draft from their siblings' text and from earlier texts too
    (``lookup_group``, ``lookup_history``)."""
    runs = 20000
    tcfg, dcfg, params, prompt, exact = sampling_case()
    # a prompt that repeats so lookup finds matches from the first round
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method=method, max_new_tokens=3,
                       temperature=1.0, budget=budget, node_topk=2, top_m=0, lookup=3,
                       lookup_group=group, lookup_history=hist,
                       auto_costs=CostTable(verify=((1, 1.0), (17, 1.2)), source="test"))
    history = None
    if hist:   # earlier texts: the prompt's own tokens and random ones
        rng = np.random.default_rng(0)
        history = np.concatenate([np.tile(np.tile(np.asarray(prompt), 2)[:6], (runs, 1, 1)),
                                  rng.integers(0, tcfg.vocab_size, (runs, 1, 6))], axis=1)
    out = jit_decode(SAMPLING_XLA)(params, jnp.tile(prompt, (runs, 1)), config=cfg,
                                   key=jax.random.key(11), lookup_history=history)
    toks = np.asarray(out.tokens)
    assert first_tokens_chi_square_p(toks, exact, tcfg.vocab_size) > 1e-3
    assert int(np.asarray(out.accept_lengths).max()) > 1


def test_bad_settings_are_refused_by_name():
    tcfg, dcfg, _ = tiny_pair()
    base = dict(target=tcfg, drafter=dcfg, method="dominotree")
    for kw, match in ((dict(lookup=-1), "lookup must be an int >= 0"),
                      (dict(lookup=2, lookup_length=0), "lookup_length must be an int >= 1"),
                      (dict(lookup=2, lookup_window=0), "lookup_window must be an int >= 1"),
                      (dict(lookup=2, lookup_ngram=(3, 2)), "lookup_ngram must be"),
                      (dict(lookup=2, lookup_accept=((0.5, 1.5),)), "probabilities in"),
                      (dict(method="ar", lookup=2), "lookup drafting needs a drafting method"),
                      (dict(method="lookup", drafter=None, return_features=True),
                       "return_features needs a drafter config")):
        with pytest.raises(ValueError, match=match):
            DecodeConfig(**{**base, **kw})
    assert DecodeConfig(target=tcfg, method="lookup").lookup_paths == 4
    # default path lengths: 16 without a drafter, 8 beside one; a given length stays
    assert DecodeConfig(target=tcfg, method="lookup").lookup_path_length == 16
    assert DecodeConfig(**base, lookup=2).lookup_path_length == 8
    assert DecodeConfig(target=tcfg, method="lookup", lookup_length=5).lookup_path_length == 5


def test_an_auto_round_searches_the_lookup_paths_once(monkeypatch):
    """``lookup=K`` beside a drafter with ``budget="auto"``: the round finds the lookup paths
    before its draft decision, and the drafter's merged tree reuses them (one search per
    round, counted while the decode is traced; it was two)."""
    import functools
    from dominotree_jax.decoding import lookup as lookup_module
    from dominotree_jax.decoding.auto_size import AutoPolicy
    from dominotree_jax.decoding.decode import decode
    searches = []
    search = lookup_module.lookup_candidates

    def counted(*args, **kw):
        searches.append(1)
        return search(*args, **kw)

    monkeypatch.setattr(lookup_module, "lookup_candidates", counted)
    tcfg, dcfg, params = tiny_pair(vocab=64, block_size=4)
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method="dominotree", budget="auto",
                       node_topk=3, top_m=8, lookup=4, max_new_tokens=8)
    policy = AutoPolicy(cfg, 1)
    assert policy.can_pay and policy.lookup_can_pay   # both sources in the round
    jax.make_jaxpr(functools.partial(decode, config=cfg))(params, jnp.asarray(PROMPT))
    assert len(searches) == 1
