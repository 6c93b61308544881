"""The MoE blocks (model/moe.py) and the MXFP4 dequantisation (model/mxfp4.py) against
transformers' own modules, on tiny random configurations (torch float32 references)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import GptOssConfig, Qwen3MoeConfig, Qwen3NextConfig
from transformers.integrations.mxfp4 import convert_moe_packed_tensors
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeSparseMoeBlock
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextSparseMoeBlock

from dominotree_jax.model.moe import (FORMS, GptOssMoE, SparseMoE, gpt_oss_expert_params,
                                      softmax_topk, split_gate_up, stack_expert_tensors,
                                      topk_softmax)
from dominotree_jax.model.mxfp4 import dequantize_mxfp4
from dominotree_jax.model.state import flat_names, state_from_flat, state_to_flat

H, I, E, TOP_K, SHARED_I = 48, 24, 8, 2, 40
BF16_REL = 2e-2      # bfloat16 weights and operands against the float32 block


def _rel(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def _randomise(module: torch.nn.Module, seed: int, std: float = 0.1, stds=None):
    """transformers leaves expert weights uninitialised (``torch.empty``) and routers zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            s = (stds or {}).get(name, std)
            p.copy_(torch.randn(p.shape, generator=g) * s)
    return module


def _load(module: nnx.Module, flat: dict, dtype=jnp.float32):
    """Fill ``module`` from checkpoint-named arrays, refusing a missing, extra or misshaped
    name (the names and shapes are the contract the converters rely on)."""
    state = nnx.state(module)
    expected = flat_names(state)
    assert sorted(flat) == sorted(expected), (sorted(flat), sorted(expected))
    for name, shape in expected.items():
        assert tuple(np.shape(flat[name])) == shape, (name, np.shape(flat[name]), shape)
    nnx.update(module, state_from_flat(state, {n: jnp.asarray(np.asarray(a, np.float32), dtype)
                                               for n, a in flat.items()}))
    return module


def _x(hidden: int, seed: int = 1, scale: float = 1.0):
    return (scale * np.random.default_rng(seed).standard_normal((2, 5, hidden))).astype(
        np.float32)


# --------------------------------------------------------------------------- Qwen blocks

QWEN = {
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeSparseMoeBlock, {"norm_topk_prob": False}),
    "qwen3_moe_norm": (Qwen3MoeConfig, Qwen3MoeSparseMoeBlock, {"norm_topk_prob": True}),
    "qwen3_next": (Qwen3NextConfig, Qwen3NextSparseMoeBlock,
                   {"shared_expert_intermediate_size": SHARED_I, "norm_topk_prob": True}),
    "qwen3_5_moe": (Qwen3_5MoeTextConfig, Qwen3_5MoeSparseMoeBlock,
                    {"shared_expert_intermediate_size": SHARED_I}),
}


def _qwen_reference(name: str):
    cfg_cls, block_cls, extra = QWEN[name]
    cfg = cfg_cls(hidden_size=H, moe_intermediate_size=I, num_experts=E,
                  num_experts_per_tok=TOP_K, experts_implementation="eager", **extra)
    return cfg, _randomise(block_cls(cfg).eval(), seed=sorted(QWEN).index(name))


def _qwen_checkpoint(block: torch.nn.Module, fused: bool) -> dict:
    """The block's tensors as a released checkpoint names them (under ``mlp.``): per-expert
    ``experts.{e}.gate_proj.weight`` ..., or the fused ``experts.gate_up_proj``."""
    sd = {k: v.numpy() for k, v in block.state_dict().items()}
    gate_up, down = sd.pop("experts.gate_up_proj"), sd.pop("experts.down_proj")
    if fused:
        return {**sd, "experts.gate_up_proj": gate_up, "experts.down_proj": down}
    for e in range(gate_up.shape[0]):
        sd[f"experts.{e}.gate_proj.weight"] = gate_up[e, :I]
        sd[f"experts.{e}.up_proj.weight"] = gate_up[e, I:]
        sd[f"experts.{e}.down_proj.weight"] = down[e]
    return sd


def _qwen_params(checkpoint: dict) -> dict:
    """Our parameter names from checkpoint names (the converter's mapping)."""
    flat = stack_expert_tensors(checkpoint)
    if "experts.gate_up_proj" in flat:
        flat["experts.gate_proj"], flat["experts.up_proj"] = split_gate_up(
            flat.pop("experts.gate_up_proj"))
    return flat


@pytest.fixture(scope="module", params=sorted(QWEN))
def qwen(request):
    name = request.param
    cfg, block = _qwen_reference(name)
    x = _x(H, seed=3)
    with torch.no_grad():
        ref = block(torch.from_numpy(x)).numpy()
    flat = _qwen_params(_qwen_checkpoint(block, fused=name == "qwen3_5_moe"))
    ours = _load(SparseMoE.from_config(cfg, rngs=nnx.Rngs(0)), flat)
    return name, cfg, flat, x, ref, ours, block


@pytest.mark.parametrize("form", FORMS)
def test_qwen_matches_transformers(qwen, form):
    name, _, _, x, ref, ours, _ = qwen
    y = ours(jnp.asarray(x), form=form)
    assert y.shape == x.shape and y.dtype == jnp.float32
    assert _rel(y, ref) <= 1e-5, (name, form, _rel(y, ref))


def test_qwen_forms_agree_and_jit(qwen):
    name, _, _, x, _, ours, _ = qwen
    ragged, gather, by_expert = (np.asarray(ours(jnp.asarray(x), form=f)) for f in FORMS)
    np.testing.assert_allclose(ragged, gather, rtol=0, atol=1e-6)
    np.testing.assert_allclose(by_expert, gather, rtol=0, atol=1e-6)
    graphdef, state = nnx.split(ours)
    for form in FORMS:
        run = jax.jit(lambda s, x, form=form: nnx.merge(graphdef, s)(x, form=form))
        np.testing.assert_allclose(np.asarray(run(state, jnp.asarray(x))), ragged, rtol=0,
                                   atol=1e-6)


def test_qwen_bfloat16(qwen):
    """bfloat16 weights run both forms (float32 output) within BF16_REL of float32."""
    name, cfg, flat, x, ref, _, _ = qwen
    ours = _load(SparseMoE.from_config(cfg, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)), flat,
                 jnp.bfloat16)
    assert ours.experts.gate_proj[...].dtype == jnp.bfloat16
    outs = [np.asarray(ours(jnp.asarray(x), form=f)) for f in FORMS]
    for y in outs:
        assert y.dtype == np.float32 and _rel(y, ref) <= BF16_REL, (name, _rel(y, ref))
    np.testing.assert_allclose(outs[0], outs[1], rtol=0, atol=1e-5)
    np.testing.assert_allclose(outs[2], outs[1], rtol=0, atol=1e-5)


def test_qwen_routing_matches_transformers(qwen):
    name, _, _, x, _, ours, block = qwen
    with torch.no_grad():
        _, ref_w, ref_ids = block.gate(torch.from_numpy(x.reshape(-1, H)))
    w, ids = ours.route(jnp.asarray(x.reshape(-1, H)))
    np.testing.assert_array_equal(np.asarray(ids), ref_ids.numpy())
    np.testing.assert_allclose(np.asarray(w), ref_w.numpy(), rtol=1e-6, atol=1e-7)


def test_parameter_names_and_shapes():
    """The documented names and ``[out, in]`` shapes (model/moe.py's docstring)."""
    plain = SparseMoE(H, I, E, TOP_K, rngs=nnx.Rngs(0))
    assert flat_names(nnx.state(plain)) == {
        "gate.weight": (E, H), "experts.gate_proj": (E, I, H), "experts.up_proj": (E, I, H),
        "experts.down_proj": (E, H, I)}
    shared = SparseMoE(H, I, E, TOP_K, shared_intermediate=SHARED_I, rngs=nnx.Rngs(0))
    assert flat_names(nnx.state(shared)) == {
        **flat_names(nnx.state(plain)), "shared_expert.gate_proj.weight": (SHARED_I, H),
        "shared_expert.up_proj.weight": (SHARED_I, H),
        "shared_expert.down_proj.weight": (H, SHARED_I), "shared_expert_gate.weight": (1, H)}
    gpt = GptOssMoE(H, I, E, TOP_K, rngs=nnx.Rngs(0))
    assert flat_names(nnx.state(gpt)) == {
        "router.weight": (E, H), "router.bias": (E,), "experts.gate_proj": (E, I, H),
        "experts.gate_proj_bias": (E, I), "experts.up_proj": (E, I, H),
        "experts.up_proj_bias": (E, I), "experts.down_proj": (E, H, I),
        "experts.down_proj_bias": (E, H)}


def test_stack_expert_tensors():
    rng = np.random.default_rng(0)
    per = {f"model.layers.{l}.mlp.experts.{e}.{p}.weight": rng.standard_normal((3, 2))
           for l in range(2) for e in range(4) for p in ("gate_proj", "up_proj", "down_proj")}
    per["model.layers.0.mlp.gate.weight"] = np.ones((4, 2))
    per["model.layers.1.mlp.experts.2.down_proj.bias"] = np.ones(3)
    per["model.layers.1.mlp.experts.0.down_proj.bias"] = np.zeros(3)
    per["model.layers.1.mlp.experts.1.down_proj.bias"] = np.zeros(3)
    per["model.layers.1.mlp.experts.3.down_proj.bias"] = np.zeros(3)
    out = stack_expert_tensors(per)
    assert out["model.layers.0.mlp.gate.weight"] is per["model.layers.0.mlp.gate.weight"]
    assert out["model.layers.1.mlp.experts.up_proj"].shape == (4, 3, 2)
    np.testing.assert_array_equal(out["model.layers.1.mlp.experts.up_proj"][2],
                                  per["model.layers.1.mlp.experts.2.up_proj.weight"])
    np.testing.assert_array_equal(out["model.layers.1.mlp.experts.down_proj_bias"][:, 0],
                                  [0, 0, 1, 0])
    assert len(out) == 2 * 3 + 2
    del per["model.layers.0.mlp.experts.1.gate_proj.weight"]
    with pytest.raises(ValueError, match=r"experts \[1\] are missing"):
        stack_expert_tensors(per)


def test_split_gate_up():
    a = np.arange(2 * 6 * 3).reshape(2, 6, 3)
    gate, up = split_gate_up(a)
    np.testing.assert_array_equal(np.concatenate([gate, up], axis=1), a)
    gate, up = split_gate_up(a, interleaved=True)
    np.testing.assert_array_equal(gate, a[:, 0::2])
    np.testing.assert_array_equal(up, a[:, 1::2])
    gate, up = split_gate_up(a.reshape(2, 18)[:, :6], axis=-1, interleaved=True)
    np.testing.assert_array_equal(up, a.reshape(2, 18)[:, 1:6:2])


# --------------------------------------------------------------------------- gpt-oss

GH, GI = 64, 32   # MXFP4 needs multiples of 32


def _gpt_oss_config():
    return GptOssConfig(hidden_size=GH, intermediate_size=GI, num_local_experts=E,
                        num_experts_per_tok=TOP_K, experts_implementation="eager")


def _gpt_oss_flat(mlp: torch.nn.Module) -> dict:
    sd = {k: v.numpy() for k, v in mlp.state_dict().items()}
    experts = gpt_oss_expert_params(sd["experts.gate_up_proj"], sd["experts.gate_up_proj_bias"],
                                    sd["experts.down_proj"], sd["experts.down_proj_bias"],
                                    transposed=True)
    return {"router.weight": sd["router.weight"], "router.bias": sd["router.bias"],
            **{f"experts.{k}": v for k, v in experts.items()}}


@pytest.fixture(scope="module")
def gpt_oss():
    cfg = _gpt_oss_config()
    # large gate/up weights: a good share of the gate and up pre-activations exceed the
    # clamp limit (7), so the clamp is exercised
    mlp = _randomise(GptOssMLP(cfg).eval(), seed=7,
                     stds={"experts.gate_up_proj": 0.6, "experts.gate_up_proj_bias": 1.0})
    x = _x(GH, seed=4)
    with torch.no_grad():
        gate_up = torch.from_numpy(x.reshape(-1, GH)) @ mlp.experts.gate_up_proj
        ref = mlp(torch.from_numpy(x))[0].numpy()
    share = float((gate_up.abs() > cfg.swiglu_limit).float().mean())
    assert 0.1 < share < 0.9, share
    flat = _gpt_oss_flat(mlp)
    return cfg, mlp, flat, x, ref


@pytest.mark.parametrize("form", FORMS)
def test_gpt_oss_matches_transformers(gpt_oss, form):
    cfg, _, flat, x, ref = gpt_oss
    ours = _load(GptOssMoE.from_config(cfg, rngs=nnx.Rngs(0)), flat)
    y = ours(jnp.asarray(x), form=form)
    assert y.shape == x.shape and y.dtype == jnp.float32
    assert _rel(y, ref) <= 1e-5, (form, _rel(y, ref))


def test_gpt_oss_forms_bfloat16_and_routing(gpt_oss):
    cfg, mlp, flat, x, ref = gpt_oss
    ours = _load(GptOssMoE.from_config(cfg, rngs=nnx.Rngs(0)), flat)
    ragged, gather, by_expert = (np.asarray(ours(jnp.asarray(x), form=f)) for f in FORMS)
    np.testing.assert_allclose(ragged, gather, rtol=0, atol=1e-6 * np.max(np.abs(ref)))
    np.testing.assert_allclose(by_expert, gather, rtol=0, atol=1e-6 * np.max(np.abs(ref)))
    with torch.no_grad():
        _, ref_w, ref_ids = mlp.router(torch.from_numpy(x.reshape(-1, GH)))
    w, ids = ours.route(jnp.asarray(x.reshape(-1, GH)))
    np.testing.assert_array_equal(np.asarray(ids), ref_ids.numpy())
    np.testing.assert_allclose(np.asarray(w), ref_w.numpy(), rtol=1e-6, atol=1e-7)
    bf16 = _load(GptOssMoE.from_config(cfg, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)), flat,
                 jnp.bfloat16)
    for form in FORMS:
        y = np.asarray(bf16(jnp.asarray(x), form=form))
        assert y.dtype == np.float32 and _rel(y, ref) <= BF16_REL, (form, _rel(y, ref))


# --------------------------------------------------------------------------- MXFP4

def _mxfp4(rng, shape, scale_range=(0, 255)):
    """Random ``blocks [*shape[:-1], cols/32, 16]`` and ``scales`` for ``[..., rows, cols]``."""
    *lead, cols = shape
    blocks = rng.integers(0, 256, (*lead, cols // 32, 16), dtype=np.uint8)
    scales = rng.integers(*scale_range, (*lead, cols // 32), dtype=np.uint8)
    return blocks, scales


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mxfp4_matches_transformers(dtype):
    """Every code and every finite scale (0..254; 255 is E8M0's NaN), bit for bit."""
    rng = np.random.default_rng(0)
    blocks, scales = _mxfp4(rng, (3, 30, 96))
    scales.reshape(-1)[:255] = np.arange(255, dtype=np.uint8)
    torch_dtype = getattr(torch, dtype)
    ref = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales),
                                     dtype=torch_dtype).float().numpy()
    np_dtype = np.float32 if dtype == "float32" else ml_dtypes.bfloat16
    ours = dequantize_mxfp4(blocks, scales, np_dtype)
    assert ours.dtype == np_dtype and ours.shape == ref.shape == (3, 96, 30)
    np.testing.assert_array_equal(ours.astype(np.float32), ref)
    np.testing.assert_array_equal(np.signbit(ours.astype(np.float32)), np.signbit(ref))
    out_in = dequantize_mxfp4(blocks, scales, np_dtype, layout="out_in")
    np.testing.assert_array_equal(out_in, np.swapaxes(ours, -1, -2))
    # a known value: byte 0x7A is the low nibble 0xA (-1.0) first, then 0x7 (6.0); scale
    # 128 doubles both
    one = dequantize_mxfp4(np.full((1, 1, 1, 16), 0x7A, np.uint8), np.full((1, 1, 1), 128,
                                                                            np.uint8),
                           layout="out_in")
    np.testing.assert_array_equal(one[0, 0, :4], [-2.0, 12.0, -2.0, 12.0])


def test_mxfp4_refuses_malformed():
    blocks, scales = _mxfp4(np.random.default_rng(0), (2, 4, 64))
    with pytest.raises(ValueError):
        dequantize_mxfp4(blocks, scales[..., :1])
    with pytest.raises(ValueError):
        dequantize_mxfp4(blocks.astype(np.int32), scales)
    with pytest.raises(ValueError):
        dequantize_mxfp4(blocks, scales, layout="in_out")


def test_gpt_oss_from_mxfp4_matches_transformers():
    """A released-style gpt-oss expert layer (``_blocks``/``_scales``) dequantised by
    transformers into ``GptOssMLP`` and by us (``layout="out_in"``) into ``GptOssMoE``."""
    cfg = _gpt_oss_config()
    rng = np.random.default_rng(5)
    gu_blocks, gu_scales = _mxfp4(rng, (E, 2 * GI, GH), (121, 124))
    dn_blocks, dn_scales = _mxfp4(rng, (E, GH, GI), (121, 124))
    mlp = _randomise(GptOssMLP(cfg).eval(), seed=8)
    with torch.no_grad():
        mlp.experts.gate_up_proj.copy_(convert_moe_packed_tensors(
            torch.from_numpy(gu_blocks), torch.from_numpy(gu_scales), dtype=torch.float32))
        mlp.experts.down_proj.copy_(convert_moe_packed_tensors(
            torch.from_numpy(dn_blocks), torch.from_numpy(dn_scales), dtype=torch.float32))
    sd = {k: v.numpy() for k, v in mlp.state_dict().items()}
    experts = gpt_oss_expert_params(
        dequantize_mxfp4(gu_blocks, gu_scales, layout="out_in"), sd["experts.gate_up_proj_bias"],
        dequantize_mxfp4(dn_blocks, dn_scales, layout="out_in"), sd["experts.down_proj_bias"],
        transposed=False)
    flat = {"router.weight": sd["router.weight"], "router.bias": sd["router.bias"],
            **{f"experts.{k}": v for k, v in experts.items()}}
    ours = _load(GptOssMoE.from_config(cfg, rngs=nnx.Rngs(0)), flat)
    x = _x(GH, seed=6)
    with torch.no_grad():
        ref = mlp(torch.from_numpy(x))[0].numpy()
    for form in FORMS:
        assert _rel(ours(jnp.asarray(x), form=form), ref) <= 1e-5, form


# --------------------------------------------------------------------------- ties

@pytest.mark.parametrize("block", ["qwen", "qwen_shared", "gpt_oss"])
def test_equal_router_logits(block):
    """A zero router (every logit equal) and partly tied logits: the lowest ids win, the
    weights are uniform over the k, both forms agree and nothing is NaN."""
    if block == "gpt_oss":
        moe = GptOssMoE(GH, GI, E, TOP_K, rngs=nnx.Rngs(1))
        hidden, router = GH, moe.router
    else:
        moe = SparseMoE(H, I, E, TOP_K, shared_intermediate=SHARED_I if block != "qwen" else None,
                        norm_topk_prob=False, rngs=nnx.Rngs(1))
        hidden, router = H, moe.gate
    router.weight.set_value(jnp.zeros_like(router.weight[...]))
    x = jnp.asarray(_x(hidden, seed=2))
    w, ids = moe.route(x)
    np.testing.assert_array_equal(np.asarray(ids), np.broadcast_to(np.arange(TOP_K),
                                                                   (2, 5, TOP_K)))
    expected = 1.0 / TOP_K if block == "gpt_oss" else 1.0 / E   # qwen: softmax over all E
    np.testing.assert_allclose(np.asarray(w), expected, rtol=1e-6)
    outs = [np.asarray(moe(x, form=f)) for f in FORMS]
    assert all(np.isfinite(o).all() for o in outs)
    np.testing.assert_allclose(outs[0], outs[1], rtol=0, atol=1e-6)
    np.testing.assert_allclose(outs[2], outs[1], rtol=0, atol=1e-6)
    # ties between some experts only: logits (1, 1, 1, 0, ...) pick experts 0 and 1
    tied = jnp.asarray([1.0, 1.0, 1.0] + [0.0] * (E - 3))
    for weights, chosen in (softmax_topk(tied, TOP_K, True), topk_softmax(tied, TOP_K)):
        np.testing.assert_array_equal(np.asarray(chosen), [0, 1])
        np.testing.assert_allclose(np.asarray(weights), [0.5, 0.5], rtol=1e-6)


def test_state_round_trip():
    """``state_to_flat`` names load back (the trainer's flat dicts)."""
    moe = SparseMoE(H, I, E, TOP_K, shared_intermediate=SHARED_I, rngs=nnx.Rngs(3))
    flat = state_to_flat(nnx.state(moe))
    other = _load(SparseMoE(H, I, E, TOP_K, shared_intermediate=SHARED_I, rngs=nnx.Rngs(4)),
                  flat)
    x = jnp.asarray(_x(H))
    np.testing.assert_array_equal(np.asarray(other(x)), np.asarray(moe(x)))


def test_expert_logical_axes():
    """Expert-axis weights declare ``("expert", ...)``; the default rules split the experts'
    ``I`` axis, ``ShardingRules(("expert",))`` the experts themselves."""
    from dominotree_jax import sharding
    from jax.sharding import PartitionSpec as P
    moe = SparseMoE(H, I, E, TOP_K, shared_intermediate=SHARED_I, rngs=nnx.Rngs(0))
    assert moe.experts.gate_proj.get_metadata()["logical_axes"] == ("expert", "mlp", "embed")
    assert moe.shared_expert.gate_proj.weight.get_metadata()["logical_axes"] == ("mlp", "embed")
    gpt = GptOssMoE(GH, GI, E, TOP_K, rngs=nnx.Rngs(0))
    specs = sharding.flat_param_specs(nnx.state(gpt), model_size=2)
    assert specs["experts.gate_proj"] == P(None, "model", None)
    assert specs["experts.down_proj"] == P(None, None, "model")
    assert specs["experts.up_proj_bias"] == P(None, "model")
    assert specs["router.weight"] == P() and specs["experts.down_proj_bias"] == P()
    by_expert = sharding.flat_param_specs(nnx.state(gpt), 2, sharding.ShardingRules(("expert",)))
    assert by_expert["experts.gate_proj"] == P("model", None, None)
    assert by_expert["router.bias"] == P("model")
