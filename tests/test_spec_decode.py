"""Speculative decoding is lossless: every method equals AR at temperature 0, an oracle drafter
reaches the maximum tau, a wrong drafter gets tau = 1, and sampling matches AR's distribution."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dominotree_jax import DecodeConfig, decode
from decode_helpers import FAST_XLA, SAMPLING_XLA, fresh_jit_decode, jit_decode
from spec_fixtures import first_tokens_chi_square_p, sampling_case, scripted_drafter, tiny_pair

METHODS = ("dflash", "domino", "ddtree", "dominotree")
jdecode = jit_decode()
sampling_decode = jit_decode(SAMPLING_XLA)


def _cfg(tcfg, dcfg, method, **kw):
    kw.setdefault("budget", 6)
    kw.setdefault("node_topk", 3)
    kw.setdefault("top_m", 16)
    return DecodeConfig(target=tcfg, drafter=dcfg, method=method, **kw)


@pytest.mark.parametrize("shift_label,block_size", [(True, 4), (False, 5), (True, 8)])
def test_greedy_is_token_identical_to_ar(shift_label, block_size):
    tcfg, dcfg, params = tiny_pair(block_size=block_size, shift_label=shift_label)
    prompt = jnp.array([3, 17, 5, 9, 33, 2, 8])
    ref = jdecode(params, prompt, config=_cfg(tcfg, dcfg, "ar", max_new_tokens=40))
    assert int(ref.num_tokens[0]) == 40
    for method in METHODS:
        out = jdecode(params, prompt, config=_cfg(tcfg, dcfg, method, max_new_tokens=40))
        np.testing.assert_array_equal(out.tokens, ref.tokens, err_msg=method)
        taus = np.asarray(out.accept_lengths[0, :int(out.num_rounds[0])])
        assert taus.min() >= 1 and 1 + taus.sum() >= 40


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("shift_label", [True, False])
def test_oracle_drafter_reaches_max_tau_and_wrong_drafter_gets_one(method, shift_label):
    tcfg, dcfg, params = tiny_pair(block_size=4, shift_label=shift_label)
    prompt = jnp.array([3, 17, 5, 9, 33])
    n = 30
    ref = jdecode(params, prompt, config=_cfg(tcfg, dcfg, "ar", max_new_tokens=n + 10))
    seq = np.concatenate([np.asarray(prompt), np.asarray(ref.tokens[0])])
    cfg = _cfg(tcfg, dcfg, method, max_new_tokens=n, budget=8, node_topk=2)
    max_tau = cfg.max_depth + 1
    # a fresh jit per drafter (each patches Drafter.draft): traces are never shared
    with scripted_drafter(seq):
        out = fresh_jit_decode()(params, prompt[None], None, config=cfg)
    np.testing.assert_array_equal(out.tokens[0], ref.tokens[0, :n])
    taus = np.asarray(out.accept_lengths[0, :int(out.num_rounds[0])])
    # every round accepts the whole draft; the last one commits only what max_new_tokens allows
    assert (taus[:-1] == max_tau).all() and 1 <= taus[-1] <= max_tau, (method, taus, max_tau)
    assert taus.sum() == n - 1  # accept_lengths count committed tokens (+1 from the prefill)
    with scripted_drafter(seq, wrong=True):
        out = fresh_jit_decode()(params, prompt[None], None, config=cfg)
    np.testing.assert_array_equal(out.tokens[0], ref.tokens[0, :n])
    taus = np.asarray(out.accept_lengths[0, :int(out.num_rounds[0])])
    assert (taus == 1).all() and len(taus) == n - 1


@pytest.mark.parametrize("method", ["ar", "dflash", "domino", "dominotree"])
def test_sampling_matches_the_target_distribution(method):
    runs = 20000
    tcfg, dcfg, params, prompt, exact = sampling_case()
    cfg = _cfg(tcfg, dcfg, method, max_new_tokens=3, temperature=1.0, budget=6, node_topk=2,
               top_m=0)
    out = sampling_decode(params, jnp.tile(prompt, (runs, 1)), config=cfg,
                          key=jax.random.key(7))
    toks = np.asarray(out.tokens)
    assert (toks >= 0).all()
    p = first_tokens_chi_square_p(toks, exact, tcfg.vocab_size)
    assert p > 1e-3, (method, p)
    if method != "ar":  # the drafter was actually used: some rounds accepted drafts
        assert int(np.asarray(out.accept_lengths).max()) > 1


def test_bad_inputs_are_refused_before_compute():
    tcfg, dcfg, params = tiny_pair()
    cfg = _cfg(tcfg, dcfg, "dominotree", max_new_tokens=8)
    with pytest.raises(ValueError, match="empty prompt"):
        decode(params, jnp.zeros((1, 0), jnp.int32), config=cfg)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        decode(params, jnp.array([1, 2, 64]), config=cfg)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        decode(params, jnp.array([1, -2, 3]), config=cfg)
    with pytest.raises(ValueError, match="max_len is 12"):
        decode(params, jnp.array([1, 2, 3]), config=cfg.replace(max_len=12))
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        cfg.replace(temperature=-1.0)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        cfg.replace(top_p=0.0)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\]"):
        cfg.replace(top_p=1.5)
    import dataclasses
    with pytest.raises(ValueError, match="block_size must be >= 2"):
        cfg.replace(drafter=dataclasses.replace(dcfg, block_size=1))
    with pytest.raises(ValueError, match="needs a Domino drafter"):
        _, plain, _ = tiny_pair(domino=False)
        cfg.replace(drafter=plain)
    with pytest.raises(ValueError, match="unknown method"):
        cfg.replace(method="medusa")
    with pytest.raises(ValueError, match="needs an explicit PRNG key"):
        decode(params, jnp.array([1, 2]), config=cfg.replace(temperature=0.5))
    with pytest.raises(ValueError, match="prompt_lengths"):
        decode(params, jnp.array([[1, 2]]), config=cfg, prompt_lengths=[3])


def test_jit_compiles_once_per_config():
    tcfg, dcfg, params = tiny_pair()
    cfg = _cfg(tcfg, dcfg, "dominotree", max_new_tokens=6)
    traces = []

    def counted(params, prompt, *, config):
        traces.append(config)
        return decode(params, prompt, config=config)

    f = jax.jit(counted, static_argnames="config", compiler_options=FAST_XLA)
    f(params, jnp.array([1, 2, 3]), config=cfg)
    params2 = jax.tree.map(lambda x: x * 1.01, params)  # fresh values, same shapes
    f(params2, jnp.array([4, 5, 6]), config=cfg)
    f(params2, jnp.array([4, 5, 6]), config=_cfg(tcfg, dcfg, "dominotree", max_new_tokens=6))
    assert len(traces) == 1
    f(params2, jnp.array([4, 5, 6]), config=cfg.replace(max_new_tokens=7))
    assert len(traces) == 2


def test_plain_dflash_drafter_serves_dflash_and_ddtree():
    tcfg, dcfg, params = tiny_pair(domino=False, shift_label=False, block_size=6)
    assert "prefix_gru.weight_ih_l0" not in str(jax.tree_util.tree_structure(params["drafter"]))
    prompt = jnp.array([9, 8, 7, 6])
    ref = jdecode(params, prompt, config=_cfg(tcfg, dcfg, "ar", max_new_tokens=24))
    for method in ("dflash", "ddtree"):
        out = jdecode(params, prompt, config=_cfg(tcfg, dcfg, method, max_new_tokens=24))
        np.testing.assert_array_equal(out.tokens, ref.tokens, err_msg=method)
