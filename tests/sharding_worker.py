"""Run by ``test_sharding.py`` in a subprocess with 8 host CPU devices: sharded decoding on 2x4
and 4x2 meshes gives the single-device tokens, and the parameters really are split.

Prints one line per checked case and exits non-zero (an AssertionError) on any mismatch.
"""

from __future__ import annotations

import dataclasses
import sys

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from decode_helpers import fresh_jit_decode, lookup_drafter, oracle_table
from dominotree_jax import DecodeConfig
from dominotree_jax.model.drafter import init_drafter_params
from dominotree_jax.model.target import init_target_params
from dominotree_jax.sharding import make_mesh, replicated, shard_batch, shard_params
from spec_fixtures import tiny_pair

METHODS = ("ar", "dflash", "dominotree")
MESHES = ((2, 4, False), (4, 2, True))  # (data, model, shard_vocab)


def wide_pair():
    """``tiny_pair`` with 8 query / 4 kv heads, so that a model axis of 4 splits whole heads."""
    tcfg, dcfg, _ = tiny_pair()
    tcfg = dataclasses.replace(tcfg, num_attention_heads=8, num_key_value_heads=4)
    dcfg = dataclasses.replace(dcfg, num_attention_heads=8, num_key_value_heads=4)
    target = jax.tree.map(lambda x: x * 6.0 if x.ndim == 2 else x, init_target_params(tcfg, 0))
    return tcfg, dcfg, {"target": target, "drafter": init_drafter_params(dcfg, 1)}


def check_placement(params, model: int, shard_vocab: bool):
    attn = params["target"]["layers"][0]["self_attn"]
    mlp = params["drafter"]["layers"][0]["mlp"]
    expected = [(attn["q_proj"]["weight"], P("model", None)),
                (attn["k_proj"]["weight"], P("model", None)),
                (attn["o_proj"]["weight"], P(None, "model")),
                (mlp["up_proj"]["weight"], P("model", None)),
                (mlp["down_proj"]["weight"], P(None, "model")),
                (params["target"]["norm"]["weight"], P()),
                (params["target"]["lm_head"]["weight"], P("model", None) if shard_vocab else P()),
                (params["drafter"]["embed_proj"][2]["weight"],
                 P("model", None) if shard_vocab else P())]
    for var, spec in expected:
        x = var[...]
        assert x.sharding.spec == spec, (x.sharding.spec, spec)
        split = [x.shape[i] // (model if s == "model" else 1) for i, s in
                 enumerate(tuple(spec) + (None,) * (x.ndim - len(spec)))]
        assert list(x.addressable_shards[0].data.shape) == split, (x.shape, split)


def main():
    assert jax.device_count() == 8, jax.devices()
    tcfg, dcfg, params = wide_pair()
    prompt_BT = np.array([[3, 17, 5, 9, 33, 2, 8], [40, 1, 12, 0, 0, 0, 0],
                          [7, 7, 21, 30, 11, 0, 0], [5, 60, 0, 0, 0, 0, 0]], np.int32)
    lengths_B = np.array([7, 3, 5, 2], np.int32)
    cfgs = {m: DecodeConfig(target=tcfg, drafter=dcfg, method=m, max_new_tokens=16, budget=6,
                            node_topk=3, top_m=16, return_logprobs=True) for m in METHODS}
    jdecode = fresh_jit_decode()
    key = jax.random.key(0)
    greedy = jdecode(params, prompt_BT, lengths_B, key, config=cfgs["ar"])
    table = oracle_table(prompt_BT, lengths_B, np.asarray(greedy.tokens), tcfg.vocab_size,
                         dcfg.block_size)
    with lookup_drafter(table):  # drafts get accepted: the sharded caches are compacted too
        refs = {m: jdecode(params, prompt_BT, lengths_B, key, config=c) for m, c in cfgs.items()}
        assert int(np.asarray(refs["dominotree"].accept_lengths).max()) > 1
        for data, model, shard_vocab in MESHES:
            mesh = make_mesh(data, model)
            sharded = shard_params(params, mesh, shard_vocab=shard_vocab)
            check_placement(sharded, model, shard_vocab)
            p_BT, n_B = shard_batch(prompt_BT, lengths_B, mesh)
            assert p_BT.sharding.spec == P("data", None)
            for m, c in cfgs.items():
                out = jdecode(sharded, p_BT, n_B, replicated(key, mesh), config=c)
                ref = refs[m]
                for field in ("tokens", "num_tokens", "accept_lengths", "num_rounds"):
                    np.testing.assert_array_equal(np.asarray(getattr(out, field)),
                                                  np.asarray(getattr(ref, field)),
                                                  err_msg=f"{m} {data}x{model} {field}")
                np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(ref.logprobs),
                                           atol=1e-4)
                print(f"ok {m} mesh {data}x{model} shard_vocab={shard_vocab} "
                      f"tokens sharding {out.tokens.sharding.spec}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
