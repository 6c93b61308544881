"""Every released drafter layout loads with the right settings and decodes like ``ar``; the
unsupported ones are refused by name; the real 4B/8B shapes are checked without allocating."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dominotree_jax as dj
from convert.__main__ import main as convert_main
from convert.inspect_checkpoint import decode_memory
from dominotree_jax.config import ConfigError, DrafterConfig, TargetConfig

import released_layouts as rl
from decode_helpers import fresh_jit_decode

TINY = rl.SIZES["tiny"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("released")
    out = {"target": rl.write_target(str(root / "target"))}
    for name in list(rl.DRAFTER_VARIANTS) + list(rl.REFUSED_VARIANTS):
        out[name] = rl.write_drafter(str(root / name), name)
    return out


@pytest.fixture(scope="module")
def pairs(dirs):
    loaded = {}

    def get(name):
        if name not in loaded:
            loaded[name] = dj.load_pair(dirs["target"], dirs[name])
        return loaded[name]
    return get


EXPECTED = {  # variant -> settings the loader must infer
    "dflash_4b_older": dict(block_size=4, target_layer_ids=(1, 3, 4, 6, 8), is_domino=False),
    "domino_8b": dict(block_size=4, is_domino=True, emb_dim=8, gru_hidden_dim=16,
                      shift_label=True),
    "domino_block_in_dflash_config": dict(block_size=4, is_domino=True),
    "domino_emb_dim_top_level_only": dict(emb_dim=8, is_domino=True),
    "domino_causal_v5": dict(projector_type="domino"),
    "domino_logit_head_prefix": dict(is_domino=True),
    "domino_model_prefix": dict(is_domino=True),
    "dflash_rope_parameters": dict(rope_theta=1e6, rope_scaling=None),
    # the released rule round(1 + i*(L-4)/(n-1)) for L=9, n=5 (Python's half-to-even rounding)
    "dflash_taps_absent": dict(target_layer_ids=(1, 2, 4, 5, 6)),
    "dflash_sliding_window": dict(sliding_window=6,
                                  layer_types=("sliding_attention",) * 4 + ("full_attention",)),
    "dspark_qwen3": dict(block_size=4, is_dspark=True, markov_rank=8, confidence_head=True,
                         shift_label=True, is_domino=False, target_layer_ids=(1, 3, 4, 6, 8)),
    "dflash2": dict(is_dflash2=True, conv_kernel=2, conv_group=16, selector_rank=8,
                    selector_top_k=16, shift_label=False),
}


@pytest.mark.parametrize("variant", list(rl.DRAFTER_VARIANTS))
def test_every_variant_loads_with_the_inferred_settings(pairs, variant):
    cfg = pairs(variant).drafter_config
    assert cfg.mask_token_id == TINY["mask"]
    for field, want in EXPECTED[variant].items():
        assert getattr(cfg, field) == want, (variant, field)


@pytest.mark.parametrize("variant", sorted(rl.SAME_AS))
def test_variants_load_the_same_parameters_as_their_base(pairs, variant):
    a, b = pairs(variant), pairs(rl.SAME_AS[variant])
    assert a.drafter_config == b.drafter_config
    same = jax.tree.map(lambda x, y: bool((x == y).all()), a.drafter_params, b.drafter_params)
    assert all(jax.tree.leaves(same))


@pytest.mark.parametrize("variant", list(rl.REFUSED_VARIANTS))
def test_unsupported_layouts_are_refused_by_name(dirs, variant):
    with pytest.raises(ConfigError, match=rl.REFUSED_VARIANTS[variant][1]) as e:
        dj.load_pair(dirs["target"], dirs[variant])
    assert "config.json" in str(e.value)


def test_target_with_rope_parameters_equals_the_older_form(tmp_path):
    a = dj.load_target(rl.write_target(str(tmp_path / "a")), tokenizer=False)
    b = dj.load_target(rl.write_target(str(tmp_path / "b"), rope_parameters=True),
                       tokenizer=False)
    assert a.config == b.config and a.config.rope_theta == 1e6
    assert a.config.tie_word_embeddings and a.config.qk_norm


_decode = fresh_jit_decode()


def _ar_and(pair, method, prompt, lengths):
    base = pair.config("ar", max_new_tokens=12, temperature=0.0, stop_ids=())
    cfg = base.replace(method=method, budget=6, node_topk=2, top_m=0)
    ar = _decode(pair.params, prompt, lengths, config=base.replace(drafter=None))
    out = _decode(pair.params, prompt, lengths, config=cfg)
    return np.asarray(ar.tokens), np.asarray(out.tokens)


# one decode per distinct drafter config (the other variants load equal configs and params)
@pytest.mark.parametrize("variant,method", [
    ("dflash_4b_older", "dflash"), ("domino_8b", "domino"), ("domino_8b", "dominotree"),
    ("dflash_taps_absent", "dflash"), ("dflash_sliding_window", "dflash"),
    ("dspark_qwen3", "dspark"), ("dspark_qwen3", "dsparktree"),
    ("dflash2", "dflash2"), ("dflash2", "dflash2tree"),
])
def test_every_distinct_variant_decodes_like_ar(pairs, variant, method):
    rng = np.random.default_rng(5)
    prompt = jnp.asarray(rng.integers(0, TINY["mask"], (2, 14)), jnp.int32)
    lengths = jnp.asarray([14, 9], jnp.int32)
    ar, out = _ar_and(pairs(variant), method, prompt, lengths)
    np.testing.assert_array_equal(out, ar)


def test_inspect_says_what_it_recognised(dirs, capsys):
    checks = {
        "dflash_4b_older": ["DFlash drafter", "block_size in top level (older layout)",
                            "taps: [1, 3, 4, 6, 8] (target_layer_ids in dflash_config)",
                            "mask id: 151", "window: none", "fits the target"],
        "domino_block_in_dflash_config": ["Domino drafter", "in dflash_config (newer layout)"],
        "domino_causal_v5": ["'causal_v5', an alias of 'domino'"],
        "domino_emb_dim_top_level_only": ["emb_dim=8 (emb_dim in top level)"],
        "domino_logit_head_prefix": ["name prefixes ['logit_head.'] stripped"],
        "domino_model_prefix": ["name prefixes ['model.'] stripped"],
        "dflash_taps_absent": ["taps: [1, 2, 4, 5, 6] inferred from num_target_layers=9"],
        "dflash_rope_parameters": ["(from rope_parameters)"],
        "dflash_sliding_window": ["window: the last 6 context rows on drafter layers "
                                  "[0, 1, 2, 3]"],
    }
    for variant, needles in checks.items():
        assert convert_main(["inspect", dirs[variant], "--target", dirs["target"]]) == 0
        out = capsys.readouterr().out
        for needle in needles:
            assert needle in out, (variant, needle, out)


GiB = 1024 ** 3


@pytest.mark.parametrize("size,variant,shapes,params_m", [
    ("4B", "dflash_4b_older", {"fc.weight": [2560, 12800],
                               "layers.0.self_attn.q_proj.weight": [4096, 2560]}, "537.4"),
    ("8B", "domino_8b", {"fc.weight": [4096, 20480], "prefix_gru.weight_ih_l0": [3072, 4096],
                         "prefix_gru.weight_hh_l0": [3072, 1024],
                         "embed_proj.0.weight": [256, 5120],
                         "embed_proj.2.weight": [151936, 256]}, "1104.6"),
])
def test_released_sizes_checked_abstractly(tmp_path, capsys, size, variant, shapes, params_m):
    """The real configs, no weights: every shape and the memory of a 4,096-token decode from
    ``jax.eval_shape`` (the 8B pair would need ~18 GiB if anything were allocated)."""
    t = rl.write_target(str(tmp_path / "t"), size, weights=False)
    d = rl.write_drafter(str(tmp_path / "d"), variant, size, weights=False)
    assert convert_main(["inspect", d, "--target", t, "--tokens", "4096"]) == 0
    out = capsys.readouterr().out
    for name, shape in shapes.items():
        assert f"  {name} {shape}\n" in out
    assert f"drafter parameters: {params_m}M," in out
    tcfg = TargetConfig.from_hf_dict(rl.qwen3_target_config(size))
    dcfg = DrafterConfig.from_hf_dict(rl.DRAFTER_VARIANTS[variant][0](size))
    mem = decode_memory(tcfg, dcfg, 4096, 1, "bfloat16")
    # K and V, 36 layers x 4096 rows x 8 kv heads x 128 dims x 2 bytes; the drafter has 5 layers
    assert mem["target KV cache"] == 2 * 36 * 4096 * 8 * 128 * 2
    assert mem["drafter context"] == 2 * 5 * 4096 * 8 * 128 * 2 + 4  # + the int32 length
    expected_target = {"4B": 4.022e9, "8B": 8.191e9}[size]
    assert abs(mem["target parameters"] / 2 - expected_target) / expected_target < 1e-3
    assert f"target KV cache: {mem['target KV cache'] / GiB:.3f} GiB" in out
