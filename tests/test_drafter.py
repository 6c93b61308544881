"""Drafter (docs/algorithm.md §2–3): parity with the NumPy reference, checkpoint round trip,
refusals."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from convert.drafter import load_drafter, save_drafter
from convert.errors import CheckpointError
from convert.params import fill_state
from convert.safetensors_io import read_safetensors, write_safetensors
from dominotree_jax.model.state import flat_names, state_to_flat
from dominotree_jax.config import (ConfigError, DrafterConfig, TargetConfig, check_pair,
                                   default_tap_layers)
from dominotree_jax.domino_head import dflash_chain, domino_chain
from dominotree_jax.model.drafter import (DrafterContext, bind_drafter, drafter_graphdef,
                                          init_drafter_params)
from dominotree_jax.model.target import bind_target, target_graphdef

import drafter_reference as ref  # a sibling module (tests/ is on pytest's pythonpath)

TCFG = TargetConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, qk_norm=True,
                    rope_theta=10000.0, architecture="Qwen3ForCausalLM")
MAX_LEN = 32
CTX_LEN = np.array([9, 5])          # committed context per batch row
PIECE1 = np.array([6, 3])           # rows committed by the first extend (second: the rest)
T_PIECE = 6                         # rows written per extend (the extra ones are garbage)


def drafter_cfg(block_size=4, shift_label=False, domino=False, **kw):
    base = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, block_size=block_size,
                mask_token_id=127, num_target_layers=4, target_layer_ids=(1, 3),
                rope_theta=10000.0, shift_label=shift_label)
    if domino:
        base.update(projector_type="domino", gru_hidden_dim=24, emb_dim=32,
                    pure_draft_prefix_len=1)
    base.update(kw)
    return DrafterConfig(**base)


def _random_flat(names_shapes, seed, scales=None):
    """Weights with non-trivial scales: matrices ~ N(0, 1/fan_in), norms ~ 1 + 0.2 N(0, 1)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in sorted(names_shapes.items()):
        if len(shape) == 1:
            a = 1.0 + 0.2 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) / np.sqrt(shape[1])
        out[name] = (a * (scales or {}).get(name, 1.0)).astype(np.float32)
    return out


@pytest.fixture(scope="module")
def target():
    _, abstract = target_graphdef(TCFG, "float32")
    names = flat_names(abstract)
    flat = _random_flat(names, seed=1, scales={"embed_tokens.weight": 8.0,
                                               "lm_head.weight": 4.0})
    params = fill_state(abstract, flat, "random target", jnp.float32)
    return params, flat


def random_drafter(cfg, seed=2):
    _, abstract = drafter_graphdef(cfg, "float32")
    flat = _random_flat(flat_names(abstract), seed, scales={"embed_proj.2.weight": 4.0})
    return fill_state(abstract, flat, "random drafter", jnp.float32), flat


def _features(cfg, seed=3):
    rng = np.random.default_rng(seed)
    F = cfg.num_taps * cfg.hidden_size
    return rng.standard_normal((2, MAX_LEN, F)).astype(np.float32)


def _jax_draft(cfg, dparams, tparams, feats, t0):
    """Extend the context in two pieces (garbage rows past num_new), then draft at its end."""
    rng = np.random.default_rng(4)
    batch = feats.shape[0]

    def piece(start, n_new):
        rows = np.stack([feats[b, start[b]:start[b] + T_PIECE] for b in range(batch)])
        junk = 100.0 * rng.standard_normal(rows.shape).astype(np.float32)
        keep = np.arange(T_PIECE)[None, :, None] < n_new[:, None, None]
        pos = start[:, None] + np.arange(T_PIECE)[None]
        return np.where(keep, rows, junk), pos.astype(np.int32)

    @jax.jit
    def run(dparams, tparams, f1, p1, f2, p2, t0):
        d = bind_drafter(cfg, dparams)
        tgt = bind_target(TCFG, tparams)
        ctx = DrafterContext.zeros(cfg, batch, MAX_LEN)
        zero = jnp.zeros((batch,), jnp.int32)
        ctx = d.extend_context(ctx, f1, p1, zero, jnp.asarray(PIECE1, jnp.int32))
        ctx = d.extend_context(ctx, f2, p2, jnp.asarray(PIECE1, jnp.int32),
                               jnp.asarray(CTX_LEN - PIECE1, jnp.int32))
        z, base = d.draft(tgt, ctx, t0, ctx.length)
        out = (ctx.length, z, base) + dflash_chain(base)
        if cfg.is_domino:
            out += domino_chain(d.head_weights(tgt), z, base, t0, cfg.pure_draft_prefix_len)
        return out

    f1, p1 = piece(np.zeros(batch, np.int64), PIECE1)
    f2, p2 = piece(PIECE1, CTX_LEN - PIECE1)
    return run(dparams, tparams, f1, p1, f2, p2, jnp.asarray(t0, jnp.int32))


def _ref_draft(cfg, dflat, tflat, feats, t0):
    zs, bases = [], []
    for b in range(feats.shape[0]):
        z, base = ref.draft_block(
            dflat, tflat["embed_tokens.weight"], tflat["lm_head.weight"], feats[b, :CTX_LEN[b]],
            int(t0[b]), int(CTX_LEN[b]), num_layers=cfg.num_hidden_layers,
            num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim, eps=cfg.rms_norm_eps, theta=cfg.rope_theta,
            block_size=cfg.block_size, mask_token_id=cfg.mask_token_id,
            shift_label=cfg.shift_label)
        zs.append(z)
        bases.append(base)
    return np.stack(zs), np.stack(bases)


def _rel(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("shift_label", [False, True])
@pytest.mark.parametrize("block_size", [2, 4, 16])
def test_draft_matches_reference(target, block_size, shift_label):
    tparams, tflat = target
    cfg = drafter_cfg(block_size, shift_label)
    dparams, dflat = random_drafter(cfg)
    feats = _features(cfg)
    t0 = np.array([17, 42])
    length, z, base, tok, lp = _jax_draft(cfg, dparams, tparams, feats, t0)
    z_ref, base_ref = _ref_draft(cfg, dflat, tflat, feats, t0)
    K = cfg.num_draft_positions
    assert K == (block_size if shift_label else block_size - 1)
    assert z.shape == (2, K, 64) and base.shape == (2, K, 128) and base.dtype == jnp.float32
    np.testing.assert_array_equal(length, CTX_LEN)
    assert _rel(z, z_ref) <= 1e-5, _rel(z, z_ref)
    assert _rel(base, base_ref) <= 1e-5, _rel(base, base_ref)
    np.testing.assert_array_equal(tok, np.argmax(base_ref, -1))
    np.testing.assert_allclose(lp, np.max(ref.log_softmax(base_ref), -1), atol=1e-5)


def test_context_is_what_the_block_sees(target):
    """Different committed context → different draft; garbage past ``length`` → no effect."""
    tparams, _ = target
    cfg = drafter_cfg(4)
    dparams, _ = random_drafter(cfg)

    @jax.jit
    def z_for(dparams, feats):
        d, tgt = bind_drafter(cfg, dparams), bind_target(TCFG, tparams)
        pos = jnp.broadcast_to(jnp.arange(8, dtype=jnp.int32), (2, 8))
        ctx = d.extend_context(DrafterContext.zeros(cfg, 2, MAX_LEN), feats, pos,
                               jnp.zeros((2,), jnp.int32), jnp.array([5, 5], jnp.int32))
        return d.draft(tgt, ctx, jnp.array([3, 4]), ctx.length)[0]

    feats = jnp.asarray(_features(cfg)[:, :8])
    z_a = z_for(dparams, feats)
    np.testing.assert_array_equal(z_a, z_for(dparams, feats.at[:, 5:].set(7.0)))
    assert float(jnp.max(jnp.abs(z_a - z_for(dparams, feats.at[:, 2].set(7.0))))) > 1e-3
    # bfloat16 drafter parameters run the same computation to bf16 precision; the hidden
    # states stay float32 (the precision policy: bf16 only at the products' inputs)
    z_bf16 = z_for(jax.tree.map(lambda x: x.astype(jnp.bfloat16), dparams), feats)
    assert z_bf16.dtype == jnp.float32
    assert _rel(z_bf16.astype(jnp.float32), np.asarray(z_a, np.float64)) < 5e-2


@pytest.mark.parametrize("shift_label,block_size,prefix_len",
                         [(True, 16, 1), (False, 4, 1), (True, 4, 0), (True, 4, 2)])
def test_domino_chain_matches_reference(target, shift_label, block_size, prefix_len):
    tparams, tflat = target
    cfg = drafter_cfg(block_size, shift_label, domino=True, pure_draft_prefix_len=prefix_len)
    dparams, dflat = random_drafter(cfg)
    feats = _features(cfg)
    t0 = np.array([17, 42])
    _, z, base, base_tok, _, tok, lp = _jax_draft(cfg, dparams, tparams, feats, t0)
    z_ref, base_ref = _ref_draft(cfg, dflat, tflat, feats, t0)
    assert _rel(base, base_ref) <= 1e-5
    for b in range(2):
        tok_ref, lp_ref = ref.domino_chain(dflat, tflat["embed_tokens.weight"], z_ref[b],
                                           base_ref[b], int(t0[b]), prefix_len)
        np.testing.assert_array_equal(tok[b], tok_ref)
        np.testing.assert_allclose(lp[b], lp_ref, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(tok[:, :prefix_len], base_tok[:, :prefix_len])
    if block_size == 16:  # the correction must actually change some choices
        assert np.any(np.asarray(tok) != np.asarray(base_tok))


# --------------------------------------------------------------------------- config

def test_default_tap_layers_and_config_fields():
    assert default_tap_layers(36, 5) == (1, 9, 17, 25, 33)
    assert default_tap_layers(28, 1) == (14,)
    hf = drafter_cfg(16, domino=True).to_hf_dict()
    del hf["dflash_config"]["target_layer_ids"]
    hf["num_target_layers"] = 36
    assert DrafterConfig.from_hf_dict(hf).target_layer_ids == (1, 33)
    # Domino fields accepted at the top level too
    flat = {k: v for k, v in hf.items() if k != "dflash_config"}
    flat.update(mask_token_id=127, projector_type="domino", gru_hidden_dim=24, emb_dim=32,
                pure_draft_prefix_len=1, shift_label=True, target_layer_ids=[1, 3])
    cfg = DrafterConfig.from_hf_dict(flat)
    assert cfg == drafter_cfg(16, shift_label=True, domino=True, num_target_layers=36)
    assert cfg.num_draft_positions == 16 and hash(cfg) == hash(drafter_cfg(
        16, shift_label=True, domino=True, num_target_layers=36))
    hf.pop("block_size")
    with pytest.raises(ConfigError, match="block_size"):
        DrafterConfig.from_hf_dict(hf)


def test_flat_names_are_checkpoint_names():
    names = set(flat_names(drafter_graphdef(drafter_cfg(domino=True), "float32")[1]))
    expected = {"fc.weight", "hidden_norm.weight", "norm.weight", "prefix_gru.weight_ih_l0",
                "prefix_gru.weight_hh_l0", "embed_proj.0.weight", "embed_proj.2.weight"}
    for i in range(2):
        p = f"layers.{i}."
        expected |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
        expected |= {p + f"self_attn.{n}.weight" for n in
                     ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")}
        expected |= {p + f"mlp.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")}
    assert names == expected
    plain = set(flat_names(drafter_graphdef(drafter_cfg(), "float32")[1]))
    assert plain == {n for n in expected if not n.startswith(("prefix_gru", "embed_proj"))}


# --------------------------------------------------------------------------- checkpoints

@pytest.mark.parametrize("domino", [False, True])
def test_round_trip_float32(tmp_path, domino):
    cfg = drafter_cfg(16, shift_label=domino, domino=domino)
    params = init_drafter_params(cfg, seed=5)
    save_drafter(str(tmp_path), cfg, params, dtype="float32")
    cfg2, params2 = load_drafter(str(tmp_path), target_cfg=TCFG)
    assert cfg2 == cfg
    a, b = state_to_flat(params), state_to_flat(params2)
    assert a.keys() == b.keys()
    for n in a:
        np.testing.assert_array_equal(a[n], b[n], err_msg=n)


def test_round_trip_bfloat16_and_model_prefix(tmp_path):
    cfg = drafter_cfg(4, domino=True)
    params = init_drafter_params(cfg, seed=6)
    save_drafter(str(tmp_path), cfg, params)  # bfloat16 by default
    stored = read_safetensors(str(tmp_path / "model.safetensors"))
    assert all(a.dtype == ml_dtypes.bfloat16 for a in stored.values())
    cfg2, params2 = load_drafter(str(tmp_path), dtype="bfloat16")
    a, b = state_to_flat(params), state_to_flat(params2)
    for n in a:
        np.testing.assert_array_equal(a[n].astype(ml_dtypes.bfloat16), b[n], err_msg=n)
    write_safetensors(str(tmp_path / "model.safetensors"),
                      {"model." + n: np.array(v) for n, v in stored.items()})
    _, params3 = load_drafter(str(tmp_path), dtype=None)
    for n, v in state_to_flat(params3).items():
        np.testing.assert_array_equal(v, b[n])


def test_bad_tensors_listed_in_one_error(tmp_path):
    cfg = drafter_cfg(4, domino=True)
    save_drafter(str(tmp_path), cfg, init_drafter_params(cfg), dtype="float32")
    path = str(tmp_path / "model.safetensors")
    t = {n: np.array(v) for n, v in read_safetensors(path).items()}
    del t["layers.1.mlp.up_proj.weight"]
    t["lm_head.weight"] = np.zeros((128, 64), np.float32)
    t["fc.weight"] = np.zeros((64, 64), np.float32)
    write_safetensors(path, t)
    with pytest.raises(CheckpointError) as e:
        load_drafter(str(tmp_path))
    msg = str(e.value)
    assert "missing tensor: layers.1.mlp.up_proj.weight" in msg
    assert "unexpected tensor: lm_head.weight" in msg
    assert "shape mismatch: fc.weight: expected (64, 128), found (64, 64)" in msg


@pytest.mark.parametrize("change,target_change,needle", [
    ({"hidden_size": 32, "head_dim": 8}, {}, "hidden size differs: drafter 32, target 64"),
    ({"vocab_size": 256}, {}, "vocab size differs: drafter 256, target 128"),
    ({}, {"vocab_size": 100}, "vocab size differs: drafter 128, target 100"),
    ({"target_layer_ids": (1, 4)}, {}, "tap layer(s) [4] outside the target's 4 layers"),
    ({"mask_token_id": 128}, {}, "mask_token_id=128 is outside the vocabulary"),
    ({"block_size": 1}, {}, "block_size=1 is too small"),
])
def test_check_pair_refusals(change, target_change, needle):
    tcfg = dataclasses.replace(TCFG, **target_change)
    with pytest.raises(ConfigError) as e:
        check_pair(tcfg, drafter_cfg(**change))
    assert needle in str(e.value)


def test_check_pair_lists_every_problem_and_accepts_a_good_pair():
    check_pair(TCFG, drafter_cfg())
    with pytest.raises(ConfigError) as e:
        check_pair(TCFG, drafter_cfg(block_size=1, mask_token_id=-1, target_layer_ids=(9,)))
    msg = str(e.value)
    for needle in ("block_size=1", "mask_token_id=-1", "tap layer(s) [9]"):
        assert needle in msg


def test_load_refuses_mismatched_pair_and_bad_config(tmp_path):
    cfg = drafter_cfg(4)
    save_drafter(str(tmp_path), cfg, init_drafter_params(cfg), dtype="float32")
    with pytest.raises(ConfigError, match="hidden size differs"):
        load_drafter(str(tmp_path), target_cfg=dataclasses.replace(
            TCFG, hidden_size=32, intermediate_size=64))
    hf = json.loads((tmp_path / "config.json").read_text())
    hf["block_size"] = 1
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ConfigError, match="block_size=1 is too small"):
        load_drafter(str(tmp_path))
    hf["block_size"] = 4
    del hf["dflash_config"]["mask_token_id"]
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ConfigError, match="mask_token_id"):
        load_drafter(str(tmp_path))
