"""The Pallas top-M expansion kernel (interpret mode on CPU) against its jnp twin."""

from __future__ import annotations

import functools
import re

import jax
import numpy as np
import pytest

from dominotree_jax.tree import build_tree
from dominotree_jax.tree.reference import build_tree_numpy
from dominotree_jax.domino_head import split_projection, topm_expand
from pallas_kernels.topm_expand import KERNELS, expand_pallas


def topm_expand_jnp(*ops, k):
    return topm_expand(*ops, k, use_pallas=False)


def topm_expand_pallas(*ops, k, interpret=False):
    """The default kernel (``"grid"``) as the tree builder calls it."""
    return topm_expand(*ops, k, use_pallas="interpret" if interpret else True)


def topm_expand_kernel(z, s, w1, base, w2, *, k, kernel, interpret=False):
    """One named kernel (``KERNELS``) on the operands ``topm_expand`` takes."""
    a, w1s = split_projection(z, w1)
    return expand_pallas(a, s, w1s, base, w2, k, interpret=interpret, kernel=kernel)

EPS32 = float(np.finfo(np.float32).eps)


def operands(seed, H, G, E, M, *, scale=2.0):
    rng = np.random.default_rng(seed)
    f32 = np.float32
    return (rng.normal(size=H).astype(f32), np.tanh(rng.normal(size=G)).astype(f32),
            (rng.normal(size=(E, H + G)) / np.sqrt(H + G)).astype(f32),
            (rng.normal(size=M) * scale).astype(f32), (rng.normal(size=(M, E)) * 0.5).astype(f32))


@functools.lru_cache(maxsize=None)
def jitted(k, kernel):
    """The jnp twin (``kernel`` None), the builder's default kernel (``"default"``) or a named
    one, interpreted."""
    if kernel == "default":
        return jax.jit(functools.partial(topm_expand_pallas, k=k, interpret=True))
    if kernel is not None:
        return jax.jit(functools.partial(topm_expand_kernel, k=k, kernel=kernel,
                                         interpret=True))
    return jax.jit(functools.partial(topm_expand_jnp, k=k))


def check(ops, k, *, exact=False, kernel="default"):
    idx_j, lp_j = jitted(k, None)(*ops)
    idx_p, lp_p = jitted(k, kernel)(*ops)
    assert idx_p.shape == (k,) and idx_p.dtype == np.int32 and lp_p.dtype == np.float32
    np.testing.assert_array_equal(idx_p, idx_j)
    if exact:
        np.testing.assert_array_equal(lp_p, lp_j)
    finite = np.isfinite(np.asarray(lp_j))
    np.testing.assert_array_equal(np.isfinite(np.asarray(lp_p)), finite)
    scale = float(np.abs(ops[3][np.isfinite(ops[3])]).max()) + 1.0
    np.testing.assert_allclose(np.asarray(lp_p)[finite], np.asarray(lp_j)[finite],
                               rtol=1e-6, atol=max(1e-6, 2 * EPS32 * scale))
    return idx_j, lp_j


@pytest.mark.parametrize("H,G,E,M,k", [
    (24, 8, 12, 5, 3),        # everything unaligned, M < 16
    (16, 16, 16, 16, 16),     # k = M
    (32, 16, 16, 64, 8),      # published M=64, k=8
    (40, 24, 20, 100, 16),    # M padded to 128
    (576, 256, 128, 64, 8),   # SmolLM2-135M shapes
    (64, 32, 256, 300, 8),    # E=256, M a few hundred
])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("kernel", ["default", "single"])   # "default" is the grid kernel
def test_kernel_matches_jnp(H, G, E, M, k, seed, kernel):
    check(operands(seed, H, G, E, M), k, kernel=kernel)


@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_matches_jnp_in_a_batch(kernel):
    """vmapped over three rows (one program, or one grid row, per batch row)."""
    H, G, E, M, k = 64, 48, 40, 70, 8   # G and E pad to 64: the grid kernel has 4 E blocks
    rows = [operands(seed, H, G, E, M) for seed in range(3)]
    batch = [np.stack(parts) for parts in zip(*rows)]
    idx_b, lp_b = jax.jit(jax.vmap(functools.partial(topm_expand_kernel, k=k, kernel=kernel,
                                                     interpret=True)))(*batch)
    for r, ops in enumerate(rows):
        idx_j, lp_j = jitted(k, None)(*ops)
        np.testing.assert_array_equal(np.asarray(idx_b[r]), np.asarray(idx_j))
        np.testing.assert_allclose(np.asarray(lp_b[r]), np.asarray(lp_j), rtol=1e-6, atol=1e-5)


def test_ties_lowest_index_first():
    z, s, w1, base, w2 = operands(0, 24, 8, 12, 40)
    base = np.round(base).astype(np.float32)  # many equal logits
    w2[:] = 0.0                               # c = base: ties survive the correction
    idx, lp = check((z, s, w1, base, w2), 16, exact=False)
    order = np.lexsort((np.arange(40), -base))[:16]
    np.testing.assert_array_equal(idx, order)


def test_neg_inf_candidates():
    z, s, w1, base, w2 = operands(1, 24, 8, 12, 20)
    base[3:] = -np.inf  # fewer finite candidates than k
    idx, lp = check((z, s, w1, base, w2), 8)
    assert sorted(np.asarray(idx[:3]).tolist()) == [0, 1, 2]
    assert (np.diff(np.asarray(lp[:3])) <= 0).all()
    np.testing.assert_array_equal(idx[3:], [3, 4, 5, 6, 7])
    assert np.isneginf(np.asarray(lp[3:])).all()


def test_auto_is_the_jnp_twin():
    ops = operands(2, 24, 8, 12, 30)
    a = topm_expand(*ops, 4)
    b = topm_expand_jnp(*ops, k=4)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("top_m,prefix_len", [(16, 1), (8, 0)])
def test_builder_with_interpreted_kernel(top_m, prefix_len):
    rng = np.random.default_rng(3)
    K, V, H, G, E = 4, 64, 16, 8, 12
    f32 = np.float32
    case = dict(base_logits=(rng.normal(size=(K, V)) * 2).astype(f32),
                hidden=rng.normal(size=(K, H)).astype(f32), root_token=np.int32(5),
                embed=rng.normal(size=(V, H)).astype(f32),
                gru_w_ih=(rng.normal(size=(3 * G, H)) * 0.4).astype(f32),
                gru_w_hh=(rng.normal(size=(3 * G, G)) * 0.4).astype(f32),
                proj_w1=(rng.normal(size=(E, H + G)) * 0.4).astype(f32),
                proj_w2=rng.normal(size=(V, E)).astype(f32))
    statics = dict(method="dominotree", budget=12, node_topk=4, top_m=top_m, prefix_len=prefix_len)
    ref = build_tree_numpy(**case, **statics)
    for use_pallas in ("interpret", False):
        tree = build_tree(**case, **statics, use_pallas=use_pallas)
        for field in ("tokens", "parents", "depths", "num_nodes"):
            np.testing.assert_array_equal(getattr(tree, field), getattr(ref, field))
        np.testing.assert_allclose(tree.scores, ref.scores, rtol=1e-6, atol=1e-5)
    # vmap over a batch with the kernel (pallas_call batching rule)
    batch = {key: np.stack([v, v]) for key, v in case.items()}
    out = jax.vmap(functools.partial(build_tree, **statics, use_pallas="interpret"))(**batch)
    np.testing.assert_array_equal(out.tokens[1], ref.tokens)


def _lowered_for_cuda(fn, *shapes):
    """``fn`` traced at ``shapes`` and lowered for ``cuda`` from this host (an API change in
    jax fails the test: it must not turn into a skip)."""
    args = [jax.ShapeDtypeStruct(s, dtype) for s, dtype in shapes]
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))


def _lower_for_cuda(fn, *shapes):
    return _lowered_for_cuda(fn, *shapes).as_text()


def _triton_calls(lowered):
    """``(backend_config, Triton IR bytes)`` of every Triton custom call in ``lowered``."""
    from jax._src.lib.mlir import ir
    calls = []

    def walk(op):
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    o = inner.operation
                    if (o.name == "stablehlo.custom_call" and
                            ir.StringAttr(o.attributes["call_target_name"]).value
                            == "__gpu$xla.gpu.triton"):
                        cfg = ir.DictAttr(o.attributes["mhlo.backend_config"])
                        calls.append(({n: str(cfg[n]) for n in ("num_warps", "num_stages")},
                                      ir.StringAttr(cfg["ir"]).value_bytes))
                    walk(o)

    walk(lowered.compiler_ir("stablehlo").operation)
    return calls


def _parse_triton(ir_bytes: bytes) -> str:
    """Parse serialized Triton IR with jaxlib's Triton dialect, run the MLIR verifier, return
    the module's text."""
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib.mlir import ir
    from jaxlib.triton import dialect as triton_dialect
    with jax_mlir.make_ir_context() as ctx:
        triton_dialect.register_dialect(ctx)
        module = ir.Module.parse(ir_bytes)
        assert module.operation.verify()
        return str(module)


@pytest.mark.parametrize("H,G,E,M,k", [(576, 256, 128, 64, 8), (2560, 256, 256, 64, 8),
                                       (40, 24, 20, 300, 16), (24, 8, 12, 5, 1)])
def test_kernel_lowers_to_triton(H, G, E, M, k):
    """The kernel goes through the Pallas->Triton lowering (op support, power-of-two blocks)
    without a GPU; only the final Triton->PTX compilation needs one (benchmarks/gpu/kernel.py)."""
    f32 = np.float32
    fn = functools.partial(topm_expand_pallas, k=k)
    text = _lower_for_cuda(fn, ((H,), f32), ((G,), f32), ((E, H + G), f32), ((M,), f32),
                           ((M, E), f32))
    assert "xla.gpu.triton" in text
    batched = _lower_for_cuda(jax.vmap(fn), ((3, H), f32), ((3, G), f32), ((3, E, H + G), f32),
                              ((3, M), f32), ((3, M, E), f32))
    assert "xla.gpu.triton" in batched and "grid_x = 3" in batched


def test_builder_lowers_with_kernel_for_cuda():
    K, V, H, G, E = 16, 4096, 64, 32, 32
    bf16 = jax.numpy.bfloat16
    fn = functools.partial(build_tree, method="dominotree", budget=16, node_topk=8, top_m=64,
                           prefix_len=1, use_pallas=True)
    text = _lower_for_cuda(fn, ((K, V), bf16), ((K, H), bf16), ((), np.int32), ((V, H), bf16),
                           ((3 * G, H), bf16), ((3 * G, G), bf16), ((E, H + G), bf16),
                           ((V, E), bf16))
    # root expansion + the pop loop body, two launches each (the grid kernel)
    assert text.count("xla.gpu.triton") == 4


def test_resolve_use_pallas(monkeypatch):
    from pallas_kernels import topm_expand
    from pallas_kernels.topm_expand import resolve_use_pallas
    assert resolve_use_pallas(False) == (False, False)
    assert resolve_use_pallas(True) == (True, False)
    assert resolve_use_pallas("interpret") == (True, True)
    assert resolve_use_pallas("auto") == (False, False)
    # the jnp twin even where the kernel compiles: it measured faster on an H200 (docs/gpu.md)
    monkeypatch.setattr(topm_expand, "default_device_compiles_kernel", lambda: True)
    assert resolve_use_pallas("auto") == (False, False)
    with pytest.raises(ValueError):
        resolve_use_pallas("yes")


@pytest.mark.parametrize("platform,capability,compiles", [
    ("cuda", "9.0", True),      # H100 / H200
    ("cuda", "8.0", True),      # A100
    ("cuda", "8.6", True),      # A10 / RTX 30xx
    ("cuda", (8, 9), True),     # L4, as a tuple
    ("cuda", "10.0", True),     # B200: 10 > 8 numerically, not as text
    ("cuda", "7.5", False),     # T4 (Colab): XLA refuses Triton below 8.0
    ("cuda", "7.0", False),     # V100
    ("cuda", None, False),
    ("cuda", "sm_90", False),   # not a capability: no guess
    ("rocm", "gfx90a", False),  # untested: the jnp twin
    ("cpu", None, False), ("tpu", None, False),
])
def test_kernel_compiles_on(platform, capability, compiles):
    from pallas_kernels.topm_expand import kernel_compiles_on
    assert kernel_compiles_on(platform, capability) is compiles


def test_device_platform_names_cuda_and_rocm():
    from pallas_kernels.topm_expand import device_platform

    class Client:
        def __init__(self, version):
            self.platform_version = version

    class Device:
        def __init__(self, platform, version=""):
            self.platform, self.client = platform, Client(version)

    assert device_platform(Device("gpu", "PJRT C API\ncuda 12080")) == "cuda"
    assert device_platform(Device("gpu", "PJRT C API\nrocm 60342")) == "rocm"
    assert device_platform(Device("cpu")) == "cpu"
    assert device_platform(jax.devices()[0]) in ("cpu", "cuda", "rocm", "tpu")


POW2 = {1 << i for i in range(16)}


@pytest.mark.parametrize("G,E,M,k,warps,stages", [
    (256, 128, 64, 8, 4, 1),     # SmolLM2-135M drafter
    (1024, 256, 64, 8, 4, 1),    # Qwen3-4B/8B + Domino-b16
    (1024, 256, 64, 8, 8, 3),    # the same, another launch variant
    (24, 20, 300, 16, 2, 2),     # M padded to 512, G and E to 32
])
@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_triton_ir_parses_and_verifies(G, E, M, k, warps, stages, kernel):
    """The Triton IR that XLA would hand to Triton (each custom call's serialized module)
    parses with jaxlib's Triton dialect and passes the MLIR verifier; every tensor has
    power-of-two extents and the launch settings are the ones asked for. ``"single"``: one
    kernel, one ``scf.for`` over E blocks, then k max-and-mask rounds. ``"grid"``: a kernel over
    a grid of E blocks (``E / 16`` programs) storing each block's share, then the top-k
    kernel."""
    f32 = np.float32
    fn = functools.partial(expand_pallas, k=k, num_warps=warps, num_stages=stages,
                           kernel=kernel)
    lowered = _lowered_for_cuda(fn, ((E,), f32), ((G,), f32), ((E, G), f32), ((M,), f32),
                                ((M, E), f32))
    calls = _triton_calls(lowered)
    assert len(calls) == (1 if kernel == "single" else 2)
    texts = []
    for config, ir_bytes in calls:
        assert config == {"num_warps": f"{warps} : i32", "num_stages": f"{stages} : i32"}
        texts.append(_parse_triton(ir_bytes))
        assert texts[-1].count("tt.func public") == 1
        for shape in re.findall(r"tensor<([0-9x]+)x(?:f32|i32|i1|!tt)", texts[-1]):
            assert all(int(n) in POW2 for n in shape.split("x")), shape
    top_k = texts[-1]
    assert top_k.count("tt.store") == 2  # idx and lp
    assert top_k.count("tt.reduce") >= 2 * k  # max and argmin-style pick per round
    if kernel == "single":
        assert top_k.count("scf.for") == 1
    else:
        shares, = texts[:1]
        assert shares.count("tt.store") == 1 and "tt.reduce" in shares
        assert "tt.get_program_id x" in shares and "scf.for" not in top_k
        blocks = max(16, 1 << (E - 1).bit_length()) // 16   # E padded, 16 rows a program
        assert re.findall(r"grid_x = (\d+)", lowered.as_text()) == [str(blocks), "1"]



@pytest.mark.parametrize("capability", [80, 90])
@pytest.mark.parametrize("warps,stages", [(4, 1), (8, 1), (4, 2)])
@pytest.mark.parametrize("kernel", KERNELS)
def test_pip_triton_compiles_the_kernel_ir(capability, warps, stages, kernel, tmp_path,
                                           monkeypatch):
    """pip ``triton``, where importable (the GPU image has it; this venv does not), compiles
    each kernel's verified IR to PTX and a cubin for sm_80 / sm_90a without a GPU, for each
    launch variant the GPU suite times."""
    triton = pytest.importorskip("triton", reason="pip triton is not installed here: the "
                                 "kernel's Triton IR is parsed and verified, not compiled")
    from triton.backends.compiler import GPUTarget
    from pallas_kernels.topm_expand import expand_pallas
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    f32 = np.float32
    G, E, M, k = 1024, 256, 64, 8  # the Qwen3 Domino-b16 head
    fn = functools.partial(expand_pallas, k=k, num_warps=warps, num_stages=stages,
                           kernel=kernel)
    lowered = _lowered_for_cuda(fn, ((E,), f32), ((G,), f32), ((E, G), f32), ((M,), f32),
                                ((M, E), f32))
    calls = _triton_calls(lowered)
    assert len(calls) == (1 if kernel == "single" else 2)
    for i, (_, ir_bytes) in enumerate(calls):
        path = tmp_path / f"topm_expand_{i}.ttir"
        path.write_text(_parse_triton(ir_bytes))
        compiled = triton.compile(str(path), target=GPUTarget("cuda", capability, 32),
                                  options=dict(num_warps=warps, num_stages=stages))
        arch = "sm_90a" if capability == 90 else f"sm_{capability}"
        assert f".target {arch}" in compiled.asm["ptx"]
        assert len(compiled.asm["cubin"]) > 1000
        assert compiled.metadata.num_warps == warps
