"""The precision policy (dominotree_jax/precision.py, docs/precision.md): the dtype at every
product boundary, float32 everywhere else, refusals, the exact mode, T>0 distributions in bf16
and, on the real SmolLM2, the bf16 T=0 near-tie property."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import dominotree_jax as dj
from dominotree_jax import DecodeConfig, decode
from dominotree_jax.domino_head import domino_chain
from dominotree_jax.model.cache import KVCache
from dominotree_jax.model.drafter import DrafterContext, bind_drafter
from dominotree_jax.model.target import bind_float32_view, bind_target, prefill
import dominotree_jax.precision as precision_module
from dominotree_jax.precision import (PrecisionError, check_pair, float32_view,
                                      bind_view_if_needed, params_precision,
                                      precision_name, product, uses_float32_view)

from decode_helpers import SAMPLING_XLA, jit_decode
from spec_fixtures import first_tokens_chi_square_p, tiny_pair

BF16, F32 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)
METHODS = ("dflash", "domino", "ddtree", "dominotree")
jdecode = jax.jit(decode, static_argnames="config")
# the tiny pairs' programs: LLVM's expensive passes off (the same HLO, so the same numbers;
# half the compile time)
fast_decode = jit_decode()
sampling_decode = jit_decode(SAMPLING_XLA)
# primitives that only move, select or convert data: allowed to see bf16 operands
MOVES = {"reshape", "transpose", "broadcast_in_dim", "concatenate", "slice", "dynamic_slice",
         "dynamic_update_slice", "gather", "scatter", "select_n", "squeeze", "expand_dims",
         "copy", "copy_p", "pad", "convert_element_type", "split", "pjit", "jit", "while",
         "cond", "scan", "closed_call", "optimization_barrier", "stack",
         "bitcast_convert_type",   # (a bf16 cache stored as its bits: model/cache.py)
         "custom_vjp_call"}        # (the 16-bit product with 16-bit gradient products)


def _bf16(tree):
    return jax.tree.map(lambda x: x.astype(jnp.bfloat16), tree)


def _eqns(jaxpr):
    """Every equation of a jaxpr and of the jaxprs nested in it (jit, loops, branches)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for p in eqn.params.values():
            for sub in (p if isinstance(p, (tuple, list)) else (p,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _eqns(inner)


def _dtypes(vs):
    return [jnp.dtype(v.aval.dtype) for v in vs if hasattr(v.aval, "dtype")
            and not jnp.issubdtype(v.aval.dtype, jax.dtypes.extended)]


def policy_report(fn, *args):
    """(dot_generals as (operand dtypes, output dtype), primitives that read bf16 although they
    compute: anything but a product, a move or a convert)."""
    closed = jax.make_jaxpr(fn)(*args)
    dots, bf16_compute = [], set()
    for eqn in _eqns(closed.jaxpr):
        ins = _dtypes(eqn.invars)
        if eqn.primitive.name == "dot_general":
            dots.append((tuple(ins), _dtypes(eqn.outvars)[0]))
        elif eqn.primitive.name not in MOVES and BF16 in ins:
            bf16_compute.add(eqn.primitive.name)
    return dots, bf16_compute


def assert_bf16_policy(fn, *args, min_dots=1):
    dots, bf16_compute = policy_report(fn, *args)
    assert len(dots) >= min_dots, dots
    bad = [d for d in dots if d != ((BF16, BF16), F32)]
    assert not bad, f"products not bf16 x bf16 -> float32: {bad[:5]}"
    assert not bf16_compute, f"bf16 outside the products: {sorted(bf16_compute)}"


# ------------------------------------------------------------------ names and pairings

def test_unknown_precisions_are_refused_by_name():
    assert precision_name("bfloat16") == "bfloat16" and precision_name(jnp.float32) == "float32"
    for bad in ("float64", "int8", "fp8", "bf16x"):
        with pytest.raises(PrecisionError, match=f"unknown target dtype '{bad}'"):
            precision_name(bad, "target dtype")
    # refused before any file is read (the path does not exist)
    with pytest.raises(PrecisionError, match="unknown target dtype 'float64'.*bfloat16"):
        dj.load_target("/nonexistent/model.gguf", dtype="float64")
    with pytest.raises(PrecisionError, match="unknown drafter dtype 'bf8'"):
        dj.load_pair("/nonexistent/t.gguf", "/nonexistent/d", drafter_dtype="bf8")


def test_pairings_the_policy_cannot_run_are_refused_naming_both():
    assert check_pair("float32", "bfloat16") == ("float32", "bfloat16")   # exact mode
    assert check_pair("bfloat16", jnp.bfloat16) == ("bfloat16", "bfloat16")
    for t, d in (("bfloat16", "float32"), ("float16", "bfloat16"), ("bfloat16", "float16")):
        with pytest.raises(PrecisionError, match=f"a {d} drafter cannot be paired with a {t} "
                                                 f"target"):
            check_pair(t, d)
    with pytest.raises(PrecisionError, match="a float32 drafter cannot be paired with a "
                                             "bfloat16 target"):
        dj.load_pair("/nonexistent/t.gguf", "/nonexistent/d", dtype="bfloat16",
                     drafter_dtype="float32")
    tcfg, dcfg, params = tiny_pair()
    bad = {"target": _bf16(params["target"]), "drafter": params["drafter"]}
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method="dominotree", max_new_tokens=4,
                       budget=4, node_topk=2, top_m=8)
    with pytest.raises(PrecisionError, match="float32 drafter cannot be paired with a bfloat16"):
        decode(bad, jnp.array([1, 2, 3]), config=cfg)
    with pytest.raises(PrecisionError, match="mix dtypes"):
        params_precision({"a": jnp.zeros(2), "b": jnp.zeros(2, jnp.bfloat16)})
    assert params_precision(params["target"]) == "float32"


# ------------------------------------------------------------------ dtype at every boundary

def test_product_casts_the_activation_and_accumulates_in_float32():
    x = jax.random.normal(jax.random.key(0), (3, 64))
    w = jax.random.normal(jax.random.key(1), (5, 64))
    y = product(x, w.astype(jnp.bfloat16))
    assert y.dtype == F32
    want = np.asarray(x.astype(jnp.bfloat16), np.float64) @ np.asarray(
        w.astype(jnp.bfloat16), np.float64).T
    np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-5)
    # a float32 weight: the plain float32 product, bit for bit
    np.testing.assert_array_equal(
        product(x, w), jax.lax.dot_general(x, w, (((1,), (1,)), ((), ()))))


def test_bf16_product_gradients_run_bf16_products_near_float32_ones():
    x = jax.random.normal(jax.random.key(0), (2, 3, 64))
    w = jax.random.normal(jax.random.key(1), (40, 64))
    g = jax.random.normal(jax.random.key(2), (2, 3, 40))

    def loss(x, w):
        return jnp.sum(product(x, w) * g)

    dx, dw = jax.grad(loss, argnums=(0, 1))(x, w.astype(jnp.bfloat16))
    assert dx.dtype == F32 and dw.dtype == BF16          # each in its primal's dtype
    np.testing.assert_allclose(np.asarray(dx), np.asarray(g @ w), rtol=0.05, atol=0.1)
    want_dw = np.einsum("bto,bti->oi", np.asarray(g), np.asarray(x))
    np.testing.assert_allclose(np.asarray(dw, np.float32), want_dw, rtol=0.05, atol=0.15)
    # every product of the backward takes bf16 operands (no float32 product on an upcast copy)
    dots = [e for e in _eqns(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(
        x, w.astype(jnp.bfloat16)).jaxpr) if e.primitive.name == "dot_general"]
    assert len(dots) == 3
    assert all(v.aval.dtype == BF16 for e in dots for v in e.invars)
    assert all(e.outvars[0].aval.dtype == F32 for e in dots)
    # float32 weights: autodiff's own float32 gradient, bit for bit
    dx32 = jax.grad(loss)(x, w)
    np.testing.assert_array_equal(dx32, jax.grad(
        lambda x: jnp.sum(jax.lax.dot_general(x, w, (((2,), (1,)), ((), ()))) * g))(x))


def test_one_row_16bit_products_run_as_two_rows_on_cpu(monkeypatch):
    """A one-row bf16 product (any leading shape) is computed as a two-row one on CPU (the
    second row zeros, dropped): the same values as the unpadded product, and its lowered
    product has two rows; many-row products, and every product without the pad, keep theirs."""
    w16 = jax.random.normal(jax.random.key(1), (5, 64)).astype(jnp.bfloat16)

    def dot_lhs_shape(x):   # the product's left operand in the lowered program
        text = jax.jit(lambda a, b: product(a, b)).lower(x, w16).as_text()   # traced anew
        (dims,) = re.findall(r"dot_general.*: \(tensor<([0-9x]+)xbf16>", text)
        return tuple(int(d) for d in dims.split("x"))

    for shape in ((1, 64), (1, 1, 64), (64,)):
        x = jax.random.normal(jax.random.key(0), shape)
        y = product(x, w16)
        assert y.shape == shape[:-1] + (5,) and y.dtype == F32
        want = np.asarray(x.astype(jnp.bfloat16), np.float64) @ np.asarray(w16, np.float64).T
        np.testing.assert_allclose(np.asarray(y), want, rtol=1e-6, atol=1e-6)
        assert dot_lhs_shape(x) == (2, 64)
        monkeypatch.setattr(precision_module, "PAD_ONE_ROW_16BIT", False)
        assert dot_lhs_shape(x) == shape
        monkeypatch.setattr(precision_module, "PAD_ONE_ROW_16BIT", True)
    assert dot_lhs_shape(jnp.ones((3, 64))) == (3, 64)


def test_float32_view_products_round_the_input_like_the_bf16_product():
    """``operand_dtype`` on a float32 view: the input rounded to bf16, then the float32
    product -- the bf16 x bf16 -> float32 product's value (bf16 x bf16 products are exact in
    float32; only the summation order may differ)."""
    x = jax.random.normal(jax.random.key(0), (3, 64))
    w16 = jax.random.normal(jax.random.key(1), (5, 64)).astype(jnp.bfloat16)
    view = float32_view(w16)
    assert view.dtype == F32
    want = np.asarray(x.astype(jnp.bfloat16), np.float64) @ np.asarray(w16, np.float64).T
    for rows in (1, 3):
        y = product(x[:rows], view, operand_dtype="bfloat16")
        assert y.dtype == F32
        np.testing.assert_allclose(np.asarray(y), want[:rows], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(np.asarray(y), np.asarray(product(x[:rows], w16)),
                                   rtol=1e-6, atol=1e-6)
    # the unrounded float32 product is measurably different: the rounding is not a no-op
    assert np.max(np.abs(np.asarray(product(x, view)) - want)) > 1e-4
    with pytest.raises(PrecisionError, match="float32 view"):
        product(x, w16, operand_dtype="float16")


def test_float32_view_target_runs_the_bf16_one_row_step():
    tcfg, _, params = tiny_pair()
    p16 = _bf16(params["target"])
    view = bind_float32_view(tcfg, p16)
    assert params_precision(nnx.state(view)) == "float32"
    B, S = 2, 16
    cache = KVCache.zeros(tcfg.num_hidden_layers, B, S, tcfg.num_key_value_heads, tcfg.head_dim,
                          jnp.bfloat16)
    tok, start = jnp.array([[3], [7]]), jnp.array([2, 5])
    one = jnp.ones((B, 1, 1), bool)

    def step(target):
        out = target.forward_cached(tok, start[:, None], cache, start, start, one, (0,))
        return np.asarray(target.logits(out.hidden)), out.cache

    got, got_cache = step(view)
    want, want_cache = step(bind_target(tcfg, p16))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the cache keeps the bf16 precision (the same stored bits)
    for a, b in zip(jax.tree.leaves(got_cache), jax.tree.leaves(want_cache)):
        assert a.dtype == b.dtype
    # float32 parameters need no view: the target itself
    f32_logits, _ = step(bind_float32_view(tcfg, params["target"]))
    np.testing.assert_array_equal(f32_logits, step(bind_target(tcfg, params["target"]))[0])
    assert uses_float32_view("bfloat16", "cpu") and not uses_float32_view("bfloat16", "gpu")
    assert not uses_float32_view("float32", "cpu")
    # several rows' plain step: the bf16 many-row product, no view
    assert not uses_float32_view("bfloat16", "cpu", batch=4)


def test_bind_view_if_needed_binds_only_16_bit_params_on_cpu():
    tcfg, _, params = tiny_pair()
    calls = []

    def bind(cfg, p):
        calls.append(params_precision(p))
        return "view"

    assert jax.default_backend() == "cpu"
    assert bind_view_if_needed(bind, tcfg, _bf16(params["target"]), "target parameters") == "view"
    assert bind_view_if_needed(bind, tcfg, params["target"], "target parameters") is None
    assert bind_view_if_needed(bind, tcfg, _bf16(params["target"]), "target parameters",
                               batch=2) is None
    assert calls == ["bfloat16"]
    leaves, tree = jax.tree.flatten(params["target"])
    mixed = jax.tree.unflatten(tree, [leaves[0].astype(jnp.float16)] + leaves[1:])
    with pytest.raises(PrecisionError, match="target parameters mix dtypes"):
        bind_view_if_needed(bind, tcfg, mixed, "target parameters")


def test_float32_view_drafter_computes_the_bf16_context_rows():
    from dominotree_jax.model.drafter import bind_drafter, bind_drafter_float32_view
    _, dcfg, params = tiny_pair()
    d16 = _bf16(params["drafter"])
    view = bind_drafter_float32_view(dcfg, d16)
    assert params_precision(nnx.state(view)) == "float32"
    feats = jax.random.normal(jax.random.key(3), (2, 1, len(dcfg.target_layer_ids) * 32))
    pos = jnp.array([[4], [9]])
    got_k, got_v = view.context_rows(feats, pos)
    want_k, want_v = bind_drafter(dcfg, d16).context_rows(feats, pos)
    for g, w in zip(got_k + got_v, want_k + want_v):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
    # float32 parameters need no view
    f32 = bind_drafter_float32_view(dcfg, params["drafter"])
    assert params_precision(nnx.state(f32)) == "float32"
    np.testing.assert_array_equal(np.asarray(f32.context_rows(feats, pos)[0][0]),
                                  np.asarray(bind_drafter(dcfg, params["drafter"])
                                             .context_rows(feats, pos)[0][0]))


def _per_iteration_upcasts(hlo: str, shapes) -> int:
    """float32 arrays of the given weight shapes made by a convert (or a fusion) outside the
    entry computation: weight upcasts run every loop iteration or conditional branch."""
    import re
    pattern = re.compile(r"=\s*f32\[(" + "|".join(f"{a},{b}" for a, b in shapes)
                         + r")\]\S*\s+(fusion|convert)\(")
    count, name = 0, None
    for ln in hlo.splitlines():
        if ln and not ln.startswith(" ") and ln.rstrip().endswith("{"):
            name = ln.split()[0 if not ln.startswith("ENTRY") else 1].lstrip("%")
            inner = ln.startswith("ENTRY") or name.startswith(("fused", "wrapped"))
        elif name is not None and not inner and pattern.search(ln):
            count += 1
    return count


def test_bf16_auto_decode_upcasts_no_weight_inside_its_loop(monkeypatch):
    """``budget="auto"`` in bf16 on CPU: the plain-step branch runs on float32 views of the
    target and of the drafter (whose context projections it runs for the kept token) made
    before the loop (XLA hoists no convert out of a ``lax.switch`` branch), so no weight is
    upcast per round; the tokens stay those of bf16 ``ar`` at T=0."""
    from dominotree_jax.decoding.auto_size import AutoPolicy, initial_state
    from dominotree_jax.model.drafter import init_drafter_params
    from dominotree_jax.model.target import init_target_params
    tcfg0, dcfg, _ = tiny_pair()
    # an MLP width and a vocabulary the drafter does not share: their shapes are the target's
    tcfg = dataclasses.replace(tcfg0, intermediate_size=80, vocab_size=72)
    # one K/V head: the drafter's K/V projections [8, H] and its fc [H, 2H] are its own shapes
    # (the Domino head's width 12 keeps its weights off them: drafting upcasts those, in the
    # drafting branch)
    dcfg = dataclasses.replace(dcfg, vocab_size=72, mask_token_id=71, num_key_value_heads=1,
                               emb_dim=12)
    tp = jax.tree.map(lambda x: x * 6.0 if x.ndim == 2 else x, init_target_params(tcfg, 0))
    p16 = _bf16({"target": tp, "drafter": init_drafter_params(dcfg, 1)})
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method="dominotree", max_new_tokens=24,
                       budget="auto", node_topk=3, top_m=16)
    assert AutoPolicy(cfg, 1).can_pay
    H, I, V = tcfg.hidden_size, 80, 72
    target_shapes = [(I, H), (H, I), (V, H)]
    drafter_shapes = [(dcfg.head_dim, H), (H, len(dcfg.target_layer_ids) * H)]
    prompt = jnp.array([[3, 17, 5, 9, 33, 2, 8]])
    state = initial_state(cfg, 1)

    def compiled():   # a fresh function each time: no trace cached from another setting
        def fn(p, x, st):
            return decode(p, x, config=cfg, auto_state=st)
        return jax.jit(fn).lower(p16, prompt, state).compile().as_text()

    hlo = compiled()   # one compile per setting, both weight sets counted in it
    assert _per_iteration_upcasts(hlo, target_shapes) == 0
    assert _per_iteration_upcasts(hlo, drafter_shapes) == 0
    ar = fast_decode(p16, prompt, config=dataclasses.replace(cfg, method="ar", budget=16))
    out = fast_decode(p16, prompt, config=cfg, auto_state=state)
    np.testing.assert_array_equal(out.tokens, ar.tokens)
    # without the view (what a GPU runs) and without the one-row pad, the branch upcasts the
    # target's weights every round
    monkeypatch.setattr("dominotree_jax.precision.uses_float32_view",
                        lambda *a: False)
    monkeypatch.setattr(precision_module, "PAD_ONE_ROW_16BIT", False)
    hlo = compiled()
    assert _per_iteration_upcasts(hlo, target_shapes) > 0
    assert _per_iteration_upcasts(hlo, drafter_shapes) > 0


def test_calibration_times_the_bf16_plain_step_on_the_float32_view():
    """``calibrate`` prices auto's plain step as decode runs it on CPU: the 16-bit target's
    products on its float32 view (made once, outside the timed loop); the verify of several
    rows and the ``ar`` unit keep the bf16 products. Priced as a bf16 one-row forward, the
    plain step looked 2.5x dearer than it is on a Zen 5 EPYC (methods_zen5), and auto stepped
    plainly too seldom."""
    from dominotree_jax.calibrate import RoundPrograms, plain_step_params
    from dominotree_jax.model.target import init_target_params
    tcfg, dcfg, params = tiny_pair(block_size=4)
    tcfg = dataclasses.replace(tcfg, intermediate_size=80)   # an MLP width of its own
    p16 = _bf16({"target": init_target_params(tcfg, 0), "drafter": params["drafter"]})
    pair = dj.Pair(dj.Target(tcfg, p16["target"], tokenizer=None), dcfg, p16["drafter"])
    assert uses_float32_view(BF16, jax.default_backend())
    assert {jnp.dtype(x.dtype) for x in jax.tree.leaves(plain_step_params(p16))} == {F32}
    progs = RoundPrograms(pair, 1, 12, 2, 5)
    mlp = {(tcfg.hidden_size, 80), (80, tcfg.hidden_size)}

    def mlp_product_dtypes(jaxpr):
        return {str(v.aval.dtype) for e in _eqns(jaxpr.jaxpr) if e.primitive.name == "dot_general"
                for v in e.invars if tuple(v.aval.shape) in mlp}

    assert mlp_product_dtypes(progs.verify_jaxpr(1)) == {"float32"}
    assert mlp_product_dtypes(progs.verify_jaxpr(5)) == {"bfloat16"}
    assert mlp_product_dtypes(progs.verify_jaxpr(1, plain_ar=True)) == {"bfloat16"}
    # a float32 pair: nothing to view, the same parameters
    p32 = plain_step_params(params)
    assert all(a is b for a, b in zip(jax.tree.leaves(p32), jax.tree.leaves(params)))


def _target_fns(tcfg, tparams, B=2, T=5, S=24):
    target = bind_target(tcfg, tparams)
    dtype = jax.tree.leaves(tparams)[0].dtype
    tokens = jnp.arange(B * T, dtype=jnp.int32).reshape(B, T) % tcfg.vocab_size

    def verify_like(tokens_BT):
        cache = KVCache.zeros(tcfg.num_hidden_layers, B, S, tcfg.num_key_value_heads,
                                 tcfg.head_dim, dtype)
        start = jnp.full((B,), 3, jnp.int32)
        pos = start[:, None] + jnp.arange(T)[None]
        causal = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (B, T, T))
        out = target.forward_cached(tokens_BT, pos, cache, start, start, causal, (0, 1))
        return target.logits(out.hidden), out.taps

    def prefill_logits(tokens_BT):
        return prefill(target, tokens_BT, jnp.full((B,), T, jnp.int32), S, (0, 1))[1]

    return tokens, verify_like, prefill_logits


def test_bf16_target_forward_products_are_bf16_with_float32_everything_else():
    tcfg, _, params = tiny_pair()
    tokens, verify_like, prefill_logits = _target_fns(tcfg, _bf16(params["target"]))
    L = tcfg.num_hidden_layers
    assert_bf16_policy(verify_like, tokens, min_dots=L * 9 + 1)   # 7 projections + 2 attention
    assert_bf16_policy(prefill_logits, tokens, min_dots=L * 9 + 1)
    logits, taps = verify_like(tokens)
    assert logits.dtype == F32 and taps.dtype == F32
    # float32 logits from a float32-accumulated head: not quantised to bf16 steps
    requantised = np.asarray(logits.astype(jnp.bfloat16).astype(jnp.float32))
    assert np.mean(requantised != np.asarray(logits)) > 0.9


def test_float32_target_has_no_low_precision_anywhere():
    tcfg, _, params = tiny_pair()
    tokens, verify_like, _ = _target_fns(tcfg, params["target"])
    closed = jax.make_jaxpr(verify_like)(tokens)
    seen = {d for eqn in _eqns(closed.jaxpr) for d in _dtypes(eqn.invars) + _dtypes(eqn.outvars)}
    assert BF16 not in seen and jnp.dtype(jnp.float16) not in seen


def test_bf16_drafter_block_and_domino_chain_follow_the_policy():
    tcfg, dcfg, params = tiny_pair()
    p = _bf16(params)
    B, S = 2, 16
    ctx = DrafterContext.zeros(dcfg, B, S, jnp.bfloat16)
    F = len(dcfg.target_layer_ids) * dcfg.hidden_size
    feats = jax.random.normal(jax.random.key(2), (B, 6, F))

    def draft(p, feats):
        target, drafter = bind_target(tcfg, p["target"]), bind_drafter(dcfg, p["drafter"])
        pos = jnp.broadcast_to(jnp.arange(6), (B, 6))
        c = drafter.extend_context(ctx, feats, pos, jnp.zeros((B,), jnp.int32),
                                   jnp.full((B,), 6, jnp.int32))
        z, base = drafter.draft(target, c, jnp.array([3, 4]), c.length)
        toks, lps = domino_chain(drafter.head_weights(target), z, base, jnp.array([3, 4]),
                                 dcfg.pure_draft_prefix_len)
        return z, base, toks, lps, c.layer_kv(0)[0]

    assert_bf16_policy(draft, p, feats, min_dots=10)
    z, base, _, lps, ctx_k = draft(p, feats)
    assert (z.dtype, base.dtype, lps.dtype, ctx_k.dtype) == (F32, F32, F32, BF16)


def test_bf16_decode_round_follows_the_policy():
    tcfg, dcfg, params = tiny_pair()
    p = _bf16(params)
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method="domino", max_new_tokens=6)
    dots, _ = policy_report(lambda p: decode(p, jnp.array([1, 2, 3]), config=cfg).tokens, p)
    bad = [d for d in dots if d != ((BF16, BF16), F32)]
    assert len(dots) > 20 and not bad, bad[:5]


# ------------------------------------------------------------------ lossless semantics

def test_exact_mode_bf16_drafter_float32_target_is_token_identical_to_float32_ar():
    tcfg, dcfg, params = tiny_pair()
    exact = {"target": params["target"], "drafter": _bf16(params["drafter"])}
    prompt = jnp.array([3, 17, 5, 9, 33, 2, 8])
    ref = fast_decode(params, prompt, config=DecodeConfig(target=tcfg, drafter=dcfg,
                                                          method="ar", max_new_tokens=32))
    for method in METHODS:
        cfg = DecodeConfig(target=tcfg, drafter=dcfg, method=method, max_new_tokens=32,
                           budget=6, node_topk=3, top_m=16)
        out = fast_decode(exact, prompt, config=cfg)
        np.testing.assert_array_equal(out.tokens, ref.tokens, err_msg=method)


def _exact_joint(tcfg, tparams, prompt, V):
    """P(first three tokens) of the target's own (bf16) logits, enumerating every prefix."""
    import itertools

    from dominotree_jax.api import _plain_forward
    seqs = np.array(list(itertools.product(range(V), repeat=2)))
    toks = np.concatenate([np.tile(prompt, (len(seqs), 1)), seqs], axis=1)
    lp = np.asarray(jax.nn.log_softmax(_plain_forward(tparams, jnp.asarray(toks), tcfg), -1),
                    np.float64)
    P = len(prompt)
    probs = np.zeros((V, V, V))
    for row, s in enumerate(seqs):
        probs[tuple(s)] = (np.exp(lp[row, P - 1, s[0]] + lp[row, P, s[1]])
                           * np.exp(lp[row, P + 1]))
    return probs


@pytest.mark.parametrize("method", ["ar", "domino", "dominotree"])
def test_bf16_sampling_matches_the_bf16_target_distribution(method):
    V, runs, calls = 6, 20000, 4
    tcfg, dcfg, params = tiny_pair(vocab=V, block_size=4, seed=3)
    p = _bf16(params)
    prompt = np.array([1, 4, 2])
    exact = _exact_joint(tcfg, p["target"], prompt, V).reshape(-1)
    cfg = DecodeConfig(target=tcfg, drafter=dcfg, method=method, max_new_tokens=3,
                       temperature=1.0, budget=6, node_topk=2, top_m=0)
    # the runs in a few calls of one compiled batch: XLA's compile time grows with the batch
    outs = [sampling_decode(p, jnp.tile(prompt, (runs // calls, 1)), config=cfg, key=k)
            for k in jax.random.split(jax.random.key(7), calls)]
    toks = np.concatenate([np.asarray(o.tokens) for o in outs])
    assert toks.shape[0] == runs and (toks >= 0).all()
    pval = first_tokens_chi_square_p(toks, exact, V)
    assert pval > 1e-3, (method, pval)
    if method != "ar":
        assert max(int(np.asarray(o.accept_lengths).max()) for o in outs) > 1


# ------------------------------------------------------------------ the real model

@pytest.mark.slow
def test_smollm2_bf16_divergences_from_ar_are_near_ties(smollm2_path):
    """bf16 R-row verification and one-row steps round differently: a speculative method may
    part from bf16 ``ar`` at T=0, but only where the two tokens' logits are within the measured
    bf16 noise of each other (both near the best)."""
    from dominotree_jax.assets import smollm2_drafter_path
    pair = dj.load_pair(smollm2_path, smollm2_drafter_path(), dtype="bfloat16")
    tgt = pair.target
    tcfg = tgt.config
    prompts = [tgt.chat_prompt(t) for t in ("Write a haiku about the sea.",
                                            "What is 17 * 23? Think step by step.")]
    n_new, rows = 40, 17
    # both prompts in one right-padded batch: one compile per program (not one per prompt)
    P_B = np.array([len(p) for p in prompts], np.int32)
    prompt_BW = np.zeros((len(prompts), P_B.max()), np.int32)
    for b, p in enumerate(prompts):
        prompt_BW[b, :P_B[b]] = p

    def decode_batch(method, **kw):
        cfg = pair.config(method, max_new_tokens=n_new, stop_ids=(), **kw)
        return np.asarray(jdecode(pair.params, jnp.asarray(prompt_BW), config=cfg,
                                  prompt_lengths=jnp.asarray(P_B)).tokens)

    def all_logits(seqs, chunk):
        """float32 logits at every position of each of ``seqs`` (right-padded into one batch),
        computed ``chunk`` rows per forward."""
        lens_B = np.array([len(s) for s in seqs], np.int32)
        ids_BT = np.zeros((len(seqs), lens_B.max()), np.int32)
        for b, s in enumerate(seqs):
            ids_BT[b, :lens_B[b]] = s
        T = ids_BT.shape[1]
        fwd = jax.jit(lambda tp, x, n: bind_target(tcfg, tp).logits(
            prefill(bind_target(tcfg, tp), x, n, T + 1, (), chunk)[0].hidden))
        return np.asarray(fwd(tgt.params, jnp.asarray(ids_BT), jnp.asarray(lens_B)))

    ar_BN = decode_batch("ar")
    seqs = [list(p) + ar_BN[b].tolist() for b, p in enumerate(prompts)]
    one_row_BTV = all_logits(seqs, 1)           # what one-row steps compute
    many_BTV = all_logits(seqs, rows)            # what a 17-row verification computes
    divergences, noise = [], 0.0
    for b, P in enumerate(P_B):
        one_row, ar = one_row_BTV[b, :P + n_new], ar_BN[b]
        noise = max(noise, float(np.max(np.abs(one_row[P - 1:] - many_BTV[b, P - 1:P + n_new]))))
        # ar is one-row greedy (its prompt was prefilled in one chunk, so its logits differ
        # from these by bf16 noise too: most, not all, positions agree)
        assert np.mean(one_row[P - 1:-1].argmax(-1) == ar) >= 0.8
    for method in ("domino", "dominotree"):
        out_BN = decode_batch(method, budget=16)
        for b, P in enumerate(P_B):
            differ = np.nonzero(out_BN[b] != ar_BN[b])[0]
            if differ.size:
                i = int(differ[0])
                row = one_row_BTV[b, P - 1 + i]
                divergences.append((method, b, i, float(row[ar_BN[b, i]] - row[out_BN[b, i]])))
    assert 0 < noise < 1.0, noise
    # the speculative token was the argmax of rows that differ from the one-row logits by at
    # most ``noise``, ar's the argmax of logits as close to them: |gap| is at most twice it
    for method, b, i, gap in divergences:
        assert abs(gap) <= 2 * noise, (method, b, i, gap, noise)
    print(f"bf16 noise {noise:.4f}; divergences {divergences}")


# ------------------------------------------------------------------ calibration's choice

def test_calibrate_chooses_the_precision_with_the_faster_step_and_verify():
    from dominotree_jax.calibrate import choose_precision
    rows = (1, 3, 17)
    # this session's CPU (no bf16 units): one-row bf16 products are slower, 17 rows a tie
    no_units = {"float32": {1: 57.0, 17: 80.5}, "bfloat16": {1: 133.3, 17: 76.6}}
    assert choose_precision(no_units, rows) == "float32"
    # an AMX machine (shared/MEASUREMENTS.md): bf16 verify rows are several times faster
    amx = {"float32": {1: 28.3, 17: 68.2}, "bfloat16": {1: 30.0, 17: 23.0}}
    assert choose_precision(amx, rows) == "bfloat16"
    assert choose_precision({"bfloat16": {1: 1.0, 17: 2.0},
                             "float32": {1: 1.0, 17: 2.0}}, rows) == "float32"   # tie: exact


def test_calibrated_costs_are_stored_per_precision(tmp_path):
    from dominotree_jax.decoding import costs
    tcfg, dcfg, _ = tiny_pair()
    key32 = costs.machine_key(tcfg, dcfg)
    assert costs.machine_key(tcfg, dcfg, "float32") == key32      # old files stay valid
    assert costs.machine_key(tcfg, dcfg, "bfloat16") == key32 + "|bfloat16"
    path = str(tmp_path / "costs.json")
    bf16 = (costs.CostTable(batch=1, verify=((1, 1.0), (9, 1.2))),)
    costs.save_costs(tcfg, dcfg, bf16, path=path, precision="bfloat16")
    assert costs.load_calibrated_costs(tcfg, dcfg, path, precision="float32") == \
        costs.default_tables()
    got = costs.load_calibrated_costs(tcfg, dcfg, path, precision="bfloat16")
    assert [t.verify for t in got] == [t.verify for t in bf16]


def test_cast_pair_puts_every_float_parameter_in_the_precision():
    from dominotree_jax.calibrate import cast_pair
    tcfg, dcfg, params = tiny_pair()
    pair = dj.Pair(dj.Target(tcfg, params["target"], None), dcfg, params["drafter"])
    cast = cast_pair(pair, "bfloat16")
    assert params_precision(cast.target.params) == "bfloat16"
    assert params_precision(cast.drafter_params) == "bfloat16"
    assert params_precision(pair.target.params) == "float32"      # the original is untouched
