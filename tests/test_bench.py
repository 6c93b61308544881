"""The benchmark driver end to end on a tiny random target and drafter (no tokenizer)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import dominotree_jax as dj
from dominotree_jax.measure import eval_prompts as prompt_sets
from benchmarks.methods.bench_report import markdown, summarize
from benchmarks.methods.bench_run import (BenchSettings, bucket_width, check_identity, pad_prompt,
                                      run_and_report)
from dominotree_jax.config import DrafterConfig, TargetConfig
from dominotree_jax.model.drafter import init_drafter_params
from dominotree_jax.model.target import init_target_params

TCFG = TargetConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    architecture="LlamaForCausalLM")
DCFG = DrafterConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, block_size=4,
                     mask_token_id=127, num_target_layers=4, target_layer_ids=(1, 3),
                     shift_label=True, projector_type="domino", gru_hidden_dim=16, emb_dim=16)


@pytest.fixture(scope="module")
def tiny_pair():
    target = dj.Target(TCFG, init_target_params(TCFG, seed=1), tokenizer=None)
    return dj.Pair(target, DCFG, init_drafter_params(DCFG, seed=2))


def test_end_to_end_writes_outputs_and_passes_identity(tiny_pair, tmp_path, monkeypatch):
    # the driver's programs compiled as the other tiny-model tests compile theirs (FAST_XLA:
    # the same HLO, LLVM's expensive passes off); everything else is the benchmark's own
    import functools

    from benchmarks.methods import bench_run
    from decode_helpers import FAST_XLA

    monkeypatch.setattr(bench_run, "CompiledDecoders", functools.partial(
        bench_run.CompiledDecoders, compiler_options=FAST_XLA))
    rng = np.random.default_rng(0)
    prompts = {"tiny": [rng.integers(1, 127, 5).tolist(), rng.integers(1, 127, 11).tolist()]}
    settings = BenchSettings(methods=("ar", "dominotree"), temperatures=(0.0, 1.0),
                             max_new_tokens=12, budget=6, node_topk=3, top_m=8, buckets=(16,))
    out = str(tmp_path / "res")
    run_and_report(tiny_pair, prompts, settings, out, target_name="tiny",
                   drafter_name="tiny", command="pytest", progress=False)
    for name in ("bench.json", "bench.md"):
        assert os.path.getsize(os.path.join(out, name)) > 0, name
    saved = json.load(open(os.path.join(out, "bench.json")))
    # runs: ar, dominotree at budget 6, dominotree/auto (budget="auto", the default extra run)
    assert saved["mismatches"] == [] and len(saved["records"]) == 2 * 2 * 3
    assert saved["command"] == "pytest" and saved["machine"]["cpu_count"] >= 1
    assert {c["width"] for c in saved["compiles"]} == {16} and len(saved["compiles"]) == 6
    auto = {(c["temperature"], c["method"]): c for c in saved["cells"]}[0.0, "dominotree/auto"]
    assert auto["mismatches"] == 0 and sum(auto["sizes"].values()) == auto["rounds"]
    assert set(auto["sizes"]) <= {"0", "2", "4", "8", "16"}
    cells = {(c["temperature"], c["method"]): c for c in saved["cells"]}
    assert cells[0.0, "ar"]["tau"] == 1.0 and cells[0.0, "ar"]["speedup"] == 1.0
    assert cells[0.0, "dominotree"]["mismatches"] == 0
    assert cells[1.0, "dominotree"]["mismatches"] is None
    for r in saved["records"]:
        assert r["num_tokens"] == 12 and len(r["taus"]) == r["num_rounds"]
        assert 1 + sum(r["taus"]) >= r["num_tokens"]
    md = open(os.path.join(out, "bench.md")).read()
    assert "| tiny | 0 |" in md and "WARNING" not in md and "| dominotree/auto |" in md


def test_broken_output_is_reported_as_mismatch():
    assert check_identity([1, 2, 3], [1, 2, 3]) is None
    mm = check_identity([1, 2, 3, 4], [1, 2, 9, 4])
    assert mm["first_diff"] == 2 and mm["ref_token"] == 3 and mm["token"] == 9
    assert check_identity([1, 2, 3], [1, 2])["first_diff"] == 2
    # a broken record flows into the cell count and the markdown warning
    base = dict(dataset="d", temperature=0.0, prompt=0, num_tokens=4, num_rounds=2,
                taus=[2, 2], wall_s=0.1)
    records = [dict(base, method="ar", mismatch=None),
               dict(base, method="dflash", mismatch=mm)]
    cells = summarize(records)
    assert [c["mismatches"] for c in cells] == [0, 1]
    result = {"cells": cells, "command": "x", "compiles": [], "machine": {}, "total_s": 1.0,
              "mismatches": [dict(mm, dataset="d", prompt=0, method="dflash")],
              "settings": dict(target="t", drafter="d", methods=["ar", "dflash"], num_prompts=1,
                               max_new_tokens=4, budget=16, node_topk=8, top_m=64, seed=0)}
    md = markdown(result)
    assert "WARNING: 1 temperature-0" in md and "| **1** |" in md


def test_buckets_and_padding():
    assert bucket_width(5, (16, 64)) == 16 and bucket_width(17, (16, 64)) == 64
    assert bucket_width(130, (16, 64)) == 192
    p = pad_prompt([3, 4], 4)
    assert p.shape == (1, 4) and p.tolist() == [[3, 4, 0, 0]]


def test_prompt_loaders_are_deterministic():
    for name in prompt_sets.LOADERS:
        first = prompt_sets.load(name, 3)
        assert len(first) == 3 and all(isinstance(s, str) and s for s in first)
        assert prompt_sets.load(name, 3, seed=5) == prompt_sets.load(name, 3, seed=5)
    assert prompt_sets.load("humaneval", 1)[0].startswith("Complete the following Python")
    assert len(prompt_sets.load("math500")) > 300


def test_wider_sets_hold_the_prompt_sets():
    """The overlap filter's sets: every MT-Bench turn (two per question, the first turns in
    order among them) and every mmath question (MATH500's among them, and others)."""
    first, turns = prompt_sets.mtbench(), prompt_sets.mtbench_turns()
    assert len(turns) == 2 * len(first) and turns[0::2] == first and turns[1::2] != first
    everything = prompt_sets.mmath()
    assert set(prompt_sets.math500()) < set(everything)


def test_bf16_host_runs_every_config_on_every_prompt_in_turn(tiny_pair):
    """``methods bf16_host``'s driver: each run decodes every prompt (rotated order), its
    lossless runs give the reference's tokens, and a plain run has only plain rounds."""
    from benchmarks.methods.bf16_host import run_configs

    rng = np.random.default_rng(1)
    prompts = {"a": [rng.integers(1, 127, 5).tolist()], "b": [rng.integers(1, 127, 9).tolist()]}
    runs = {"ar": (tiny_pair, tiny_pair.config("ar", max_new_tokens=8, stop_ids=())),
            "tree": (tiny_pair, tiny_pair.config("dominotree", max_new_tokens=8, budget=4,
                                                 node_topk=2, stop_ids=()))}
    out = run_configs(runs, prompts, width=16, reps=2)
    for name in prompts:
        assert out["ar"][name]["plain"] == 1.0 and out["tree"][name]["plain"] == 0.0
        assert out["ar"][name]["tok_s"] > 0 and out["tree"][name]["tau"] >= 1.0
        assert len(out["tree"][name]["outs"]) == 1
        assert np.array_equal(out["tree"][name]["outs"][0], out["ar"][name]["outs"][0])
