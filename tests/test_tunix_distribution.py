"""What ``DominoTreeRollout.generate`` samples is the target's own distribution: chi-square of
the first three tokens against the exact joint (every prefix enumerated), at temperature 0.7
with top-p 0.9 and top-k 20, with a fixed tree budget and with ``budget="auto"``, two prompts
of different lengths interleaved in one batch (each checked against its own exact joint).

The exact joint applies temperature, top-k and top-p with numpy, independently of
``dominotree_jax.sampling``."""

from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np
import pytest

import dominotree_jax as dj
from decode_helpers import SAMPLING_XLA
from dominotree_jax.api import _plain_forward
from dominotree_jax.decoding.costs import CostTable
from dominotree_jax.rollout import DominoTreeRollout, RolloutConfig
from spec_fixtures import first_tokens_chi_square_p, tiny_pair

V = 24
TEMPERATURE, TOP_P, TOP_K = 0.7, 0.9, 20
PROMPTS = ([1, 4, 2], [5, 3, 9, 9, 1, 7])   # lengths 3 and 6 in one batch
RUNS = 5000                                  # per prompt
# a cost table under which drafting pays, so budget="auto" really drafts (as test_auto_budget)
CHEAP = CostTable(verify=((1, 1.0), (17, 1.6)),
                  draft=tuple((m, 0.1) for m in ("dflash", "domino", "ddtree", "dominotree")),
                  source="test")


def filtered_probs(logits_V, temperature, top_k, top_p):
    """numpy: softmax(logits / T) restricted to the top-k, then to the smallest prefix (by
    probability) whose mass before the last kept token is < top_p; renormalised."""
    x = np.asarray(logits_V, np.float64) / temperature
    order = np.argsort(-x, kind="stable")
    keep = np.zeros(len(x), bool)
    keep[order[:top_k]] = True
    p = np.exp(x - x.max()) * keep
    p /= p.sum()
    sorted_p = p[order]
    before = np.cumsum(sorted_p) - sorted_p
    keep_sorted = (before < top_p) & keep[order]
    final = np.zeros(len(x), bool)
    final[order[keep_sorted]] = True
    q = p * final
    return q / q.sum()


def exact_joint(tcfg, params, prompt, n_tok=3):
    """P(first n_tok tokens) under temperature/top-k/top-p sampling, every prefix enumerated."""
    seqs = np.array(list(itertools.product(range(V), repeat=n_tok - 1)))
    toks = np.concatenate([np.tile(prompt, (len(seqs), 1)), seqs], axis=1)
    logits = np.asarray(_plain_forward(params["target"], jnp.asarray(toks), tcfg))
    P = len(prompt)
    joint = np.zeros((V,) * n_tok)
    for row, s in enumerate(seqs):
        p = 1.0
        for j in range(n_tok - 1):
            p *= filtered_probs(logits[row, P - 1 + j], TEMPERATURE, TOP_K, TOP_P)[s[j]]
        if p > 0:
            joint[tuple(s)] = p * filtered_probs(logits[row, P + n_tok - 2], TEMPERATURE,
                                                 TOP_K, TOP_P)
    return joint


@pytest.fixture(scope="module")
def setup():
    tcfg, dcfg, params = tiny_pair(vocab=V, block_size=4, seed=3)
    joints = [exact_joint(tcfg, params, np.array(p)) for p in PROMPTS]
    return tcfg, dcfg, params, joints


def test_the_filters_bind(setup):
    """top-k / top-p cut tokens off this target at T=0.7 (else the test would not test them)."""
    tcfg, _, params, joints = setup
    for prompt, joint in zip(PROMPTS, joints):
        logits = np.asarray(_plain_forward(params["target"], jnp.asarray([prompt]), tcfg))[0, -1]
        full = np.exp(logits / TEMPERATURE - np.max(logits / TEMPERATURE))
        assert (filtered_probs(logits, TEMPERATURE, TOP_K, TOP_P) == 0).sum() > TOP_K // 4
        assert np.isclose(joint.sum(), 1.0) and (full > 0).all()
    assert (filtered_probs(np.arange(V, dtype=float), 1.0, 3, 1.0) > 0).sum() == 3


@pytest.mark.parametrize("budget", [6, "auto"])
def test_generate_samples_the_filtered_target_distribution(setup, budget):
    tcfg, dcfg, params, joints = setup
    opts = dict(auto_sizes=(0, 1, 2, 6), auto_costs=CHEAP) if budget == "auto" else {}
    eng = DominoTreeRollout(rollout_actor=dj.Target(tcfg, params["target"]),
                            drafter_config=dcfg, drafter_params=params["drafter"],
                            budget=budget, node_topk=2, top_m=0, compiler_options=SAMPLING_XLA,
                            **opts)
    rc = RolloutConfig(max_tokens_to_generate=3, temperature=TEMPERATURE, top_p=TOP_P,
                       top_k=TOP_K, max_prompt_length=8, eos_tokens=None, seed=11)
    batch = [PROMPTS[i % 2] for i in range(2 * RUNS)]   # interleaved lengths 3 and 6
    out = eng.generate(batch, rc)
    toks = np.stack([t[:3] for t in out.tokens])
    assert toks.shape == (2 * RUNS, 3) and (toks >= 0).all()
    sizes = np.asarray(eng.last.out.draft_sizes)
    assert (sizes > 0).any()                        # rounds really drafted
    if budget == "auto":
        assert set(sizes[sizes >= 0].tolist()) <= {0, 1, 2, 6}   # sizes of its own table
    for i, joint in enumerate(joints):
        p = first_tokens_chi_square_p(toks[i::2], joint, V)
        assert p > 1e-3, (budget, i, p)
    # the other prompt's joint is rejected: the test can tell the two rows apart
    assert first_tokens_chi_square_p(toks[0::2], joints[1], V) < 1e-6
