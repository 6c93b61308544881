"""Prompts the target writes itself (self-instruct without seeds).

The instruct model is given only its chat template up to the start of a user turn (system
turn + ``<|im_start|>user\\n``) and samples what a user might ask, at temperature ~1. A
request is kept when it ends with the end-of-turn token within the token budget, has a
plausible length, reads as English, is not a duplicate (of this run, of earlier runs or of
the template/corpus prompts) and shares no word n-gram with a benchmark
(``overlap.BenchmarkFilter``). Kept requests are stored chat-templated as ``requests``
shards; ``generate.generate_answers`` answers them later.
"""

from __future__ import annotations

import collections
import re
import time

import jax
import numpy as np

from dominotree_jax.train.data.generate import bucket, run_decode
from dominotree_jax.train.data.overlap import BenchmarkFilter, words
from dominotree_jax.train.data.shards import ShardStore

SOURCE = "self:request"
_SENTINEL = "\x00REQUEST\x00"
# Common English words: a request must contain at least two of them.
_ENGLISH = frozenset(
    "the a an and or of to in on for with is are be can you i me my your how what why when "
    "which who write explain give make please do does it this that about from should would "
    "could if as by".split())


def user_turn_prefix(tokenizer) -> list[int]:
    """Token ids of the chat template up to where a user's text starts."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": _SENTINEL}],
                                        add_generation_prompt=False, tokenize=False)
    head = ids[:ids.index(_SENTINEL)]
    return list(tokenizer.encode(head, add_special_tokens=False))


def normalize(text: str) -> str:
    return " ".join(words(text))


def reject_reason(text: str, *, min_words: int = 4, max_words: int = 120) -> str | None:
    """Why a generated request is not kept by the text filters (None: keep it)."""
    w = text.split()
    if not min_words <= len(w) <= max_words:
        return "length"
    letters = [c for c in text if c.isalpha()]
    if not letters or sum(c.isascii() for c in letters) / len(letters) < 0.97:
        return "language"
    if len(_ENGLISH.intersection(x.lower() for x in re.findall(r"[A-Za-z']+", text))) < 2:
        return "language"
    if "<|" in text or "|>" in text:
        return "special"
    return None


def generate_requests(target, store: ShardStore, bench: BenchmarkFilter, *, batch: int,
                      seed: int, known: set[str], temperature: float = 1.0,
                      max_new: int = 64, log=print) -> dict:
    """Sample one batch of requests, filter them and append the kept ones as one
    ``requests`` shard (when any is kept). ``known``: normalized texts already used (updated).
    Returns counts by outcome."""
    tok = target.tokenizer
    prefix = user_turn_prefix(tok)
    end_ids = set(target.eos_ids)
    shard_no = len(store.entries("requests"))
    # The sample key depends on the seed and how many request batches exist: resumable runs
    # draw new samples instead of repeating the same batch.
    key = jax.random.key(seed * 1_000_003 + 7919 * (shard_no + 1) + store_salt(store))
    t0 = time.time()
    toks, num = run_decode(target, [prefix] * batch, width=bucket(len(prefix)), batch=batch,
                           max_new=max_new, temperature=temperature, key=key)
    dt = time.time() - t0
    counts: collections.Counter = collections.Counter()
    rows = []
    for r in range(batch):
        out = toks[r, :num[r]].tolist()
        if not out or out[-1] not in end_ids:
            counts["unfinished"] += 1
            continue
        text = tok.decode(out[:-1], skip_special_tokens=False).strip()
        why = reject_reason(text)
        if why is None and normalize(text) in known:
            why = "duplicate"
        if why is None and not bench.ok(text):
            why = "benchmark_overlap"
        if why is not None:
            counts[why] += 1
            continue
        ids = list(tok.apply_chat_template([{"role": "user", "content": text}],
                                           add_generation_prompt=True, return_dict=False))
        if len(ids) > 256:
            counts["length"] += 1
            continue
        known.add(normalize(text))
        rows.append((ids, len(ids), SOURCE))
        counts["kept"] += 1
    if rows:
        store.append("requests", rows, {
            "generator": "dominotree_jax.decode(method='ar') from the user-turn prefix",
            "temperature": temperature, "max_new_tokens": max_new, "batch": batch,
            "seed": seed, "gen_seconds": round(dt, 2), "sampled": batch,
            "rejected": {k: v for k, v in counts.items() if k != "kept"}})
    log(f"requests: kept {counts['kept']}/{batch} in {dt:.0f}s "
        f"({dict(counts)})")
    return dict(counts, seconds=dt)


def store_salt(store: ShardStore) -> int:
    """A number that changes with every shard written (keeps request keys fresh when answer
    shards were written in between)."""
    return int(np.uint32(len(store.manifest["shards"])))


def pending_requests(store: ShardStore, answered: set[bytes]) -> list[tuple[list[int], str]]:
    """Stored requests that have no answer yet, in storage order."""
    from dominotree_jax.train.data.generate import prompt_key
    return [(t.tolist(), s) for t, _, s in store.rows("requests")
            if prompt_key(t) not in answered]
