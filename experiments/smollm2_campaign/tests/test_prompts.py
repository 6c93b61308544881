"""The SmolLM2 prompt recipes: the v3 pool passes the benchmark filter, the v4 mix is varied
and deterministic, and the recipe command line collects with them (answer caps by mix)."""

from __future__ import annotations

import collections

from dominotree_jax.train.data.overlap import BenchmarkFilter
from experiments.smollm2_campaign import collect
from experiments.smollm2_campaign.prompts import build_prompts, build_prompts_v4


def test_v3_prompts_pass_the_benchmark_filter():
    f = BenchmarkFilter()
    for p in build_prompts(300, seed=0):
        assert f.ok(p["text"]), p


def test_v4_prompt_mix_is_varied_and_deterministic():
    p = build_prompts_v4(600, 3)
    assert p == build_prompts_v4(600, 3)
    kinds = collections.Counter(x["kind"] for x in p)
    assert set(kinds) == {"code", "math", "extraction", "writing", "chat"}
    assert min(kinds.values()) >= 40, kinds
    assert len({x["text"] for x in p}) == len(p)
    bench = BenchmarkFilter()
    assert sum(not bench.ok(x["text"]) for x in p) <= len(p) // 50


def test_recipe_pool_and_answer_caps(monkeypatch):
    assert collect.recipe_pool("v4", 50)(3) == build_prompts_v4(50, 3)
    assert collect.recipe_pool("v3", 50)(3) == build_prompts(50, 3)
    seen = {}
    monkeypatch.setattr(collect, "run_collect", lambda args, **kw: seen.update(args=args, **kw))
    assert collect.main(["--prompt-mix", "v4", "--num-prompts", "7"]) == 0
    assert seen["args"].max_new == 512 and seen["args"].data == "data/smollm2"
    assert seen["pool_name"] == "v4" and seen["follow_ups"]
    assert seen["prompts"](1) == build_prompts_v4(7, 1)
    collect.main(["--max-new", "64"])
    assert seen["args"].max_new == 64 and seen["pool_name"] == "v3"
