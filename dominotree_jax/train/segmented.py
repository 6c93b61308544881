"""Segmented (refilling) answer generation: every decode call runs a full batch.

The plain path (``generate.generate_answers`` with ``segment=0``) decodes one batch until every
row stops, so a batch with one 512-token answer runs 512 steps while most rows sit finished,
and the last batch of a width bucket runs the full-batch program for a handful of prompts.
Here a pool of in-flight rows is kept instead. Each call of the same jitted ``decode``
(``method="ar"``) runs at most ``segment`` new tokens for up to ``batch`` rows, fresh
prompts and continuing rows mixed. Rows that stopped (a stop id) or reached the answer cap are
harvested. Unfinished rows continue in a later call with ``prompt + answer so far`` as their
prompt: the re-prefill is cheap next to ``segment`` decode steps. The pool is refilled with fresh
prompts, so every call runs full while prompts remain. Each call's width is the bucket
(``SEGMENT_BUCKETS``) of the longest row it holds, so only a few programs compile.

Same answers: a greedy row continues greedily, so it gets the greedy continuation of prompt +
partial answer. The chunked prefill of the partial answer and the one-row steps it replaces
sum in a different order, so float noise may rarely flip a near-tie between two tokens. Sampled
rows keep sampling, with a fresh key per call (``jax.random.fold_in`` of a key from the seed and
the shard count at start, by call number). The answer cap ``max_new`` holds exactly over all
segments: tokens past it are cut off. A stored row is the original prompt ids + the full answer,
with its source, the same rows the plain path stores.

Resumable: only completed rows reach a shard, ``batch`` rows per shard, so a killed run loses
only its in-flight rows and its completed but unwritten ones (fewer than ``batch``). They have
no answer, so the next run asks them again. Stopping (deadline, ``max_batches``, prompts used
up): no fresh prompt is admitted, the in-flight rows are finished (at most
``ceil(max_new / segment)`` more calls), and the rest goes into a last, smaller shard.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Iterable

import jax

from dominotree_jax.train.generate import (PROMPT_BUCKETS, answer_shard_info, answer_topk,
                                           bucket, prompt_key, run_decode)
from dominotree_jax.train.shards import ShardStore

# Widths of a segmented call: the prompt buckets, then widths that also hold the longest
# prompt (768-token follow-ups) plus a 512-token answer so far, and more.
SEGMENT_BUCKETS = PROMPT_BUCKETS + (1280, 1536, 2048, 3072, 4096)


@dataclasses.dataclass
class _Row:
    prompt: list[int]        # the original chat-templated prompt ids
    source: str
    answer: list[int]        # the answer so far
    key: bytes               # prompt_key(prompt)


class SegmentedAnswerer:
    """A pool of in-flight answer rows at one temperature, writing completed rows to ``store``
    as ``answers`` shards of ``batch`` rows (module docstring)."""

    GENERATOR = "dominotree_jax.decode(method='ar'), segmented"   # the manifest's generator
    KIND = "segmented"                                             # the log's word for it

    def __init__(self, target, store: ShardStore, *, batch: int, max_new: int, segment: int,
                 seed: int, temperature: float = 0.0, store_topk: int = 0,
                 extra_info: dict | None = None, log: Callable[[str], None] = print):
        if segment < 1:
            raise ValueError(f"segment must be >= 1 tokens, got {segment}")
        if batch < 1 or max_new < 1:
            raise ValueError(f"batch and max_new must be >= 1, got {batch}, {max_new}")
        if store_topk < 0:
            raise ValueError(f"store_topk must be >= 0, got {store_topk}")
        self.target, self.store, self.batch, self.max_new = target, store, batch, max_new
        self.segment, self.seed, self.temperature = segment, seed, temperature
        self.store_topk, self.extra_info, self.log = store_topk, dict(extra_info or {}), log
        self.stop = set(int(t) for t in target.eos_ids)
        self.pool: list[_Row] = []          # in flight, at most ``batch``
        self.done: list[_Row] = []          # completed, not yet in a shard
        self.busy: set[bytes] = set()       # keys of pool + done
        self.seen: set[bytes] = set()       # keys of every row ever admitted here
        self.admitted = 0
        self.calls = 0
        self.full_calls = 0                 # calls that ran ``batch`` rows
        self.call_log: list[tuple[int, int]] = []   # per call: (rows, fresh rows among them)
        self._key_base = seed * 1_000_003 + len(store.entries("answers"))
        self._seconds = 0.0                 # decode-call seconds since the last shard
        self._calls_since = 0

    def admit(self, items: Iterable[tuple[list[int], str]], *, exclude=frozenset(),
              limit: int | None = None) -> int:
        """Fill the pool up to ``batch`` rows from ``items`` (prompt ids, source), skipping
        prompts admitted here before or in ``exclude`` (keys); at most ``limit``
        admissions over this answerer's life. Returns how many were admitted."""
        n = 0
        for ids, src in items:
            if len(self.pool) >= self.batch or (limit is not None and self.admitted >= limit):
                break
            k = prompt_key(ids)
            if k in self.seen or k in exclude:
                continue
            if not ids:
                raise ValueError("an empty prompt cannot be answered")
            self.pool.append(_Row(list(ids), src, [], k))
            self.busy.add(k)
            self.seen.add(k)
            self.admitted += 1
            n += 1
        return n

    def call(self) -> None:
        """One decode call: up to ``segment`` new tokens for every pooled row, then harvest."""
        if not self.pool:
            raise ValueError("no row in flight")
        prompts = [r.prompt + r.answer for r in self.pool]
        width = bucket(max(len(p) for p in prompts), SEGMENT_BUCKETS)
        key = (jax.random.fold_in(jax.random.key(self._key_base), self.calls)
               if self.temperature > 0 else None)
        t0 = time.time()
        toks, num = run_decode(self.target, prompts, width=width, batch=self.batch,
                               max_new=self.segment, temperature=self.temperature, key=key)
        self._seconds += time.time() - t0
        self.calls += 1
        self._calls_since += 1
        self.full_calls += len(self.pool) == self.batch
        self.call_log.append((len(self.pool), sum(not r.answer for r in self.pool)))
        keep = []
        for r, row in enumerate(self.pool):
            new = toks[r, :num[r]].tolist()[:self.max_new - len(row.answer)]
            row.answer += new
            if len(row.answer) >= self.max_new or any(t in self.stop for t in new):
                self.done.append(row)
            else:
                keep.append(row)
        self.pool = keep

    def write_shard(self) -> dict | None:
        """Write up to ``batch`` completed rows as one shard (None when there are none)."""
        if not self.done:
            return None
        rows_in, self.done = self.done[:self.batch], self.done[self.batch:]
        rows = [(r.prompt + r.answer, len(r.prompt), r.source) for r in rows_in]
        longest = max(len(t) for t, _, _ in rows)
        info = answer_shard_info(
            self.target, generator=self.GENERATOR,
            temperature=self.temperature, max_new=self.max_new, batch=self.batch,
            prompt_width=bucket(max(p for _, p, _ in rows), SEGMENT_BUCKETS), seed=self.seed,
            seconds=self._seconds,
            capped_rows=sum(len(r.answer) >= self.max_new for r in rows_in),
            extra_info=self.extra_info, segment=self.segment, decode_calls=self._calls_since,
            **self.shard_details(rows_in))
        topk = (answer_topk(self.target, rows, self.store_topk,
                            bucket(longest, SEGMENT_BUCKETS)) if self.store_topk else None)
        e = self.store.append("answers", rows, info, topk=topk)
        for r in rows_in:
            self.busy.discard(r.key)
        dt, self._seconds, self._calls_since = self._seconds, 0.0, 0
        # rows completed by calls already timed in an earlier shard (``finish``) take no time
        rate = (f"in {dt:.0f}s ({e['answer_tokens'] / dt:.0f} tok/s)" if dt > 0
                else "(their calls timed in the shard before)")
        self.log(f"{e['file']}: {e['rows']} prompts ({self.KIND}, {info['decode_calls']} calls "
                 f"of <= {self.segment} tokens), {e['answer_tokens']} answer tokens {rate}")
        return e

    def shard_details(self, rows_in: list[_Row]) -> dict:
        """More manifest fields for a shard of ``rows_in`` (a subclass's own)."""
        return {}

    def fill_shard(self, items: list[tuple[list[int], str]], *, deadline: float | None = None,
                   exclude=frozenset(), limit: int | None = None) -> dict | None:
        """Run calls (refilling from ``items`` before each) until ``batch`` rows are complete,
        then write them as one shard and return its entry. Returns None, writing nothing, when
        the deadline passed or no row is left to run (``finish`` then drains the pool)."""
        while len(self.done) < self.batch:
            if deadline is not None and time.time() > deadline:
                return None
            self.admit(items, exclude=exclude, limit=limit)
            if not self.pool:
                return None
            self.call()
        return self.write_shard()

    def finish(self) -> list[dict]:
        """Finish the in-flight rows without admitting new ones (at most
        ``ceil(max_new / segment)`` calls) and write every completed row; the entries written."""
        if self.pool:
            self.log(f"finishing {len(self.pool)} in-flight rows (no new prompts)")
        for _ in range(math.ceil(self.max_new / self.segment)):
            if not self.pool:
                break
            self.call()
        assert not self.pool, "a row outlived the answer cap"
        out = []
        while self.done:
            out.append(self.write_shard())
        return out


def generate_answers_segmented(target, store: ShardStore, todo: list[tuple[list[int], str]], *,
                               batch: int, max_new: int, segment: int, seed: int,
                               deadline: float | None = None, max_batches: int | None = None,
                               temperature: float = 0.0, store_topk: int = 0,
                               extra_info: dict | None = None,
                               log: Callable[[str], None] = print,
                               answerer: Callable[..., SegmentedAnswerer] | None = None) -> dict:
    """``generate.generate_answers`` with ``segment > 0`` (``todo``: not-yet-answered,
    de-duplicated prompts). ``max_batches`` admits at most ``max_batches * batch`` prompts, so
    exactly that many shards are written when enough prompts remain. Returns the counts of
    this call, plus ``calls`` and ``full_calls`` (decode calls that ran ``batch`` rows).
    ``answerer``: the pool's class or factory (default ``SegmentedAnswerer``; e.g. a
    ``slots.SlotAnswerer`` with its ``max_prompt`` bound)."""
    gen = (answerer or SegmentedAnswerer)(
        target, store, batch=batch, max_new=max_new, segment=segment, seed=seed,
        temperature=temperature, store_topk=store_topk, extra_info=extra_info, log=log)
    limit = None if max_batches is None else max_batches * batch
    stats = {"batches": 0, "rows": 0, "answer_tokens": 0, "seconds": 0.0, "pending": len(todo)}
    entries = []
    while True:
        e = gen.fill_shard(todo, deadline=deadline, limit=limit)
        if e is None:
            break
        entries.append(e)
    if deadline is not None and time.time() > deadline:
        log("deadline reached: no new prompt admitted")
    entries += gen.finish()
    for e in entries:
        stats["batches"] += 1
        stats["rows"] += e["rows"]
        stats["answer_tokens"] += e["answer_tokens"]
        stats["seconds"] += e["gen_seconds"]
    stats.update(calls=gen.calls, full_calls=gen.full_calls, call_log=gen.call_log)
    return stats
