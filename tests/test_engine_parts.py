"""The parts ``DominoTreeRollout`` is composed of, each on its own (no decode, no tunix):
prompts into padded batches and decoded rows back (``engine_batches``, ``engine_tokenizer``),
the parameters' placement and updates (``engine_params``), PRNG keys and the ``DecodeConfig`` of
a ``RolloutConfig`` (``engine_programs``), the carried ``budget="auto"`` states and the reprobe
rule (``auto_probe``), and the metrics (``engine_metrics``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from dominotree_jax.rollout import RolloutConfig, TunixCausalLM
from dominotree_jax.rollout.auto_probe import REPROBE_GAIN, AutoProbe
from dominotree_jax.rollout.engine_batches import (next_pow2, pad_prompts, prompt_batch,
                                                   prompt_pads_for, rollout_output,
                                                   row_stop_array, shared_prefill_rows, stop_ids)
from dominotree_jax.rollout.engine_metrics import LastRollout, tunix_metrics
from dominotree_jax.rollout.engine_params import (merged_target_params, placed_like, target_of,
                                                  without_explicit_axes)
from dominotree_jax.rollout.engine_programs import decode_config_for, key_of_seed
from dominotree_jax.rollout.engine_tokenizer import RolloutTokenizer, prompt_ids
from dominotree_jax.rollout.placement import BatchPlacement
from spec_fixtures import IntTokenizer, tiny_pair

HERE = BatchPlacement(None)   # one device, no mesh: rows stay where they are


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


class HFTokenizer:
    """A Hugging Face style tokenizer: ``*_token_id`` attributes, no pad token, BOS 1."""
    bos_token_id, eos_token_id, pad_token_id = 1, 2, None

    def encode(self, text):
        return [1] + [int(t) for t in text.split()]   # (adds BOS itself, as HF's do)

    def decode(self, ids):
        return "/".join(map(str, ids))


def test_tokenizers_of_either_style_encode_as_tunix_sampler():
    hf, tx = RolloutTokenizer(HFTokenizer()), RolloutTokenizer(IntTokenizer())
    assert hf.hf and not tx.hf
    assert (hf.eos_id(), hf.pad_id()) == (2, 2)          # no pad token: its EOS
    assert (tx.eos_id(), tx.pad_id()) == (0, 0)
    assert hf.encode_prompt("1 5 6") == [1, 5, 6]         # one BOS, however many were added
    assert tx.encode_prompt("5 6") == [5, 6]              # no BOS id: none prepended
    assert hf.decode(np.array([5, 6])) == "5/6"
    assert prompt_ids(np.array(["7 8"]), tx) == [7, 8]    # tunix's learners' [1] arrays
    assert prompt_ids(np.array([[3], [4]]), None) == [3, 4]
    with pytest.raises(ValueError, match="one string"):
        prompt_ids(np.array(["1", "2"]), tx)
    with pytest.raises(ValueError, match="need a tokenizer"):
        prompt_ids("1 2", None)
    with pytest.raises(ValueError, match="empty prompt"):
        prompt_ids([], None)


def test_prompts_are_right_padded_for_the_target_and_left_padded_for_tunix():
    batch = pad_prompts([[5, 0, 6], [7]], 4, pad=0, drop_pads=False, place=HERE)
    np.testing.assert_array_equal(batch.prompt_BT, [[5, 0, 6, 0], [7, 0, 0, 0]])
    np.testing.assert_array_equal(batch.left_BT, [[0, 5, 0, 6], [0, 0, 0, 7]])
    np.testing.assert_array_equal(batch.lengths_B, [3, 1])
    assert batch.size == 2 and batch.prompt_BT.dtype == np.int32
    # "drop": the target conditions on the prompt without its pad ids (a prompt of pads keeps
    # its last); tunix's left-padded prompts stay as given
    drop = pad_prompts([[5, 0, 6], [0, 0]], 4, pad=0, drop_pads=True, place=HERE)
    np.testing.assert_array_equal(drop.prompt_BT, [[5, 6, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(drop.lengths_B, [2, 1])
    np.testing.assert_array_equal(drop.left_BT, [[0, 5, 0, 6], [0, 0, 0, 0]])
    # a prompt longer than max_prompt_length widens the window to a power of two, never cuts
    wide = pad_prompts([list(range(1, 6))], 3, pad=9, drop_pads=False, place=HERE)
    assert wide.prompt_BT.shape == (1, 8) and wide.prompt_BT[0, 5:].tolist() == [9, 9, 9]
    assert [next_pow2(n) for n in (0, 1, 2, 3, 5, 8)] == [1, 1, 2, 4, 8, 8]
    text = prompt_batch(["5 0 6", "7"], 4, RolloutTokenizer(IntTokenizer()), "drop", HERE)
    np.testing.assert_array_equal(text.prompt_BT, [[5, 6, 0, 0], [7, 0, 0, 0]])
    ids = prompt_batch([[5, 0, 6]], 4, None, "drop", HERE)   # no tokenizer: pad 0, kept
    np.testing.assert_array_equal(ids.prompt_BT, [[5, 0, 6, 0]])


def test_prompt_pads_defaults_to_the_actors_reading_and_refuses_another(pair):
    tcfg, _, params = pair
    plain = TunixCausalLM.from_params(tcfg, params["target"])
    keeping = TunixCausalLM.from_params(tcfg, params["target"], 0)
    assert prompt_pads_for(plain, None, IntTokenizer()) == "drop"
    assert prompt_pads_for(keeping, None, IntTokenizer()) == "keep"
    assert prompt_pads_for(object(), None, None) == "keep"
    with pytest.raises(ValueError, match="disagrees"):
        prompt_pads_for(plain, "keep", IntTokenizer())
    with pytest.raises(ValueError, match="must be one of"):
        prompt_pads_for(object(), "skip", None)
    with pytest.raises(ValueError, match="not the tokenizer's pad id"):
        prompt_pads_for(TunixCausalLM.from_params(tcfg, params["target"], 3), None,
                        IntTokenizer())


def test_stop_ids_and_per_row_stops():
    tok = RolloutTokenizer(HFTokenizer())
    assert stop_ids(RolloutConfig(eos_tokens=None), tok) == (2,)      # EOS (also the pad)
    assert stop_ids(RolloutConfig(eos_tokens=[7, 8]), tok) == (7, 8, 2)
    assert stop_ids(RolloutConfig(eos_tokens=None), None) == ()
    assert row_stop_array(None, 2, 64, HERE) is None
    stops_Be = row_stop_array([[3, 4, 5], []], 2, 64, HERE)
    np.testing.assert_array_equal(stops_Be, [[3, 4, 5, -1], [-1, -1, -1, -1]])
    assert row_stop_array([[], []], 2, 64, HERE).shape == (2, 1)
    with pytest.raises(ValueError, match="one list per prompt"):
        row_stop_array([[3]], 2, 64, HERE)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        row_stop_array([[64], [-1]], 2, 64, HERE)


def test_shared_prefill_finds_the_repeated_prompts():
    prompt_BT = np.array([[5, 6, 0], [7, 0, 0], [5, 6, 9], [7, 0, 1]], np.int32)
    assert shared_prefill_rows(prompt_BT, np.array([2, 1, 3, 2], np.int32)) is None
    lengths_B = np.array([2, 1, 2, 1], np.int32)   # rows 2 and 3 repeat rows 0 and 1
    distinct_UT, lengths_U, rows_B = shared_prefill_rows(prompt_BT, lengths_B)
    np.testing.assert_array_equal(distinct_UT, prompt_BT[:2])
    np.testing.assert_array_equal(lengths_U, [2, 1])
    np.testing.assert_array_equal(rows_B, [0, 1, 0, 1])


def test_rollout_output_cuts_each_row_at_its_first_stop():
    tokens_BY = np.array([[4, 5, 2, 6], [7, 8, 9, 3], [4, 4, 4, 4]], np.int32)
    num_B = np.array([4, 4, 2], np.int32)
    logp_BY = -np.arange(12, dtype=np.float32).reshape(3, 4)
    left_BT = np.zeros((3, 2), np.int32)
    out = rollout_output(tokens_BY, num_B, logp_BY, (2,), np.array([[-1], [9], [-1]]), left_BT,
                         RolloutTokenizer(IntTokenizer()))
    assert [t.tolist() for t in out.tokens] == [[4, 5], [7, 8], [4, 4]]
    assert [lp.tolist() for lp in out.logprobs] == [[0, -1], [-4, -5], [-8, -9]]
    assert out.text == ["4 5", "7 8", "4 4"] and out.left_padded_prompt_tokens is left_BT
    bare = rollout_output(tokens_BY, num_B, None, (), None, left_BT, None)
    assert bare.logprobs is None and bare.text == ["", "", ""]
    assert [len(t) for t in bare.tokens] == [4, 4, 2]


def test_explicit_mesh_arrays_move_to_auto_axes_and_others_stay():
    tree = {"a": jnp.ones((2, 3)), "b": None}
    assert without_explicit_axes(tree) is tree and without_explicit_axes(None) is None
    mesh = jax.make_mesh((1,), ("data",), axis_types=(AxisType.Explicit,))
    x = jax.device_put(jnp.arange(4.0), NamedSharding(mesh, P("data")))
    moved = without_explicit_axes({"x": x, "y": jnp.zeros(2)})
    assert moved["x"].sharding.mesh.axis_types == (AxisType.Auto,)
    assert moved["x"].sharding.spec == P("data")
    np.testing.assert_array_equal(moved["x"], x)


def test_parameter_updates_merge_cast_and_keep_the_placement(pair):
    tcfg, dcfg, params = pair
    actor = TunixCausalLM.from_params(tcfg, params["target"])
    cfg, state = target_of(actor)
    assert cfg == tcfg and isinstance(state, nnx.State)
    with pytest.raises(TypeError, match="rollout_actor"):
        target_of(object())
    pure = nnx.to_pure_dict(state)
    new = {"embed_tokens": {"weight": np.zeros_like(pure["embed_tokens"]["weight"],
                                                    np.float64)}}
    merged = merged_target_params(state, new)   # a subset: the rest stays
    merged_pure = nnx.to_pure_dict(merged)
    assert not np.any(merged_pure["embed_tokens"]["weight"])
    assert merged_pure["embed_tokens"]["weight"].dtype == pure["embed_tokens"]["weight"].dtype
    np.testing.assert_array_equal(merged_pure["norm"]["weight"], pure["norm"]["weight"])
    assert np.any(nnx.to_pure_dict(state)["embed_tokens"]["weight"])   # not changed in place
    with pytest.raises(ValueError, match="has shape"):
        merged_target_params(state, {"norm": {"weight": np.zeros(3)}})
    drafter = {"w": jnp.ones((2, 3), jnp.bfloat16)}
    placed = placed_like({"w": np.arange(6.0)}, drafter)
    assert placed["w"].shape == (2, 3) and placed["w"].dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="structure"):
        placed_like({"w": 1, "v": 2}, drafter)


def test_keys_of_seeds():
    assert key_of_seed(None) is None
    k = key_of_seed(3)
    assert jnp.issubdtype(k.dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(k),
                                  jax.random.key_data(key_of_seed(jax.random.PRNGKey(3))))
    assert key_of_seed(k) is k


def test_auto_states_are_carried_per_config_and_rows_and_the_refresh_reprobes_on_a_gain(pair):
    tcfg, dcfg, _ = pair
    rc = RolloutConfig(max_tokens_to_generate=8, temperature=0.0, top_p=None, top_k=-1)
    auto = decode_config_for(tcfg, rc, (0,), False, dict(drafter=dcfg, method="dominotree",
                                                          budget="auto", auto_sizes=(0, 2, 4)))
    fixed = decode_config_for(tcfg, rc, (0,), False, dict(drafter=dcfg, method="dominotree",
                                                           budget=4))
    assert auto.is_auto and auto.stop_ids == (0,) and auto.top_k == 0 and auto.top_p == 1.0
    assert not auto.logprobs_filtered
    probe = AutoProbe()
    assert probe.start_state(fixed, 2) is None
    first = probe.start_state(auto, 2)
    assert isinstance(first.since, np.ndarray)   # host values
    probe.carry(fixed, 2, first)
    assert probe.states == {}
    carried = first._replace(since=np.int32(5), gap=np.int32(8))
    probe.carry(auto, 2, carried)
    assert int(probe.start_state(auto, 2).since) == 5
    assert int(probe.start_state(auto, 4).since) == int(first.since)   # another batch size
    probe.probe_all()
    assert int(probe.states[(auto, 2)].since) == 7
    saved = probe.checkpoint_state()
    assert saved["probed_tau"] == -1.0
    assert probe.refresh_probes(2.0) and probe.probed_tau == 2.0       # the first refresh
    assert not probe.refresh_probes(2.0 * REPROBE_GAIN * 0.99) and probe.probed_tau == 2.0
    assert probe.refresh_probes(2.0 * REPROBE_GAIN) and probe.probed_tau == 2.0 * REPROBE_GAIN
    other = AutoProbe()
    other.restore_checkpoint_state({**probe.checkpoint_state(), "key": None})
    assert other.probed_tau == probe.probed_tau and list(other.states) == [(auto, 2)]
    other.restore_checkpoint_state({"auto_states": {}})            # saved before probed_tau
    assert other.probed_tau is None and other.states == {}


class FakeDecodeOutput:
    """What ``LastRollout`` reads of a ``DecodeOutput``."""
    draft_sizes = jnp.array([[3, -1], [5, 1]])   # -1: no round
    num_tokens = jnp.array([4, 2])

    def mean_tau(self):
        return jnp.float32(2.5)


def test_metrics_of_the_latest_rollout_and_refresh_step():
    assert tunix_metrics(None, []) == {}
    last = LastRollout(None, None, FakeDecodeOutput(), 0.25)
    assert (last.tau, last.num_tokens, last.mean_draft_size) == (2.5, 6, 3.0)
    m = tunix_metrics(last, [])
    assert m == {"rollout/tau": (2.5, np.mean), "rollout/draft_size": (3.0, np.mean),
                 "rollout/seconds": (0.25, np.sum)}
    step = {"loss": 1.5, "chain_tau_before": 1.2, "seconds": 0.1, "logits_bytes": 64}
    m = tunix_metrics(last, [{"loss": 9.0}, step])
    assert m["refresh/loss"] == (1.5, np.mean) and m["refresh/temp_bytes"] == (0, np.max)
    assert m["refresh/logits_bytes"] == (64, np.max) and len(m) == 8
