"""Drafter data pipeline: token shards + manifest, resumable/appending generation, the
benchmark overlap check, prompt filters. Tiny random target; no real model."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import dominotree_jax as dj
from dominotree_jax.measure import eval_prompts
from dominotree_jax.config import TargetConfig
from dominotree_jax.model.target import init_target_params
from dominotree_jax.train.data import self_prompts
from dominotree_jax.train.data.generate import answered_keys, bucket, generate_answers, plan_batches
from dominotree_jax.train.data.overlap import BenchmarkFilter, ngrams
from dominotree_jax.train.data.shards import ShardStore

TCFG = TargetConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                    rope_theta=10000.0, architecture="LlamaForCausalLM")


@pytest.fixture(scope="module")
def target():
    params = init_target_params(TCFG, seed=1)
    params["embed_tokens"]["weight"][...] = params["embed_tokens"]["weight"][...] * 30.0
    return dj.Target(TCFG, params, None)


def test_shard_round_trip(tmp_path):
    store = ShardStore(str(tmp_path), vocab_size=50000, tokenizer="test")
    rows = [([1, 2, 3, 49999], 2, "a"), ([7], 1, "b"), ([5, 6, 0], 0, "a")]
    e = store.append("answers", rows, {"seed": 3, "temperature": 0.0})
    assert e["rows"] == 3 and e["prompt_tokens"] == 3 and e["answer_tokens"] == 5
    assert e["seed"] == 3 and e["created_utc"].endswith("Z")
    with np.load(os.path.join(str(tmp_path), e["file"])) as z:
        assert z["tokens"].dtype == np.uint16
    again = ShardStore(str(tmp_path))           # reopened from manifest.json alone
    got = [(t.tolist(), p, s) for t, p, s in again.rows("answers")]
    assert got == rows
    assert again.totals()["answers"] == {"shards": 1, "rows": 3, "prompt_tokens": 3,
                                         "answer_tokens": 5}
    with pytest.raises(ValueError, match="vocabulary"):
        ShardStore(str(tmp_path), vocab_size=49152)
    with pytest.raises(ValueError, match="outside"):
        again.append("answers", [([50000], 0, "a")], {})
    with pytest.raises(ValueError, match="kind"):
        again.append("features", rows, {})
    with pytest.raises(ValueError, match="at most 65,536"):
        ShardStore(str(tmp_path / "big"), vocab_size=70000)
    with pytest.raises(FileNotFoundError):
        ShardStore(str(tmp_path / "none"))


def test_generation_resumes_and_appends(tmp_path, target):
    rng = np.random.default_rng(0)
    prompts = [(rng.integers(1, 90, size=int(rng.integers(3, 12))).tolist(), "test")
               for _ in range(10)]
    ref_store = ShardStore(str(tmp_path / "ref"), vocab_size=TCFG.vocab_size)
    generate_answers(target, ref_store, prompts, batch=4, max_new=6, seed=0, log=lambda m: None)
    ref = {tuple(t[:p]): t[p:].tolist() for t, p, _ in ref_store.rows()}
    assert len(ref) == 10
    # The answers are the target's greedy answers (plain AR generate).
    ids = prompts[0][0]
    np.testing.assert_array_equal(ref[tuple(ids)], dj.generate(target, ids, max_new_tokens=6))

    store = ShardStore(str(tmp_path / "run"), vocab_size=TCFG.vocab_size)
    s1 = generate_answers(target, store, prompts, batch=4, max_new=6, seed=0, max_batches=1,
                          log=lambda m: None)
    assert s1["batches"] == 1 and s1["rows"] == 4
    # A run killed while writing its next shard leaves an orphan file outside the manifest.
    with open(os.path.join(str(tmp_path / "run"), "answers_00001.npz.tmp"), "wb") as f:
        f.write(b"partial")
    resumed = ShardStore(str(tmp_path / "run"))
    s2 = generate_answers(target, resumed, prompts + prompts[:3], batch=4, max_new=6, seed=0,
                          log=lambda m: None)
    assert s2["rows"] == 6 and s2["pending"] == 6          # nothing answered twice
    got = {tuple(t[:p]): t[p:].tolist() for t, p, _ in ShardStore(str(tmp_path / "run")).rows()}
    assert got == ref
    manifest = json.load(open(os.path.join(str(tmp_path / "run"), "manifest.json")))
    assert [s["file"] for s in manifest["shards"]] == [f"answers_0000{i}.npz" for i in range(3)]
    assert all(s["max_new_tokens"] == 6 and s["temperature"] == 0.0 for s in manifest["shards"])
    assert len(answered_keys(resumed)) == 10
    # Another run with new prompts appends to the same directory.
    more = [([3, 4, 5, 6], "more")]
    s3 = generate_answers(target, ShardStore(str(tmp_path / "run")), more + prompts, batch=4,
                          max_new=6, seed=1, log=lambda m: None)
    assert s3["rows"] == 1
    assert ShardStore(str(tmp_path / "run")).totals()["answers"]["rows"] == 11


def test_plan_batches_groups_by_width():
    items = [([1] * n, "s") for n in (10, 100, 20, 70, 30, 200)]
    plan = plan_batches(items, 2)
    assert sorted(i for _, idx in plan for i in idx) == list(range(6))
    for width, idx in plan:
        assert all(bucket(len(items[i][0])) == width for i in idx) and len(idx) <= 2
    with pytest.raises(ValueError, match="longer than"):
        bucket(10_000)


def test_overlap_rejects_benchmark_prompts():
    f = BenchmarkFilter()
    assert set(f.sets) >= {"humaneval", "mtbench", "math500"}
    for text in (eval_prompts.mtbench(1)[0], eval_prompts.math500(1, seed=3)[0],
                 eval_prompts.humaneval(1, seed=5)[0]):
        assert not f.ok(text)
        # Embedded in a longer request, lightly reformatted, it is still caught.
        assert not f.ok("Please help me with this.\n\n" + text.upper().replace("\n", " "))
    assert f.ok("Write a haiku about a cat sleeping in the sun.")


def test_overlap_ngrams_and_short_texts():
    f = BenchmarkFilter({"toy": ["What is 2 + 2?", "one two three four five six seven eight nine"]},
                        n=8)
    assert not f.ok("what is 2+2")                 # a short benchmark text, matched whole
    assert f.ok("What is 2 + 2 + 2?")
    assert not f.ok("Count: two three four five six seven eight nine!")
    assert f.ok("one two three four five six seven")
    assert len(ngrams("a b c d e f g h i", 8)) == 2
    with pytest.raises(ValueError, match="n-gram size"):
        BenchmarkFilter({"toy": []}, n=2)


def test_request_filters():
    assert self_prompts.reject_reason("How do I bake bread at home without yeast?") is None
    assert self_prompts.reject_reason("Hi") == "length"
    assert self_prompts.reject_reason("Wie backe ich Brot ohne Hefe zu Hause?") == "language"
    assert self_prompts.reject_reason("如何 在家 烤 面包 without the yeast please") == "language"
    assert self_prompts.reject_reason("Tell me a <|im_start|> story about the sea") == "special"
    assert self_prompts.normalize("Hello,  World!") == "hello world"


class _CharTokenizer:
    """A toy chat tokenizer: one id per character (ids 3..95), 1/2 = turn start/end."""

    eos_token_id, unk_token_id = 2, 0

    def convert_tokens_to_ids(self, token):
        return 0

    def apply_chat_template(self, msgs, add_generation_prompt=False, tokenize=True,
                            return_dict=False):
        text = "".join(f"\x01{m['role']}\n{m['content']}\x02\n" for m in msgs)
        text += "\x01assistant\n" if add_generation_prompt else ""
        return text if not tokenize else self.encode(text)

    def encode(self, text, add_special_tokens=False):
        return [1 if c == "\x01" else 2 if c == "\x02" else 3 + (ord(c) % 93) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i - 3 + 32) if i >= 3 else "" for i in ids)


def test_generate_requests_counts(tmp_path, target):
    t = dj.Target(TCFG, target.params, _CharTokenizer())
    store = ShardStore(str(tmp_path), vocab_size=TCFG.vocab_size)
    prefix = self_prompts.user_turn_prefix(t.tokenizer)
    assert prefix == t.tokenizer.encode("\x01user\n")
    c = self_prompts.generate_requests(t, store, BenchmarkFilter({"toy": ["x y z"]}, n=3),
                                       batch=4, seed=0, known=set(), max_new=8,
                                       log=lambda m: None)
    assert sum(v for k, v in c.items() if k != "seconds") == 4
