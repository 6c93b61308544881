"""``budget="auto"``: the cost-aware draft size is lossless (identical to ``ar`` at T=0, the
target's distribution at T=1), falls back to plain steps with a useless drafter, goes to the
largest size with an oracle, and compiles once per config."""

import contextlib
import dataclasses
import json

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

from decode_helpers import FAST_XLA, SAMPLING_XLA, fresh_jit_decode, oracle_table
from dominotree_jax import DecodeConfig
from dominotree_jax import decode as decode_fn
from dominotree_jax.decoding import auto_size, costs
from dominotree_jax.decoding.auto_size import AutoPolicy
from dominotree_jax.decoding.costs import CostTable
from dominotree_jax.decoding.draft import Draft
from dominotree_jax.model.drafter import Drafter, init_drafter_params
from spec_fixtures import first_tokens_chi_square_p, scripted_drafter, tiny_pair

METHODS = ("dflash", "domino", "ddtree", "dominotree")
# verifying is cheap here, so the policy uses every size with a half-right drafter
CHEAP = CostTable(verify=((1, 1.0), (17, 1.6)),
                  draft=tuple((m, 0.1) for m in METHODS), source="test")


def _cfg(tcfg, dcfg, method, **kw):
    kw.setdefault("node_topk", 3)
    kw.setdefault("top_m", 16)
    kw.setdefault("auto_costs", CostTable())
    return DecodeConfig(target=tcfg, drafter=dcfg, method=method, budget="auto", **kw)


def _ar(run, params, tcfg, prompt_BT, lengths_B, n):
    cfg = DecodeConfig(target=tcfg, method="ar", max_new_tokens=n)
    return run(params, prompt_BT, lengths_B, config=cfg)


class DraftCounter:
    """Counts ``Drafter.draft`` executions (not traces) through a host callback."""

    def __init__(self):
        self.calls = 0

    def __enter__(self):
        self.original = Drafter.draft
        counter = self

        def draft(drafter, target, ctx, t0_B, start_B, head_rows_CH=None):
            jax.debug.callback(counter._bump)
            return counter.original(drafter, target, ctx, t0_B, start_B, head_rows_CH)

        Drafter.draft = draft
        return self

    def _bump(self):
        self.calls += 1

    def __exit__(self, *exc):
        Drafter.draft = self.original


@contextlib.contextmanager
def honest_lookup_drafter(table_SVJ):
    """Like ``decode_helpers.lookup_drafter``, but flat (unsure) where the table is silent, so
    its scores say how far its chain will be right: the sizes then change from round to round."""
    original = Drafter.draft

    def draft(self, target, ctx, t0_B, start_B, head_rows_CH=None):
        z, base_BJV = original(self, target, ctx, t0_B, start_B, head_rows_CH)
        guess_BJ = table_SVJ[jnp.clip(start_B, 0, table_SVJ.shape[0] - 1), t0_B]
        hot_BJV = jax.nn.one_hot(guess_BJ, base_BJV.shape[-1]) * 30.0  # -1 → all zeros
        return z, base_BJV * 0.01 + hot_BJV

    Drafter.draft = draft
    try:
        yield
    finally:
        Drafter.draft = original


def test_greedy_identical_to_ar_with_every_size_in_use():
    tcfg, dcfg, params = tiny_pair(block_size=8)
    run = fresh_jit_decode()
    prompt_BT = jnp.array([[3, 17, 5, 9, 33, 2, 8], [4, 4, 12, 50, 0, 0, 0]], jnp.int32)
    lengths_B = jnp.array([7, 4], jnp.int32)
    n = 32
    ref = _ar(run, params, tcfg, prompt_BT, lengths_B, n + 12)
    table = oracle_table(np.asarray(prompt_BT), np.asarray(lengths_B), np.asarray(ref.tokens),
                         tcfg.vocab_size, dcfg.num_draft_positions)
    used = set()
    with honest_lookup_drafter(table):
        for method in METHODS:
            cfg = _cfg(tcfg, dcfg, method, max_new_tokens=n, auto_costs=CHEAP)
            out = run(params, prompt_BT, lengths_B, config=cfg)
            np.testing.assert_array_equal(out.tokens, ref.tokens[:, :n], err_msg=method)
            for b in range(2):
                r = int(out.num_rounds[b])
                sizes = np.asarray(out.draft_sizes[b])
                assert set(sizes[:r].tolist()) <= set(cfg.size_options)
                assert (sizes[r:] == -1).all()
                used |= {(method, s) for s in sizes[:r].tolist()}
            # the batch shares one size per round
            both = int(min(out.num_rounds))
            np.testing.assert_array_equal(out.draft_sizes[0, :both], out.draft_sizes[1, :both])
    for method in METHODS:
        sizes = {s for m, s in used if m == method}
        assert len(sizes) >= 2, (method, sizes)   # the switch really switches


def test_batched_rows_equal_single_row_decodes():
    tcfg, dcfg, params = tiny_pair(block_size=4, seed=2)
    run = fresh_jit_decode()
    prompt_BT = jnp.array([[5, 6, 7, 8, 9], [1, 2, 0, 0, 0], [9, 9, 9, 1, 0]], jnp.int32)
    lengths_B = jnp.array([5, 2, 4], jnp.int32)
    cfg = _cfg(tcfg, dcfg, "dominotree", max_new_tokens=24, auto_costs=CHEAP,
               return_logprobs=True, return_features=True)
    batched = run(params, prompt_BT, lengths_B, config=cfg)
    for b in range(3):
        single = run(params, prompt_BT[b:b + 1], lengths_B[b:b + 1], config=cfg)
        np.testing.assert_array_equal(batched.tokens[b], single.tokens[0])
        assert int(batched.num_tokens[b]) == int(single.num_tokens[0])
    # log-probs and the committed rows' features: as a fixed budget reports them
    fixed = run(params, prompt_BT, lengths_B, config=cfg.replace(budget=6))
    np.testing.assert_array_equal(batched.tokens, fixed.tokens)
    np.testing.assert_allclose(batched.logprobs, fixed.logprobs, atol=1e-4)
    for b in range(3):
        known = int(lengths_B[b] + batched.num_tokens[b]) - 1
        np.testing.assert_allclose(batched.features[b, :known], fixed.features[b, :known],
                                   atol=1e-4)


def _wrong_or_oracle_setup(n):
    """A tiny pair, a fresh jitted decode, one prompt, its ``ar`` output (``n + 10`` tokens)
    and prompt + output as the absolute-position sequence a scripted drafter follows."""
    tcfg, dcfg, params = tiny_pair(block_size=8)
    run = fresh_jit_decode()
    prompt_BT, lengths_B = jnp.array([[3, 17, 5, 9, 33]], jnp.int32), jnp.array([5])
    ref = _ar(run, params, tcfg, prompt_BT, lengths_B, n + 10)
    assert ref.predicted_lengths is None and ref.auto_state is None   # not an auto config
    seq = np.concatenate([np.asarray(prompt_BT[0]), np.asarray(ref.tokens[0])])
    return tcfg, dcfg, params, run, prompt_BT, lengths_B, ref, seq


@pytest.mark.parametrize("method", ["domino", "dominotree"])
def test_wrong_drafter_falls_back_to_plain_steps_and_probes(method):
    n = 60
    tcfg, dcfg, params, run, prompt_BT, lengths_B, ref, seq = _wrong_or_oracle_setup(n)
    cfg = _cfg(tcfg, dcfg, method, max_new_tokens=n)
    with scripted_drafter(seq, wrong=True), DraftCounter() as drafts:
        out = jax.block_until_ready(run(params, prompt_BT, lengths_B, config=cfg))
    np.testing.assert_array_equal(out.tokens[0], ref.tokens[0, :n])
    rounds = int(out.num_rounds[0])
    assert rounds == n - 1
    assert (np.asarray(out.draft_sizes[0, :rounds]) == 0).all()
    np.testing.assert_array_equal(out.predicted_lengths[0, :rounds], 1.0)   # plain steps
    # drafts in the first round (optimistic start), then only probes, each gap twice the last:
    # rounds 0, b, 3b, 7b, ... with b the policy's base gap
    base = AutoPolicy(cfg, batch=1).probe_every
    assert base == max(cfg.auto_probe_every,
                       int(np.ceil(CostTable().draft_cost(method) / auto_size.PROBE_SHARE)))
    expected = sum(1 for k in range(8) if (2 ** k - 1) * base < rounds)
    assert drafts.calls == expected, (drafts.calls, expected, base)

    # the next call, carrying the state: no optimistic first draft; the probe gap goes on
    carry = jax.jit(lambda p, x, n, st, *, config: decode_fn(
        p, x, config=config, prompt_lengths=n, auto_state=st), static_argnames="config",
        compiler_options=FAST_XLA)
    st = out.auto_state
    assert float(st.rate) < AutoPolicy(cfg, batch=1).ar_rate
    with scripted_drafter(seq, wrong=True), DraftCounter() as again:
        out2 = jax.block_until_ready(carry(params, prompt_BT, lengths_B, st, config=cfg))
    np.testing.assert_array_equal(out2.tokens[0], ref.tokens[0, :n])
    last_draft = (2 ** (expected - 1) - 1) * base
    wait = int(st.gap) - (rounds - 1 - last_draft)   # rounds until the next probe
    assert int(st.since) == rounds - 1 - last_draft
    assert again.calls == (1 if wait <= rounds else 0) < drafts.calls, (again.calls, wait)
    with pytest.raises(ValueError, match="only for budget='auto'"):
        decode_fn(params, prompt_BT, config=DecodeConfig(target=tcfg, method="ar",
                                                         max_new_tokens=4), auto_state=st)


@pytest.mark.parametrize("method", METHODS)
def test_oracle_drafter_gets_the_largest_size(method):
    n = 40
    tcfg, dcfg, params, run, prompt_BT, lengths_B, ref, seq = _wrong_or_oracle_setup(n)
    sizes = (0, 2, 4, 8)   # a tree of more than J = 8 nodes adds nothing for an oracle
    cfg = _cfg(tcfg, dcfg, method, max_new_tokens=n, auto_sizes=sizes)
    with scripted_drafter(seq):
        out = run(params, prompt_BT, lengths_B, config=cfg)
    np.testing.assert_array_equal(out.tokens[0], ref.tokens[0, :n])
    rounds = int(out.num_rounds[0])
    assert (np.asarray(out.draft_sizes[0, :rounds]) == 8).all()
    assert (np.asarray(out.accept_lengths[0, :rounds - 1]) == 9).all()
    # the policy's expected tokens per round: from the prior's 1 + 0.6 x (the drafter's own
    # prediction) towards the 9 committed as its calibration learns; NaN where no round
    expected = np.asarray(out.predicted_lengths[0])
    assert np.isnan(expected[rounds:]).all() and np.isfinite(expected[:rounds]).all()
    assert expected[0] < 1 + 8 * auto_size.CALIB_PRIOR + 1e-4
    assert abs(expected[rounds - 2] - 9) < 0.15 * 9, expected[:rounds]


def test_sampling_matches_the_target_distribution():
    from spec_fixtures import sampling_case
    runs = 20000
    tcfg, dcfg, params, prompt, exact = sampling_case()
    cfg = _cfg(tcfg, dcfg, "dominotree", max_new_tokens=3, temperature=1.0, node_topk=2,
               top_m=0, auto_sizes=(0, 1, 2, 6), auto_costs=CHEAP)
    run = fresh_jit_decode(SAMPLING_XLA)
    out = run(params, jnp.tile(prompt, (runs, 1)), jnp.full((runs,), 3), jax.random.key(7),
              config=cfg)
    assert first_tokens_chi_square_p(out.tokens, exact, tcfg.vocab_size) > 1e-3
    assert int(np.asarray(out.accept_lengths).max()) > 1   # drafts were verified and accepted
    assert (np.asarray(out.draft_sizes)[:, 0] > 0).all()


def test_one_trace_per_config():
    tcfg, dcfg, params = tiny_pair()
    traces = []
    from dominotree_jax import decode

    def counted(params, prompt, *, config):
        traces.append(config)
        return decode(params, prompt, config=config)

    f = jax.jit(counted, static_argnames="config", compiler_options=FAST_XLA)
    cfg = _cfg(tcfg, dcfg, "dominotree", max_new_tokens=6)
    f(params, jnp.array([1, 2, 3]), config=cfg)
    f(jax.tree.map(lambda x: x * 1.01, params), jnp.array([4, 5, 6]), config=cfg)
    f(params, jnp.array([4, 5, 6]), config=_cfg(tcfg, dcfg, "dominotree", max_new_tokens=6))
    assert len(traces) == 1
    assert hash(cfg) == hash(_cfg(tcfg, dcfg, "dominotree", max_new_tokens=6))


def test_config_checks_and_sizes():
    tcfg, dcfg, _ = tiny_pair(block_size=8)
    assert _cfg(tcfg, dcfg, "dflash").size_options == (0, 2, 4, 8)
    assert _cfg(tcfg, dcfg, "ddtree").size_options == (0, 2, 4, 8, 16)
    tree = _cfg(tcfg, dcfg, "ddtree")
    assert tree.num_draft_nodes == 16 and tree.max_depth == 8
    assert tree.replace(method="domino").size_options == (0, 2, 4, 8)   # sizes follow the method
    assert tree.replace(method="ar").num_draft_nodes == 0
    fixed = DecodeConfig(target=tcfg, drafter=dcfg, method="ddtree", budget=6)
    assert fixed.size_options == (6,) and not fixed.is_auto
    _, d5, _ = tiny_pair(block_size=5)
    assert _cfg(tcfg, d5, "domino").size_options == (0, 2, 4, 5)
    with pytest.raises(ValueError, match="budget must be a positive int or 'auto'"):
        DecodeConfig(target=tcfg, drafter=dcfg, method="ddtree", budget="big")
    with pytest.raises(ValueError, match="auto_sizes must be ascending"):
        _cfg(tcfg, dcfg, "ddtree", auto_sizes=(2, 4))
    with pytest.raises(ValueError, match="auto_sizes must be ascending"):
        _cfg(tcfg, dcfg, "ddtree", auto_sizes=(0, 4, 2))
    with pytest.raises(ValueError, match="has only 8 draft positions"):
        _cfg(tcfg, dcfg, "dflash", auto_sizes=(0, 4, 16))
    with pytest.raises(ValueError, match="auto_costs must be a CostTable"):
        _cfg(tcfg, dcfg, "ddtree", auto_costs=({"verify": 1},))
    with pytest.raises(ValueError, match="auto_probe_every"):
        _cfg(tcfg, dcfg, "ddtree", auto_probe_every=0)


def test_cost_table_interpolates_and_the_cost_file_round_trips(tmp_path, monkeypatch):
    t = CostTable(batch=1, verify=((1, 1.0), (5, 1.4), (17, 2.6)))
    assert t.verify_cost(1) == 1.0 and abs(t.verify_cost(3) - 1.2) < 1e-9
    assert abs(t.verify_cost(9) - 1.8) < 1e-9 and abs(t.verify_cost(33) - 4.2) < 1e-9
    assert t.draft_cost("ddtree") == dict(costs.DEFAULT_DRAFT)["ddtree"]   # batch 1
    with pytest.raises(ValueError, match="must start at 1"):
        CostTable(verify=((2, 1.0), (4, 2.0)))
    with pytest.raises(ValueError, match="bad entries"):
        CostTable(verify=((1, 1.0), (4, -2.0)))
    tcfg, dcfg, _ = tiny_pair()
    path = str(tmp_path / "costs.json")
    monkeypatch.setenv(costs.COSTS_ENV, path)
    with pytest.raises(ValueError, match="no such cost file"):
        costs.load_calibrated_costs(tcfg, dcfg)
    tables = (CostTable(batch=1, verify=((1, 1.0), (9, 1.9)), draft=(("ddtree", 0.3),)),
              CostTable(batch=16, verify=((1, 1.0), (9, 5.0)), draft=(("ddtree", 0.2),)))
    assert costs.save_costs(tcfg, dcfg, tables) == path
    got = costs.load_calibrated_costs(tcfg, dcfg)
    assert [(g.batch, g.verify, g.draft) for g in got] == [(x.batch, x.verify, x.draft)
                                                           for x in tables]
    # a config never reads the file: the default model unless the tables are passed
    assert _cfg(tcfg, dcfg, "ddtree", auto_costs=None).auto_costs == costs.default_tables()
    assert _cfg(tcfg, dcfg, "ddtree", auto_costs=got).auto_costs == got
    assert costs.table_for_batch(got, 2).batch == 1
    assert costs.table_for_batch(got, 8).batch == 16
    _, other, _ = tiny_pair(block_size=6)   # another drafter: not calibrated, defaults
    assert costs.load_calibrated_costs(tcfg, other) == costs.default_tables()
    with open(path, "w") as f:
        json.dump({"something": "else"}, f)
    with pytest.raises(ValueError, match="not a version-1 cost file"):
        costs.load_calibrated_costs(tcfg, dcfg)


def test_an_auto_config_reads_no_file_and_queries_no_device(tmp_path, monkeypatch):
    tcfg, dcfg, _ = tiny_pair()
    monkeypatch.setenv(costs.COSTS_ENV, str(tmp_path / "missing.json"))

    def no_devices(*a, **k):
        raise AssertionError("DecodeConfig queried the devices")

    monkeypatch.setattr(jax, "devices", no_devices)
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method="ddtree", budget="auto")
    assert cfg.auto_costs == costs.default_tables()
    assert hash(cfg) == hash(DecodeConfig(target=tcfg, drafter=dcfg, method="ddtree",
                                          budget="auto"))
    # the explicit load names the missing file it was told to read
    monkeypatch.undo()
    monkeypatch.setenv(costs.COSTS_ENV, str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="no such cost file"):
        costs.load_calibrated_costs(tcfg, dcfg)


def test_initial_state_is_the_optimistic_start_or_the_carried_one():
    tcfg, dcfg, _ = tiny_pair()
    cfg = _cfg(tcfg, dcfg, "ddtree")
    st = auto_size.initial_state(cfg, 2)
    policy = AutoPolicy(cfg, 2)
    assert float(st.rate) == pytest.approx(auto_size.RATE_START * policy.ar_rate)
    assert int(st.gap) == policy.probe_every and int(st.since) == 0
    carried = st._replace(since=jnp.int32(3))
    assert int(auto_size.initial_state(cfg, 2, carried).since) == 3
    with pytest.raises(ValueError, match="auto_state must be a DecodeOutput.auto_state"):
        auto_size.initial_state(cfg, 2, (1.0, 1.0, 1.0, 0, 8))


def test_size_choice_follows_expected_tokens_per_cost():
    tcfg, dcfg, _ = tiny_pair(block_size=8)
    cfg = _cfg(tcfg, dcfg, "ddtree", auto_sizes=(0, 2, 4, 8),
               auto_costs=CostTable(verify=((1, 1.0), (9, 2.6))))   # 0.2 per node
    policy = AutoPolicy(cfg, batch=2)
    state = policy.init()

    def draft_of(probs_BN):
        p = jnp.asarray(probs_BN, jnp.float32)
        B, N = p.shape
        return Draft(jnp.zeros((B, N), jnp.int32), jnp.full((B, N), -1, jnp.int32),
                     jnp.zeros((B, N), jnp.int32), p > 0, jnp.ones((B, N + 1, N + 1), bool),
                     jnp.log(p))

    live = jnp.array([True, True])
    rho = max(1.0, auto_size.RATE_START)   # the optimistic start: 1.1 tokens per AR step
    # nodes worth more than rho * 0.2 = 0.22 tokens each are kept: the first 4 here
    probs = [[0.9, 0.8, 0.6, 0.3, 0.1, 0.1, 0.05, 0.05]] * 2
    assert abs(rho * 0.2 - 0.22) < 1e-9
    assert policy.sizes[int(policy.choose(state, draft_of(probs), live).index)] == 4
    assert policy.sizes[int(policy.choose(state, draft_of([[0.1] * 8] * 2), live).index)] == 0
    assert policy.sizes[int(policy.choose(state, draft_of([[1.0] * 8] * 2), live).index)] == 8
    # a done row does not count: only the live row's confident draft decides
    mixed = [[1.0] * 8, [0.01] * 8]
    assert int(policy.choose(state, draft_of(mixed), jnp.array([True, False])).index) == 3
    assert int(policy.choose(state, draft_of(mixed), jnp.array([False, True])).index) == 0
    # calibration: a drafter right 0.4x as often as it claims keeps only its first 2 nodes
    half = policy.init(state._replace(pred=jnp.float32(2.5), real=jnp.float32(1.0)))
    assert policy.sizes[int(policy.choose(half, draft_of(probs), live).index)] == 2


def test_each_row_counts_with_its_own_calibration():
    """Rows start a call at the batch's calibration, then follow their own accepted nodes; the
    size serves the rows that accept: the same draft swapped between the rows changes it."""
    tcfg, dcfg, _ = tiny_pair(block_size=8)
    cfg = _cfg(tcfg, dcfg, "ddtree", auto_sizes=(0, 2, 4, 8),
               auto_costs=CostTable(verify=((1, 1.0), (9, 2.6))))
    policy = AutoPolicy(cfg, batch=2)
    carried = policy.init()._replace(pred=jnp.float32(2.0), real=jnp.float32(1.0))
    state = policy.init(carried)
    np.testing.assert_allclose(policy.row_calibration(state), [0.5, 0.5])
    N = 8
    p_BN = jnp.array([[0.9] * N, [0.9] * N], jnp.float32)
    draft = Draft(jnp.zeros((2, N), jnp.int32), jnp.full((2, N), -1, jnp.int32),
                  jnp.zeros((2, N), jnp.int32), p_BN > 0, jnp.ones((2, N + 1, N + 1), bool),
                  jnp.log(p_BN))
    live = jnp.array([True, True])
    choice = policy.choose(state, draft, live)
    # row 0 accepted every node it was offered for 10 rounds, row 1 none
    for _ in range(10):
        state = policy.update(state, jnp.bool_(True), choice,
                              committed_B=jnp.array([9, 1]), accepted_B=jnp.array([8, 0]),
                              root_hit_B=jnp.array([True, False]), live_B=live)
    c_B = np.asarray(policy.row_calibration(state))
    assert c_B[0] > 0.9 and c_B[1] < 0.1
    batch_c = float(policy.calibration(state))
    assert c_B[1] < batch_c < c_B[0]
    def with_probs(rows):
        p = jnp.asarray(rows, jnp.float32)
        return draft._replace(valid_BN=p > 0, scores_BN=jnp.log(p))
    good_row0 = with_probs([[1.0] * N, [0.02] * N])
    good_row1 = with_probs([[0.02] * N, [1.0] * N])
    big = policy.choose(state, good_row0, live)
    small = policy.choose(state, good_row1, live)
    assert policy.sizes[int(big.index)] == 8 and policy.sizes[int(small.index)] == 0
    assert float(big.expected_B[0]) > 8 and float(big.expected_B[1]) < 1.1
    # a done row's calibration is left as it was
    after = policy.update(state, jnp.bool_(True), big, committed_B=jnp.array([1, 9]),
                          accepted_B=jnp.array([0, 8]), root_hit_B=jnp.array([False, True]),
                          live_B=jnp.array([True, False]))
    np.testing.assert_allclose(after.row_real[1], state.row_real[1])
    assert float(after.row_real[0]) < float(state.row_real[0])
    # the next call's rows start again from the batch's calibration
    np.testing.assert_allclose(policy.row_calibration(policy.init(state)),
                               [policy.calibration(state)] * 2, rtol=1e-6)


def test_default_costs_grow_with_the_batch_and_large_batches_never_draft():
    tables = costs.default_tables()
    assert tables[0] == CostTable() and [t.batch for t in tables] == list(
        costs.DEFAULT_BATCHES)
    v17 = [t.verify_cost(17) for t in tables]
    d = [t.draft_cost("dominotree") for t in tables]
    assert all(a < b for a, b in zip(v17, v17[1:])) and all(a < b for a, b in zip(d, d[1:]))
    assert all(t.verify_cost(1) == 1.0 for t in tables)
    tcfg, dcfg, _ = tiny_pair(block_size=8)
    cfg = _cfg(tcfg, dcfg, "dominotree", auto_costs=tables)
    one, many = AutoPolicy(cfg, batch=1), AutoPolicy(cfg, batch=128)
    assert one.can_pay and bool(one.wants_draft(one.init()))
    # at batch 128 even a perfect 8-token path cannot pay for draft + verify: never a draft
    assert not many.can_pay
    st = many.init()._replace(since=jnp.int32(10**6))
    assert not bool(many.wants_draft(st))


def test_auto_decode_that_can_never_pay_runs_plain_steps_and_keeps_its_state():
    """A batch whose cost table says no draft can pay (``can_pay`` False) decodes with plain
    steps: the output equals ``ar`` and the carried policy state comes back unchanged (the
    loop carry keeps its ``AutoState``; it used to come back as None and fail to trace)."""
    tcfg, dcfg, params = tiny_pair(block_size=8)
    cfg = _cfg(tcfg, dcfg, "dominotree", auto_costs=costs.default_tables(), max_new_tokens=5)
    B = 128
    assert not AutoPolicy(cfg, batch=B).can_pay
    rng = np.random.default_rng(0)
    prompt_BT = jnp.asarray(rng.integers(1, tcfg.vocab_size - 1, (B, 4)), jnp.int32)
    lengths_B = jnp.full((B,), 4, jnp.int32)
    run = fresh_jit_decode()
    out = run(params, prompt_BT, lengths_B, config=cfg)
    ar = _ar(run, params, tcfg, prompt_BT, lengths_B, 5)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ar.tokens))
    start = auto_size.initial_state(cfg, B)
    assert all(np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(out.auto_state, start))


def test_calibration_measures_a_usable_table(tmp_path, monkeypatch):
    import dominotree_jax as dj
    from dominotree_jax.calibrate import calibrate_batch
    tcfg, dcfg, params = tiny_pair(block_size=4)
    pair = dj.Pair(dj.Target(tcfg, params["target"], tokenizer=None), dcfg, params["drafter"])
    table = calibrate_batch(pair, 1, (1, 3, 5), ("dflash", "dominotree"), context=12, rounds=2,
                            repeats=1, log=lambda s: None)
    assert [r for r, _ in table.verify] == [1, 3, 5] and table.source == "calibrated"
    assert all(c > 0 for _, c in table.verify) and {m for m, _ in table.draft} == {
        "dflash", "dominotree"}
    monkeypatch.setenv(costs.COSTS_ENV, str(tmp_path / "costs.json"))
    costs.save_costs(tcfg, dcfg, (table,))
    (got,) = pair.config("dflash", budget="auto").auto_costs   # Pair.config loads the file
    assert (got.verify, got.draft) == (table.verify, table.draft)
    assert _cfg(tcfg, dcfg, "dflash", auto_costs=None).auto_costs == costs.default_tables()


def _layer_copies(hlo: str, B, tcfg, S):
    """``copy`` ops of one cache layer's shape ``[B, K, S, D]`` in compiled ``hlo``: (in the
    entry's callees -- loops --, in the entry)."""
    import re
    pattern = re.compile(r"=\s*f32\[%d,%d,%d,%d\]\{[^}]*\}\s+copy\(" % (
        B, tcfg.num_key_value_heads, S, tcfg.head_dim))
    loop = entry = 0
    is_entry = False
    for line in hlo.splitlines():
        if not line.startswith(" ") and line.rstrip().endswith("{"):
            is_entry = line.startswith("ENTRY")
        if pattern.search(line):
            entry += is_entry
            loop += not is_entry
    return loop, entry


def _cache_copies(params, cfg, B, T):
    """``copy`` ops of one cache layer's shape in the compiled decode: (in loops, in entry)."""
    hlo = jax.jit(decode_fn, static_argnames="config", compiler_options=FAST_XLA).lower(
        params, jax.ShapeDtypeStruct((B, T), jnp.int32), config=cfg,
        prompt_lengths=jax.ShapeDtypeStruct((B,), jnp.int32)).compile().as_text()
    S = T + cfg.max_new_tokens + cfg.num_draft_nodes + 1
    return _layer_copies(hlo, B, cfg.target, S)


@pytest.mark.parametrize("rows", [1, 3])
def test_the_calibrated_rounds_never_copy_the_cache(rows):
    """The calibration times auto's rounds outside the size switch (``round.sized_round``);
    its plain step once copied every layer's cache each round (XLA wrote the kept row before
    the attention read it), pricing a plain step at 1.33 ``ar`` steps at batch 4."""
    import dominotree_jax as dj
    from dominotree_jax.calibrate import RoundPrograms
    tcfg, dcfg, params = tiny_pair(block_size=4)
    pair = dj.Pair(dj.Target(tcfg, params["target"], tokenizer=None), dcfg, params["drafter"])
    B, context, max_rows = 4, 40, 5
    progs = RoundPrograms(pair, B, context, 2, max_rows)
    loop, args = progs._verify_fn(rows, plain_ar=False)
    hlo = jax.jit(loop).lower(*args).compile().as_text()
    in_loop, _ = _layer_copies(hlo, B, tcfg, context + max_rows + 8)
    assert in_loop == 0, f"{in_loop} cache-layer copies inside the calibrated {rows}-row loop"


@pytest.mark.parametrize("method,budget", [("ar", 16), ("dominotree", 6), ("domino", "auto")])
def test_the_decode_loop_never_copies_the_cache(method, budget):
    """A ``lax.switch`` branch that writes the cache, or a write not ordered after the reads,
    makes XLA copy every layer's cache each round; the loop must update it in place."""
    tcfg, dcfg, params = tiny_pair(block_size=8)
    kw = dict(auto_costs=CHEAP) if budget == "auto" else {}
    cfg = DecodeConfig(target=tcfg, drafter=None if method == "ar" else dcfg, method=method,
                       budget=budget, node_topk=3, top_m=16, max_new_tokens=12, **kw)
    if method == "ar":
        params = {"target": params["target"], "drafter": None}
    loop, entry = _cache_copies(params, cfg, 2, 8)
    assert loop == 0, f"{loop} cache-layer copies inside the decode loop"
    assert entry > 0   # the pattern does find the cache's copies (its initialisation)


def test_a_changed_drafter_is_probed_at_once_and_then_followed():
    """``auto_size.probe_next`` (what the rollout engine applies when its drafter changes): a
    state that learned to take plain steps with a useless drafter drafts in the very next
    round with the new one, and keeps drafting when that one is good; a plain carried state
    waits for its probe gap."""
    n = 40
    tcfg, dcfg, params, run, prompt_BT, lengths_B, ref, seq = _wrong_or_oracle_setup(n)
    cfg = _cfg(tcfg, dcfg, "dominotree", max_new_tokens=n)
    with scripted_drafter(seq, wrong=True):
        st = run(params, prompt_BT, lengths_B, config=cfg).auto_state
    carry = jax.jit(lambda p, x, n, s, *, config: decode_fn(
        p, x, config=config, prompt_lengths=n, auto_state=s), static_argnames="config",
        compiler_options=FAST_XLA)
    with scripted_drafter(seq):   # the drafter is now an oracle
        stale = carry(params, prompt_BT, lengths_B, st, config=cfg)
        fresh = carry(params, prompt_BT, lengths_B, auto_size.probe_next(st), config=cfg)
    for out in (stale, fresh):
        np.testing.assert_array_equal(out.tokens[0], ref.tokens[0, :n])
    stale_sizes = np.asarray(stale.draft_sizes[0, :int(stale.num_rounds[0])])
    fresh_sizes = np.asarray(fresh.draft_sizes[0, :int(fresh.num_rounds[0])])
    assert stale_sizes[0] == 0 and fresh_sizes[0] > 0
    assert (fresh_sizes > 0).all()                        # followed from then on
    assert int(fresh.num_rounds[0]) < int(stale.num_rounds[0])
    assert float(fresh.auto_state.rate) > AutoPolicy(cfg, batch=1).ar_rate


def _avals_in(jaxpr, inside_cond: bool = False, found=None):
    """``(shape, inside a cond branch)`` of every equation output of ``jaxpr``, recursively."""
    found = [] if found is None else found
    for eqn in jaxpr.eqns:
        for v in eqn.outvars:
            found.append((tuple(getattr(v.aval, "shape", ())), inside_cond))
        cond = eqn.primitive.name == "cond"
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            _avals_in(sub, inside_cond or cond, found)
    return found


def test_plain_steps_run_as_ar_steps_between_the_rounds_that_may_draft():
    """A policy that takes plain steps runs them in an inner loop of ``ar``-like steps
    (``round.plain_step``: no draft cond, no size switch, ~4% of a step at batch 4 on a Zen 5):
    same key use as ``ar``, so a decode that never drafts gives ``ar``'s tokens at T > 0 too,
    and its state comes back with ``since`` counting those steps."""
    tcfg, dcfg, params = tiny_pair(block_size=8)
    n, key = 20, jax.random.key(5)
    cfg = _cfg(tcfg, dcfg, "dominotree", auto_costs=CHEAP, max_new_tokens=n, temperature=1.0)
    prompt_BT = jnp.array([[3, 17, 5, 9, 33], [4, 4, 12, 50, 0]], jnp.int32)
    lengths_B = jnp.array([5, 4], jnp.int32)
    never = auto_size.initial_state(cfg, 2)._replace(
        rate=jnp.float32(0.0), since=jnp.int32(0), gap=jnp.int32(10 ** 6))
    carry = jax.jit(lambda p, x, n, st, k, *, config: decode_fn(
        p, x, config=config, prompt_lengths=n, auto_state=st, key=k), static_argnames="config",
        compiler_options=SAMPLING_XLA)
    with DraftCounter() as drafts:
        out = jax.block_until_ready(carry(params, prompt_BT, lengths_B, never, key, config=cfg))
    ar = decode_fn(params, prompt_BT, prompt_lengths=lengths_B, key=key, config=DecodeConfig(
        target=tcfg, method="ar", max_new_tokens=n, temperature=1.0))
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ar.tokens))
    assert drafts.calls == 0 and (np.asarray(out.draft_sizes)[:, :n - 1] == 0).all()
    assert int(out.auto_state.since) == n - 1   # every round counted, in either loop
    # the loop holds a while loop of plain steps besides the auto round's switch
    jaxpr = jax.make_jaxpr(lambda p, x, n, st, k: decode_fn(
        p, x, config=cfg, prompt_lengths=n, auto_state=st, key=k))(
        params, prompt_BT, lengths_B, never, key)

    def sorts(j):   # the sampling filter's cond (sampling.py) is the one that sorts
        return any(e.primitive.name == "sort" or any(
            sorts(s) for s in jax.extend.core.jaxprs_in_params(e.params)) for e in j.eqns)

    def whiles(j, depth=0):
        out = []
        for eqn in j.eqns:
            if eqn.primitive.name == "while":
                body = eqn.params["body_jaxpr"].jaxpr
                out.append((depth, any(e.primitive.name == "cond" and not sorts(
                    e.params["branches"][-1].jaxpr) for e in body.eqns)))
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                out += whiles(sub, depth + (eqn.primitive.name == "while"))
        return out

    loops = whiles(jaxpr.jaxpr)
    assert (1, False) in loops, loops   # a nested loop whose body has no cond: plain steps


def test_drafted_rounds_read_the_draft_head_gathered_before_the_loop():
    """With a draft vocabulary the drafter's base logits read the target's LM-head rows of its
    ``C`` draft ids. Inside auto's draft ``cond`` XLA cannot hoist their gather out of the
    loop, so ``decode`` gathers them once before it (``Drafter.head_rows``): with SmolLM2's
    16k-id drafter the gather cost ~1.4 AR steps in every drafted round."""
    tcfg, dcfg, params = tiny_pair(vocab=64, block_size=4)
    d2t = np.arange(0, 64, 2)[:24]
    dcfg = dataclasses.replace(dcfg, draft_vocab_size=len(d2t))
    params["drafter"] = init_drafter_params(dcfg, 1, d2t=d2t)
    C, H = len(d2t), tcfg.hidden_size
    cfg = _cfg(tcfg, dcfg, "dominotree", auto_costs=CHEAP, max_new_tokens=8)
    jaxpr = jax.make_jaxpr(lambda p, x: decode_fn(p, x, config=cfg))(
        params, jnp.array([[3, 17, 5, 9]], jnp.int32))
    shapes = _avals_in(jaxpr.jaxpr)
    assert ((C, H), False) in shapes           # gathered (outside any cond) ...
    assert ((C, H), True) not in shapes, "the draft head is gathered inside the draft cond"
    # ... and the draft reads it: the same tokens as a decode that gathers in the round
    out = decode_fn(params, jnp.array([[3, 17, 5, 9]], jnp.int32), config=cfg)
    fixed = decode_fn(params, jnp.array([[3, 17, 5, 9]], jnp.int32), config=DecodeConfig(
        target=tcfg, method="ar", max_new_tokens=8))
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(fixed.tokens))


def test_a_probe_counts_more_than_a_round_of_a_drafting_stretch():
    """``rate`` was last updated before a plain stretch, so a probe's round weighs
    ``PROBE_ALPHA`` in it (other drafted rounds ``RATE_ALPHA``): a drafter that became good
    since lifts ``rate`` above the AR rate with one probe that delivers 1.6x the AR rate, from a
    stale 0.5x (with ``RATE_ALPHA`` it would need two more probes at doubling gaps)."""
    tcfg, dcfg, _ = tiny_pair(block_size=8)
    cfg = _cfg(tcfg, dcfg, "ddtree", auto_sizes=(0, 2, 4, 8),
               auto_costs=CostTable(verify=((1, 1.0), (9, 2.6)), draft=(("ddtree", 0.5),)))
    policy = AutoPolicy(cfg, batch=2)
    ar = policy.ar_rate
    N = 8
    p_BN = jnp.full((2, N), 0.9, jnp.float32)
    draft = Draft(jnp.zeros((2, N), jnp.int32), jnp.full((2, N), -1, jnp.int32),
                  jnp.zeros((2, N), jnp.int32), p_BN > 0, jnp.ones((2, N + 1, N + 1), bool),
                  jnp.log(p_BN))
    live = jnp.array([True, True])
    stale = policy.init()._replace(rate=jnp.float32(0.5 * ar), since=jnp.int32(7),
                                   gap=jnp.int32(8))
    choice = policy.choose(stale, draft, live)
    cost = policy.draft_cost + policy.verify_costs[int(choice.index)]
    committed = round(1.6 * ar * cost)   # tokens a row, delivering ~1.6x the AR rate
    realized = committed / cost
    after = policy.update(stale, jnp.bool_(True), choice, committed_B=jnp.array([committed] * 2),
                          accepted_B=jnp.array([committed - 1] * 2),
                          root_hit_B=jnp.array([True, True]), live_B=live)
    expected = (1 - auto_size.PROBE_ALPHA) * 0.5 * ar + auto_size.PROBE_ALPHA * realized
    assert float(after.rate) == pytest.approx(expected, rel=1e-5)
    assert float(after.rate) >= ar and bool(policy.wants_draft(after))
    assert int(after.gap) == policy.probe_every
    old_way = (1 - auto_size.RATE_ALPHA) * 0.5 * ar + auto_size.RATE_ALPHA * realized
    assert old_way < ar
    # a round of a drafting stretch (rate at or above the AR rate) weighs RATE_ALPHA
    drafting = stale._replace(rate=jnp.float32(1.2 * ar), since=jnp.int32(0))
    after = policy.update(drafting, jnp.bool_(True), choice,
                          committed_B=jnp.array([committed] * 2),
                          accepted_B=jnp.array([committed - 1] * 2),
                          root_hit_B=jnp.array([True, True]), live_B=live)
    assert float(after.rate) == pytest.approx(
        (1 - auto_size.RATE_ALPHA) * 1.2 * ar + auto_size.RATE_ALPHA * realized, rel=1e-5)


def test_the_drafter_runs_only_where_it_beats_the_lookup_paths_alone():
    """With ``lookup=K``, a round whose lookup paths alone expect more tokens per AR step than
    drafted rounds have delivered skips the drafter (auto_size point 4); where the lookup
    finds nothing worth a verify (size 0), ``rate`` decides as without lookup."""
    tcfg, dcfg, _ = tiny_pair(block_size=8)
    cfg = _cfg(tcfg, dcfg, "ddtree", auto_sizes=(0, 2, 4, 8), lookup=2,
               auto_costs=CostTable(verify=((1, 1.0), (9, 2.6)), draft=(("ddtree", 0.5),)))
    policy = AutoPolicy(cfg, batch=2)
    assert policy.can_pay and policy.lookup_can_pay
    ar, live = policy.ar_rate, jnp.array([True, True])
    N = 8

    def lookup_of(p):   # a lookup-only draft whose nodes are each accepted with odds p
        p_BN = jnp.full((2, N), p, jnp.float32)
        return Draft(jnp.zeros((2, N), jnp.int32), jnp.full((2, N), -1, jnp.int32),
                     jnp.zeros((2, N), jnp.int32), p_BN > 0, jnp.ones((2, N + 1, N + 1), bool),
                     jnp.log(jnp.cumprod(p_BN, axis=1)))

    good = policy.init()._replace(rate=jnp.float32(1.5 * ar))   # drafted rounds pay 1.5x
    strong = policy.choose(good, lookup_of(0.97), live, lookup=True)   # a text being copied
    assert int(strong.index) > 0
    expected = float(policy.expected_rate(strong, live))
    assert expected > 1.5 * ar
    assert bool(policy.wants_draft(good)) and not bool(policy.wants_draft(good, strong, live))
    # the same lookup paths against drafted rounds that deliver more: the drafter runs
    better = good._replace(rate=jnp.float32(1.01 * expected))
    assert bool(policy.wants_draft(better, strong, live))
    # no lookup path worth a verify: as without lookup (draft while rate >= the AR rate)
    weak = policy.choose(good, lookup_of(0.05), live, lookup=True)
    assert int(weak.index) == 0
    assert float(policy.expected_rate(weak, live)) == pytest.approx(ar)
    assert bool(policy.wants_draft(good, weak, live))
    low = good._replace(rate=jnp.float32(0.8 * ar))
    assert not bool(policy.wants_draft(low, weak, live))
    # rate learns what the drafter delivers by itself: a drafted round whose lookup paths alone
    # were worth a verify leaves it; one whose paths were not updates it
    choice = policy.choose(good, lookup_of(0.97), live)
    args = (good, jnp.bool_(True), choice, jnp.array([9, 9]), jnp.array([8, 8]),
            jnp.array([True, True]), live)
    assert float(policy.update(*args, lookup=strong).rate) == float(good.rate)
    assert float(policy.update(*args, lookup=weak).rate) > float(good.rate)
    assert float(policy.update(*args).rate) > float(good.rate)
