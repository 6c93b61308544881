"""The JAX tree builder against the NumPy heap reference (docs/algorithm.md §4).

Every case requires the same (token, depth, parent) sequence and node count, and scores equal
to float32 rounding (XLA and NumPy differ in summation order and exp/log/tanh kernels; see
``dominotree_jax/tree/reference.py``): ``|diff| <= 1e-6 * (1 + |score|)`` plus, for each
conditional (DominoTree-corrected) depth on the node's path, ``2 * eps32 * (1 + max|logit|)``,
because a computed logit ``c = base + W2·h`` is itself only resolved to ~1 ulp of its
magnitude (|logits| ~ 20 give ~2e-6 per depth). Where all scores are exact (the "peaked" family:
integer logits, every log-sum-exp exactly 0) the scores must be bit-identical.

Data families (chosen so that every exact tie is *structural*, i.e. computed by the same
operations on the same operands in both implementations, so both must resolve it by the tie
rules — earliest push first, lower token id first — and no comparison hinges on rounding):
- normal:    continuous random logits (no ties);
- palette:   each row draws its logits from its own few values (sibling ties, and cousin ties
             through equal parent scores); for dominotree W2 is zero half of the time so the
             conditional children keep the ties;
- duprows:   rows 0 and 1 identical (paths (a, b) and (b, a) tie exactly);
- peaked:    integer logits, one per row dominant by >= 100: exact arithmetic, many score ties;
- duptokens: two tokens with identical logits, embedding and W2 rows, bumped to the top
             (identical subtrees for dominotree).

Shapes and static settings come from a small fixed set of configs so that each compiles once.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dominotree_jax.markov_head import MarkovHeadWeights
from dominotree_jax.selector_head import SelectorWeights
from dominotree_jax.tree import Tree, build_tree, build_tree_from_head
from dominotree_jax.tree.reference import build_tree_numpy


class Config(NamedTuple):
    method: str
    J: int
    V: int
    budget: int
    node_topk: int
    top_m: int = 0
    prefix_len: int = 1
    H: int = 16
    G: int = 8
    E: int = 12

    def statics(self):
        return dict(method=self.method, budget=self.budget, node_topk=self.node_topk,
                    top_m=self.top_m, prefix_len=self.prefix_len)


CONFIGS = {
    "dd_basic": Config("ddtree", J=4, V=64, budget=16, node_topk=4),
    "dd_exhaust": Config("ddtree", J=2, V=32, budget=16, node_topk=2),
    "dd_k16": Config("ddtree", J=5, V=48, budget=24, node_topk=16),
    "dd_k1_chain": Config("ddtree", J=8, V=40, budget=12, node_topk=1),
    "dt_m16_p1": Config("dominotree", J=4, V=64, budget=16, node_topk=4, top_m=16, prefix_len=1),
    "dt_full_p0": Config("dominotree", J=4, V=48, budget=16, node_topk=4, top_m=0, prefix_len=0),
    "dt_full_p1": Config("dominotree", J=6, V=80, budget=16, node_topk=8, top_m=0, prefix_len=1),
    "dt_m8_p2": Config("dominotree", J=5, V=64, budget=16, node_topk=3, top_m=8, prefix_len=2),
    "dt_p_ge_J": Config("dominotree", J=3, V=32, budget=16, node_topk=4, top_m=8, prefix_len=3),
    "dt_m4_p0_exhaust": Config("dominotree", J=2, V=32, budget=16, node_topk=2, top_m=4,
                               prefix_len=0),
    "dt_m_eq_k": Config("dominotree", J=4, V=32, budget=16, node_topk=4, top_m=4, prefix_len=1),
    "dt_k16": Config("dominotree", J=4, V=96, budget=20, node_topk=16, top_m=32, prefix_len=1),
    "dt_default": Config("dominotree", J=8, V=256, budget=16, node_topk=8, top_m=64, prefix_len=1,
                         H=32, G=16, E=16),
    # DSpark's Markov head (E: its rank r): every depth conditioned on the parent's token
    "ds_m16": Config("dsparktree", J=4, V=64, budget=16, node_topk=4, top_m=16),
    "ds_full": Config("dsparktree", J=5, V=48, budget=16, node_topk=3, top_m=0),
    "ds_m4_exhaust": Config("dsparktree", J=2, V=32, budget=16, node_topk=2, top_m=4),
    "ds_default": Config("dsparktree", J=7, V=256, budget=16, node_topk=8, top_m=64, E=16),
    # DFlash2's path selector (top_m: its candidates per depth; E: its rank)
    "d2_k16": Config("dflash2tree", J=7, V=64, budget=16, node_topk=4, top_m=16),
    "d2_exhaust": Config("dflash2tree", J=2, V=32, budget=16, node_topk=2, top_m=4),
}
FAMILIES = ("normal", "palette", "duprows", "peaked", "duptokens")


def make_case(cfg: Config, seed: int, family: str) -> dict:
    """Random round inputs for ``cfg`` (float32 NumPy arrays) from ``seed`` and ``family``."""
    rng = np.random.default_rng(seed)
    J, V, H, G, E = cfg.J, cfg.V, cfg.H, cfg.G, cfg.E
    scale = rng.choice([0.5, 2.0, 6.0])
    base = rng.normal(size=(J, V)) * scale
    hidden = rng.normal(size=(J, H))
    embed = rng.normal(size=(V, H))
    w2 = rng.normal(size=(V, E)) * rng.choice([0.3, 1.0])
    mrng = np.random.default_rng(seed + 7919)  # the Markov head (dsparktree; E: its rank)
    m_w1 = mrng.normal(size=(V, E))
    m_w2 = mrng.normal(size=(V, E)) * mrng.choice([0.3, 1.0])
    if family == "palette":
        for d in range(J):
            palette = rng.normal(size=rng.integers(2, 6)) * scale
            base[d] = palette[rng.integers(0, len(palette), size=V)]
        if rng.random() < 0.5:
            w2[:] = m_w2[:] = 0.0
    elif family == "duprows" and J >= 2:
        base[1], hidden[1] = base[0], hidden[0]
    elif family == "peaked":
        base = -110.0 - rng.integers(0, 4, size=(J, V)).astype(np.float64)
        base[np.arange(J), rng.integers(0, V, size=J)] = 0.0
        base += rng.integers(-5, 6, size=(J, 1))
        w2[:] = m_w2[:] = 0.0
    elif family == "duptokens":
        a, b = np.sort(rng.choice(V, size=2, replace=False))
        base[:, a] = base.max(axis=1) + rng.uniform(0.0, 1.0, size=J)  # per-row bump: no
        # accidental cross-depth ties such as lp_0[a] - lp_0[x] == lp_1[a] - lp_1[y]
        base[:, b], embed[b], w2[b] = base[:, a], embed[a], w2[a]
        m_w1[b], m_w2[b] = m_w1[a], m_w2[a]
    f32 = np.float32
    markov = ({"markov": (m_w1.astype(f32), m_w2.astype(f32))}
              if cfg.method == "dsparktree" else
              {"selector": (m_w1.astype(f32), m_w2.astype(f32),
                            mrng.normal(size=(E, H)).astype(f32) * 0.5)}
              if cfg.method == "dflash2tree" else {})
    return dict(**markov,
        base_logits=base.astype(f32), hidden=hidden.astype(f32),
        root_token=np.int32(rng.integers(0, V)), embed=embed.astype(f32),
        gru_w_ih=(rng.normal(size=(3 * G, H)) * 0.4).astype(f32),
        gru_w_hh=(rng.normal(size=(3 * G, G)) * 0.4).astype(f32),
        proj_w1=(rng.normal(size=(E, H + G)) * 0.4).astype(f32), proj_w2=w2.astype(f32),
    )


def check_invariants(tree: Tree, J: int) -> None:
    n = int(tree.num_nodes)
    valid = np.asarray(tree.depths) >= 0
    assert valid[:n].all() and not valid[n:].any()
    assert (np.asarray(tree.tokens)[n:] == 0).all() and (np.asarray(tree.parents)[n:] == -1).all()
    assert np.isneginf(np.asarray(tree.scores)[n:]).all()
    for i in range(n):
        p, d = int(tree.parents[i]), int(tree.depths[i])
        assert d < J and p < i
        assert d == (0 if p < 0 else int(tree.depths[p]) + 1)


EPS32 = float(np.finfo(np.float32).eps)


def assert_same_tree(got: Tree, ref: Tree, *, exact_scores: bool = False, cond_from: int = 10**9,
                     logit_scale: float = 0.0) -> None:
    """Same structure; scores to rounding (see module docstring). Depths ``>= cond_from`` use
    computed (corrected) logits of magnitude up to ``logit_scale``."""
    got = Tree(*(np.asarray(x) for x in got))
    for field in ("tokens", "parents", "depths", "num_nodes"):
        np.testing.assert_array_equal(getattr(got, field), getattr(ref, field), err_msg=field)
    valid = ref.depths >= 0
    assert np.isneginf(got.scores[~valid]).all()
    if exact_scores:
        np.testing.assert_array_equal(got.scores, ref.scores)
    n_cond = np.maximum(0, ref.depths[valid] + 1 - cond_from)
    tol = 1e-6 * (1 + np.abs(ref.scores[valid])) + n_cond * 2 * EPS32 * (1 + logit_scale)
    diff = np.abs(got.scores[valid] - ref.scores[valid])
    assert (diff <= tol).all(), f"score diffs {diff} exceed {tol}"


def run_case(cfg: Config, seed: int, family: str) -> Tree:
    case = make_case(cfg, seed, family)
    markov = case.pop("markov", None)
    selector = case.pop("selector", None)
    if cfg.method == "dflash2tree":
        got = build_tree_from_head(case["base_logits"], case["hidden"], case["root_token"],
                                   SelectorWeights(*selector), **cfg.statics(),
                                   use_pallas=False)
        ref = build_tree_numpy(**case, **cfg.statics(), selector=selector)
    elif cfg.method == "dsparktree":
        got = build_tree_from_head(case["base_logits"], case["hidden"], case["root_token"],
                                   MarkovHeadWeights(*markov), **cfg.statics(), use_pallas=False)
        ref = build_tree_numpy(**case, **cfg.statics(), markov=markov)
    else:
        got = build_tree(**case, **cfg.statics(), use_pallas=False)
        ref = build_tree_numpy(**case, **cfg.statics())
    cond_from = {"dominotree": cfg.prefix_len, "dsparktree": 0,
                 "dflash2tree": 0}.get(cfg.method, 10**9)
    assert_same_tree(got, ref, exact_scores=family == "peaked", cond_from=cond_from,
                     logit_scale=float(np.abs(case["base_logits"]).max()))
    check_invariants(ref, cfg.J)
    return ref


# --------------------------------------------------------------------------- fixed seeds

@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_reference_fixed(name, family, seed):
    run_case(CONFIGS[name], 1000 * seed + 17, family)


# --------------------------------------------------------------------------- hypothesis

@settings(max_examples=700, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(CONFIGS)), family=st.sampled_from(FAMILIES),
       seed=st.integers(0, 2**32 - 1))
def test_matches_reference_hypothesis(name, family, seed):
    run_case(CONFIGS[name], seed, family)


def test_tie_families_produce_ties():
    """Sanity check of the test data: the tie families really tie scores inside the trees."""
    tied = 0
    for seed in range(10):
        for family in ("palette", "peaked", "duprows", "duptokens"):
            ref = run_case(CONFIGS["dd_basic"], seed, family)
            scores = ref.scores[: ref.num_nodes]
            tied += len(scores) - len(np.unique(scores))
    assert tied >= 40


# --------------------------------------------------------------------------- explicit trees

def test_uniform_ties_and_exhaustion_explicit():
    """Uniform logits: all ties. Lower token id first, earliest push first, 6 reachable < 8."""
    case = make_case(CONFIGS["dd_basic"], 0, "normal")
    case["base_logits"] = np.zeros((2, 4), np.float32)
    tree = build_tree(case["base_logits"], None, 0, None, None, None, None, None,
                      method="ddtree", budget=8, node_topk=2, top_m=0, prefix_len=1)
    np.testing.assert_array_equal(tree.tokens, [0, 1, 0, 1, 0, 1, 0, 0])
    np.testing.assert_array_equal(tree.parents, [-1, -1, 0, 0, 1, 1, -1, -1])
    np.testing.assert_array_equal(tree.depths, [0, 0, 1, 1, 1, 1, -1, -1])
    np.testing.assert_array_equal(tree.valid, [True] * 6 + [False] * 2)
    assert int(tree.num_nodes) == 6
    lp = np.float32(-np.log(np.float32(4)))
    np.testing.assert_allclose(tree.scores[:6], [lp, lp] + [2 * lp] * 4, rtol=1e-6)
    assert np.isneginf(tree.scores[6:]).all()


def test_budget_larger_than_tree():
    cfg = CONFIGS["dd_exhaust"]  # J=2, k=2: 2 + 4 = 6 reachable nodes, budget 16
    ref = run_case(cfg, 3, "normal")
    assert int(ref.num_nodes) == 6


# --------------------------------------------------------------------------- large vocab

@pytest.mark.parametrize("method", ["ddtree", "dominotree", "dsparktree"])
def test_qwen3_vocab(method):
    cfg = Config(method, J=4, V=151936, budget=16, node_topk=8, top_m=64, prefix_len=1,
                 H=32, G=16, E=16)
    for seed in (5, 6):
        run_case(cfg, seed, "normal")


# --------------------------------------------------------------------------- vmap, weights

def test_vmap_matches_per_example():
    cfg = CONFIGS["dt_default"]
    cases = [make_case(cfg, seed, "normal") for seed in range(4)]
    batch = {key: np.stack([c[key] for c in cases]) for key in cases[0]}
    fn = jax.jit(jax.vmap(functools.partial(build_tree, **cfg.statics(), use_pallas=False)))
    got = fn(**batch)
    assert got.tokens.shape == (4, cfg.budget) and got.num_nodes.shape == (4,)
    for b, case in enumerate(cases):
        one = build_tree(**case, **cfg.statics(), use_pallas=False)
        scale = float(np.abs(case["base_logits"]).max())
        assert_same_tree(jax.tree.map(lambda x: x[b], got), Tree(*(np.asarray(x) for x in one)),
                         cond_from=cfg.prefix_len, logit_scale=scale)


def test_ddtree_ignores_gru_weights():
    cfg = CONFIGS["dd_basic"]
    case = make_case(cfg, 9, "normal")
    with_w = build_tree(**case, **cfg.statics())
    other = make_case(cfg, 10, "normal")
    other["base_logits"], other["root_token"] = case["base_logits"], case["root_token"]
    with_other_w = build_tree(**other, **cfg.statics())
    without = build_tree(case["base_logits"], None, case["root_token"], None, None, None, None,
                         None, **cfg.statics())
    for a, b in ((with_w, without), (with_other_w, without)):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_dominotree_prefix_ge_K_equals_ddtree():
    cfg = CONFIGS["dt_p_ge_J"]
    case = make_case(cfg, 11, "normal")
    dt = build_tree(**case, **cfg.statics())
    dd = build_tree(**case, **{**cfg.statics(), "method": "ddtree", "top_m": 0})
    for x, y in zip(dt, dd):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_dominotree_conditions_on_path():
    """With P=1 the depth-1 children depend on the parent's token (per-path correction)."""
    cfg = CONFIGS["dt_default"]
    case = make_case(cfg, 12, "normal")
    case["proj_w2"] = case["proj_w2"] * 8  # strong correction
    tree = build_tree(**case, **cfg.statics())
    tok, par, dep = (np.asarray(x) for x in (tree.tokens, tree.parents, tree.depths))
    kids = {}
    for i in np.flatnonzero(dep == 1):
        kids.setdefault(int(par[i]), []).append(int(tok[i]))
    assert len(kids) >= 2
    firsts = {tuple(v[:1]) for v in kids.values()}
    dd = build_tree(**case, **{**cfg.statics(), "method": "ddtree", "top_m": 0})
    assert len(firsts) >= 2 or not np.array_equal(np.asarray(dd.tokens), tok)


def test_gather_rows_is_take_in_every_precision():
    from dominotree_jax.domino_head import gather_rows
    ids = np.array([[3, 0], [7, 3]], np.int32)
    for dtype in (np.float32, jax.numpy.bfloat16, np.float16):
        table = jax.numpy.asarray(np.random.default_rng(0).standard_normal((9, 5)), dtype)
        rows = gather_rows(table, ids)
        assert rows.dtype == table.dtype
        np.testing.assert_array_equal(np.asarray(rows, np.float32),
                                      np.asarray(jax.numpy.take(table, ids, axis=0), np.float32))


def test_bf16_builder_never_converts_the_whole_embedding():
    """XLA:CPU runs a bf16 gather by converting its whole operand to float32 first; the builder's
    pops gather embedding rows, so with a plain gather every pop converted the [V, H] table
    (27 of a bf16 build's 31 ms at SmolLM2's sizes). ``gather_rows`` gathers the bits."""
    jnp = jax.numpy
    V, H, G, E, J = 512, 48, 16, 8, 4
    rng = np.random.default_rng(1)

    def w(*shape):
        return jnp.asarray(rng.standard_normal(shape) * 0.1, jnp.bfloat16)

    fn = jax.jit(functools.partial(build_tree, method="dominotree", budget=6, node_topk=3,
                                   top_m=16, prefix_len=1))
    args = (jnp.asarray(rng.standard_normal((J, V)), jnp.float32),
            jnp.asarray(rng.standard_normal((J, H)), jnp.float32), jnp.int32(5),
            w(V, H), w(3 * G, H), w(3 * G, G), w(E, H + G), w(V, E))
    hlo = fn.lower(*args).compile().as_text()
    assert f"f32[{V},{H}]" not in hlo
    assert int(fn(*args).num_nodes) == 6
