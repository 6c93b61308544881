"""The carried state has the shapes its annotations (the docs/algorithm.md §0 legend) say:
``DecodeOutput``, ``LoopState``, the round tuples, ``Draft``, ``KVCache``, ``DrafterContext``;
and one round built from ``decoding/round.py`` is the round ``decode`` runs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from decode_helpers import FAST_XLA, jit_decode
from dominotree_jax import DecodeConfig
from dominotree_jax.decoding import round as rnd
from dominotree_jax.decoding.auto_size import AutoPolicy
from dominotree_jax.decoding.costs import CostTable
from dominotree_jax.decoding.draft import bind_drafter_for, draft_round, tap_layers_for
from dominotree_jax.model.target import bind_target
from shape_check import check_shapes
from spec_fixtures import tiny_pair

B, T, Y = 2, 5, 6
# one jitted decode for the module: the loop-state test's decode reuses the program the output
# test compiled for the same config
jdecode = jit_decode()
CHEAP = CostTable(verify=((1, 1.0), (17, 1.2)), draft=(("dominotree", 0.05),), source="test")


def _configs(tcfg, dcfg):
    kw = dict(target=tcfg, drafter=dcfg, max_new_tokens=Y, node_topk=3, top_m=16)
    return {"ar": DecodeConfig(target=tcfg, method="ar", max_new_tokens=Y),
            "dflash": DecodeConfig(method="dflash", **kw),
            "dominotree": DecodeConfig(method="dominotree", budget=6, return_logprobs=True,
                                       return_features=True, **kw),
            "auto": DecodeConfig(method="dominotree", budget="auto", auto_costs=CHEAP, **kw)}


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(block_size=4)


def _prompt(vocab):
    return jnp.asarray(np.random.default_rng(0).integers(1, vocab, (B, T)), jnp.int32)


@pytest.mark.parametrize("name", ["ar", "dflash", "dominotree", "auto"])
def test_decode_output_and_one_round_follow_the_legend(pair, name):
    tcfg, dcfg, params = pair
    config = _configs(tcfg, dcfg)[name]
    prompt_BT, lengths_B = _prompt(tcfg.vocab_size), jnp.asarray([T, T - 2], jnp.int32)
    out = jdecode(params, prompt_BT, config=config, prompt_lengths=lengths_B)
    check_shapes(out, B=B, Y=Y, **({"W": T + Y} if config.return_features else {}))
    assert (out.features is not None) == config.return_features
    assert (out.auto_state is not None) == config.is_auto
    tau = np.asarray(out.accept_lengths).sum() / max(np.asarray(out.num_rounds).sum(), 1)
    assert float(out.mean_tau()) == pytest.approx(tau)
    if name == "ar":
        assert float(out.mean_tau()) == 1.0

    S = T + Y + config.num_draft_nodes + 1

    def one_round(params, prompt_BT, lengths_B):
        target = bind_target(config.target, params["target"])
        drafter = bind_drafter_for(config, params.get("drafter"))
        policy = AutoPolicy(config, B) if config.is_auto else None
        pre = rnd.prefill_context(target=target, drafter=drafter, prompt_BT=prompt_BT,
                                  lengths_B=lengths_B, max_len=S,
                                  tap_layers=tap_layers_for(config))
        inp = rnd.RoundInput(cache=pre.cache, ctx=pre.ctx, t0_B=lengths_B % 7,
                             start_B=lengths_B, key=jax.random.key(1))
        consts = rnd.LoopConstants(config=config, target=target, drafter=drafter,
                                   lengths_B=lengths_B, prompt_BT=prompt_BT, policy=policy)
        draft = draft_round(inp, consts)
        size = rnd.static_size(consts)
        result = (rnd.fixed_round(inp, consts, size=size) if size is not None else
                  rnd.auto_round(inp, policy.init(), consts, live_B=jnp.ones((B,), bool)))
        return pre, inp, draft, result

    pre, inp, draft, result = jax.jit(one_round, compiler_options=FAST_XLA)(
        params, prompt_BT, lengths_B)
    feats = tcfg.hidden_size * len(tap_layers_for(config))
    check_shapes(pre, B=B, T=T, S=S, V=tcfg.vocab_size, F=feats)
    check_shapes(inp, B=B, S=S)
    check_shapes(draft, B=B, N=config.num_draft_nodes, R=config.num_draft_nodes + 1)
    check_shapes(result, B=B, S=S, P=config.max_depth + 1, F=feats)
    assert (pre.ctx is None) == (config.method == "ar")
    sizes = np.asarray(result.size_B)
    assert set(sizes.tolist()) <= set(config.size_options)


@pytest.mark.parametrize("name", ["dominotree", "auto"])
def test_the_loop_state_before_and_after_a_round_follows_the_legend(pair, name):
    tcfg, dcfg, params = pair
    config = _configs(tcfg, dcfg)[name]
    S = T + Y + config.num_draft_nodes + 1
    O = Y + config.max_depth + 1
    lengths_B = jnp.asarray([T, T - 1], jnp.int32)

    def two_states(params, prompt_BT):
        target = bind_target(config.target, params["target"])
        drafter = bind_drafter_for(config, params["drafter"])
        policy = AutoPolicy(config, B) if config.is_auto else None
        pre = rnd.prefill_context(target=target, drafter=drafter, prompt_BT=prompt_BT,
                                  lengths_B=lengths_B, max_len=S,
                                  tap_layers=tap_layers_for(config))
        consts = rnd.LoopConstants(config=config, target=target, drafter=drafter,
                                   lengths_B=lengths_B, prompt_BT=prompt_BT, policy=policy)
        state = rnd.first_state(pre, jax.random.key(0), consts,
                                auto=None if policy is None else policy.init())
        return state, rnd.round_step(state, consts)

    before, after = jax.jit(two_states, compiler_options=FAST_XLA)(params,
                                                                   _prompt(tcfg.vocab_size))
    pins = dict(B=B, O=O, Y=Y, S=S)
    if config.return_features:
        pins["W"] = T + O
    for state in (before, after):
        check_shapes(state, **pins)
    assert (after.auto is not None) == config.is_auto
    assert int(after.rounds_B.min()) == 1 and (np.asarray(after.n_B) > 1).all()
    # the round built from round.py is decode's first round: same tokens so far (T = 0)
    out = jdecode(params, _prompt(tcfg.vocab_size), config=config, prompt_lengths=lengths_B)
    for b in range(B):
        n = min(int(after.n_B[b]), Y)
        np.testing.assert_array_equal(np.asarray(after.out_BO[b, :n]),
                                      np.asarray(out.tokens[b, :n]))
        assert int(after.taus_BY[b, 0]) == int(out.accept_lengths[b, 0])


def test_the_shape_check_can_fail(pair):
    tcfg, dcfg, params = pair
    out = jdecode(params, _prompt(tcfg.vocab_size), config=_configs(tcfg, dcfg)["ar"])
    check_shapes(out, B=B, Y=Y)
    with pytest.raises(AssertionError, match="num_tokens"):
        check_shapes(out._replace(num_tokens=out.num_tokens[:1]), B=B)
    with pytest.raises(AssertionError, match="accept_lengths"):   # Y bound by tokens
        check_shapes(out._replace(accept_lengths=out.accept_lengths[:, :2]))
    with pytest.raises(AssertionError, match="logprobs"):          # a dtype break
        check_shapes(out._replace(logprobs=out.tokens))
    with pytest.raises(AssertionError, match="tokens"):                # a pinned size
        check_shapes(out, Y=7)
