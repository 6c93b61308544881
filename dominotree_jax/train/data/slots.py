"""Refilling answer generation on a persistent KV cache (``collect --refill K``).

The plain path (``generate.generate_answers``) decodes one batch until every row stops, so a
batch with one 512-token answer runs 512 steps while most rows sit finished. Here a pool of
in-flight rows is kept instead: the batch is a fixed set of ``B`` *slots*, each a row of one
persistent KV cache of ``S`` positions (``S`` = the longest prompt allowed + the answer cap),
and finished rows make room for fresh prompts between calls. Two jitted programs run on it:

- ``insert_rows``: prefill a few new prompts (one ``target.prefill`` of their rows) and
  copy their cache rows into free slots; their first answer token comes from the prefill's
  last logits, as in ``decode``. Only the new prompts go through the target.
- ``step_slots``: ``steps`` one-token target forwards for every slot at its own position
  (``forward_cached_groups``: per-row write slots, each group of slots reading the cache only
  up to its own width), greedy or sampled as ``decode`` samples.

A step reads every slot's cache up to its group's width, and that read, not the weights, is
most of a step (docs/training.md). So before each call the slots are regrouped by position
(``regroup``: rows that outgrew their group swap into a wider one, when the reads saved pay
for the copies, ``move_slots``) and each of ``SLOT_GROUPS`` groups reads the multiple of
``WIDTH_STEP`` slots that holds its longest row (``slot_widths``; static widths, one compiled
step per combination, no conditional). New rows go in longest first, in pieces of
``INSERT_ROWS`` rows (``insert_pieces``).

``SlotAnswerer.call`` inserts the pool's new rows into free slots, runs ``segment`` steps, and
harvests rows that stopped or reached the cap (their slots are free for the next call).
Completed rows are written ``batch`` at a time as ``answers`` shards, so a killed run loses only
its in-flight rows and its completed but unwritten ones (fewer than ``batch``); they have no
answer, so the next run asks them again. Stopping (deadline, ``max_batches``, prompts used up):
no fresh prompt is admitted, the in-flight rows are finished (``finish``: at most
``ceil(max_new / segment)`` more calls), and the rest goes into a last, smaller shard.

Loop stop (``loop_window = W > 0``): a row also finishes when some window of ``W`` answer tokens
has occurred ``loop_repeats`` times (``loops.loop_end``). SmolLM2-135M falls into verbatim
repetition in most answers that reach a 512-token cap; the row then keeps the loop's onset
(the window twice before, so a drafter still learns to continue it) and stops paying for the
rest.

Same answers: greedy rows take the argmax of the same target forward, one token at a time,
so they equal ``decode(method="ar")``'s up to float summation order (tests compare them on a
tiny target). A row's tokens past its stop id inside a call are dropped on the host. Sampled
rows draw from keys folded from the seed, the shard count at start and the call number.

(A third engine, re-prefilling segments without a kept cache, ``collect --segment``, was
removed: 39 against the plain path's 56 tok/s, Intel Xeon, batch 64, 2026-12-02, and no shard
of ``data/smollm2`` was made with it.)
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Callable, Iterable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.model.cache import KVCache
from dominotree_jax.model.target import bind_target, prefill
from dominotree_jax.sampling import sample_tokens
from dominotree_jax.train.data.generate import (PROMPT_BUCKETS, answer_shard_info, answer_topk,
                                                bucket, pending_prompts, prompt_key)
from dominotree_jax.train.data.loops import LoopWatch
from dominotree_jax.train.data.shards import ShardStore

# Widths of a stored row (prompt + answer: up to a 768-token follow-up + a 512-token answer,
# and more): the top-k forward of a shard and its manifest's ``prompt_width``.
ROW_BUCKETS = PROMPT_BUCKETS + (1280, 1536, 2048, 3072, 4096)

# Rows of one ``insert_rows`` program (one compiled program per (rows, prompt bucket)); a call's
# new rows are split into pieces of these sizes by ``insert_pieces``.
INSERT_ROWS = (4, 16, 64)

# Slot groups (``step_slots(widths=...)``): before each call the slots are grouped by
# position (``regroup``), longest first, into this many equal groups (the largest divisor of
# the batch that divides it), each reading the cache up to its own longest row, in multiples
# of ``WIDTH_STEP`` slots. On the AMD EPYC a batch-64 step of SmolLM2-135M costs ~150 ms plus
# ~0.3 ms per slot read (docs/training.md), so reading each group's width instead of the whole
# cache matters more than anything else in the step.
SLOT_GROUPS = 4
WIDTH_STEP = 128
# Rows of one ``move_slots`` program (regrouping moves only the rows whose group changed).
MOVE_ROWS = (8, 16, 32, 64)
# Regroup only when the slot reads a call saves pay for the rows it copies: a row moved cost
# ~50 ms on the AMD EPYC, one slot read by a group for one step ~0.3 ms / groups, so a move
# pays when segment * (slots saved over all groups) * MOVE_WORTH >= rows moved * groups
# (MOVE_WORTH = 0.3 / 50).
MOVE_WORTH = 0.006


def insert_pieces(lengths: list[int], sizes: tuple[int, ...] = INSERT_ROWS) -> list[list[int]]:
    """Split new rows (their prompt ``lengths``) into prefill pieces: indices, longest prompts
    first, each piece run by the program of ``piece_rows(len(piece))`` rows at the bucket of its
    longest prompt. Sorting by length keeps short prompts out of a long prompt's width. The rows
    left go in one piece when its program pads fewer than ``min(sizes)`` rows, else the
    largest size they fill is cut off first, so a call pads fewer than ``min(sizes)`` rows in
    all (one program of 64 for 24 rows padded 40 rows of prefill; now 16 + 4 + 4)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    pieces = []
    while order:
        left = len(order)
        fits = piece_rows(left, sizes) - left < min(sizes) if left <= max(sizes) else False
        n = left if fits else max(s for s in sizes if s <= left)
        pieces.append(order[:n])
        order = order[n:]
    return pieces


def piece_rows(n: int, sizes: tuple[int, ...] = INSERT_ROWS) -> int:
    """The rows of the program that runs a piece of ``n`` new rows (the smallest size >= n)."""
    return next(s for s in sorted(sizes) if s >= n)


class SlotState(NamedTuple):
    """The slots' carry: ``B`` rows of one cache of ``S`` positions."""
    cache: KVCache     # [B, K, S, D] per layer
    pos_B: jax.Array   # int32: positions in the cache = the slot of ``last_B``'s K/V
    last_B: jax.Array  # int32: the row's newest token, not yet through the target


def empty_slots(cfg, batch: int, slots: int, dtype) -> SlotState:
    cache = KVCache.for_target(cfg, batch, slots, dtype)
    return SlotState(cache, jnp.zeros((batch,), jnp.int32), jnp.zeros((batch,), jnp.int32))


@functools.partial(jax.jit, static_argnames=("cfg", "temperature"), donate_argnames=("state",))
def insert_rows(tparams, state: SlotState, prompt_BT, lengths_B, slot_B, key, *, cfg,
                temperature: float):
    """Prefill the right-padded new prompts ``prompt_BT`` (``lengths_B`` tokens each; this
    call's own batch) into the slots ``slot_B`` (an index past the state's rows drops that
    prompt: padding). Returns ``(state, first_B)``: the first answer token of each new prompt
    (``decode``'s first token: the prefill's last logits)."""
    target = bind_target(cfg, tparams)
    S = state.cache.max_len
    pre, last_logits_BV = prefill(target, prompt_BT, lengths_B, S)
    first_B = sample_tokens(key, last_logits_BV, temperature)

    def put(big, new):
        return big.at[slot_B].set(new.astype(big.dtype), mode="drop")

    cache = KVCache(tuple(map(put, state.cache.k, pre.cache.k)),
                    tuple(map(put, state.cache.v, pre.cache.v)))
    return SlotState(cache, put(state.pos_B, lengths_B), put(state.last_B, first_B)), first_B


@functools.partial(jax.jit, static_argnames=("cfg", "steps", "temperature", "widths", "fused"),
                   donate_argnames=("state",))
def step_slots(tparams, state: SlotState, key, *, cfg, steps: int, temperature: float,
               widths: tuple[int, ...] | None = None, fused: bool = True):
    """``steps`` AR steps for every slot: returns ``(state, tokens_BY)``, ``Y = steps``. A slot
    at the cache's last position keeps overwriting it (its row is past the cap: the host has
    stopped reading it). ``widths``: the slots in ``len(widths)`` equal groups, group ``g``'s
    attention reading only its first ``widths[g]`` cache slots (``slot_widths``; every live
    row's position + ``steps`` must fit its group's width); None: the whole cache
    (``forward_cached``, bucketed). ``fused``: with ``widths``, the groups' cache pass as
    elementwise products and sums (``forward_cached_groups``)."""
    target = bind_target(cfg, tparams)
    B, S = state.pos_B.shape[0], state.cache.max_len
    block_mask_BTT = jnp.ones((B, 1, 1), bool)   # a row sees itself

    def one(i, carry):
        st, tokens_BY = carry
        pos_B = jnp.minimum(st.pos_B, S - 1)
        if widths is None:
            out = target.forward_cached(st.last_B[:, None], pos_B[:, None], st.cache, pos_B,
                                        pos_B, block_mask_BTT)
        else:
            out = target.forward_cached_groups(st.last_B[:, None], pos_B[:, None], st.cache,
                                               pos_B, pos_B, block_mask_BTT, widths, fused)
        nxt_B = sample_tokens(jax.random.fold_in(key, i), target.logits(out.hidden[:, 0]),
                              temperature)
        return (SlotState(out.cache, jnp.minimum(st.pos_B + 1, S - 1), nxt_B),
                tokens_BY.at[:, i].set(nxt_B))

    return jax.lax.fori_loop(0, steps, one, (state, jnp.zeros((B, steps), jnp.int32)))


@functools.partial(jax.jit, donate_argnames=("state",))
def move_slots(state: SlotState, src_M, dst_M) -> SlotState:
    """Slot ``dst_M[m]`` of the result is slot ``src_M[m]`` of ``state``; other slots stay
    (every source is read before any slot is written, so moves may form cycles). A ``dst``
    past the batch is dropped (padding). Only the moved rows are copied, in place."""
    def move(a):
        return a.at[dst_M].set(a[src_M], mode="drop")
    return jax.tree.map(move, state)


def regroup(need: list[int], groups: int, slots_len: int) -> list[int]:
    """Where each slot's row goes for a call: ``order[i]`` = the old slot of the row that new
    slot ``i`` holds. The groups' widths are those of the rows ranked by ``need`` (largest
    first, ``slot_widths``); a row whose need its group's width holds stays put, and each
    row that outgrew its group swaps with a row (or a free slot) of a wide enough group that
    fits the one it leaves. So a call moves a few rows, not a full sort, and every group
    reads no more than the ranked grouping would."""
    B = len(need)
    size = B // groups
    ranked = sorted(range(B), key=lambda i: (-need[i], i))
    width = slot_widths([need[i] for i in ranked], groups, slots_len)
    order = list(range(B))
    at = list(need)                           # the need of the row each slot holds now
    for slot in ranked:
        mine = width[slot // size]
        if at[slot] <= mine:
            continue
        fits = [j for j in range(B) if width[j // size] >= at[slot] and at[j] <= mine]
        if not fits:   # every wide enough slot holds a row too long for this group:
            return ranked  # the full ranking (always valid)
        j = min(fits, key=lambda j: (at[j], j))
        order[slot], order[j] = order[j], order[slot]
        at[slot], at[j] = at[j], at[slot]
    return order


def slot_widths(need: list[int], groups: int, slots_len: int) -> tuple[int, ...]:
    """The cache slots each of ``groups`` equal groups of consecutive slots reads in a call:
    the multiple of ``WIDTH_STEP`` (at most ``slots_len``) that holds the largest ``need`` of
    the group (a live row's position + the call's steps; 0 for a free slot)."""
    size = len(need) // groups
    out = []
    for g in range(groups):
        top = max(need[g * size:(g + 1) * size])
        out.append(min(slots_len, max(WIDTH_STEP, -(-top // WIDTH_STEP) * WIDTH_STEP)))
    return tuple(out)


@dataclasses.dataclass
class _Row:
    prompt: list[int]        # the original chat-templated prompt ids
    source: str
    answer: list[int]        # the answer so far
    key: bytes               # prompt_key(prompt)


class SlotAnswerer:
    """A pool of in-flight answer rows at one temperature on persistent slots, writing completed
    rows to ``store`` as ``answers`` shards of ``batch`` rows (module docstring): each call runs
    ``segment`` steps; ``max_prompt`` is the longest prompt it admits (``S = bucket(max_prompt)
    + max_new``); ``loop_window > 0`` stops rows at a ``loop_repeats``-fold repeated window
    (``loops.loop_end``)."""

    GENERATOR = "dominotree_jax.train.slots (AR on a slot-refilled KV cache)"  # the manifest's

    def __init__(self, target, store: ShardStore, *, batch: int, max_new: int, segment: int,
                 seed: int, max_prompt: int, temperature: float = 0.0, store_topk: int = 0,
                 loop_window: int = 0, loop_repeats: int = 3, groups: int = SLOT_GROUPS,
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
        self._seconds = 0.0                 # call seconds since the last shard
        self._calls_since = 0
        self.max_prompt = bucket(max_prompt)
        self.slots_len = self.max_prompt + max_new
        limit = target.config.max_position_embeddings
        if self.slots_len > limit:
            raise ValueError(f"prompt bucket {self.max_prompt} + max_new {max_new} exceeds the "
                             f"target's {limit} positions")
        if loop_window < 0 or (loop_window and loop_repeats < 2):
            raise ValueError(f"loop stop needs window >= 1 and repeats >= 2 (or window 0: "
                             f"off), got {loop_window}, {loop_repeats}")
        if groups < 1:
            raise ValueError(f"slot groups must be >= 1, got {groups}")
        self.groups = math.gcd(batch, groups)   # equal groups: a divisor of the batch
        self.loop_window, self.loop_repeats = loop_window, loop_repeats
        self.watch: dict[bytes, LoopWatch] = {}   # key of an in-flight row -> its watch
        self.looped: set[bytes] = set()            # rows stopped by the loop rule
        self.state: SlotState | None = None
        self.slot_of: dict[bytes, int] = {}    # key of an in-flight row -> its slot

    def admit(self, items: Iterable[tuple[list[int], str]], *, exclude=frozenset(),
              limit: int | None = None) -> int:
        """Fill the pool up to ``batch`` rows from ``items`` (prompt ids, source), skipping
        prompts admitted here before or in ``exclude`` (keys); at most ``limit``
        admissions over this answerer's life. Returns how many were admitted."""
        items = list(items)
        too_long = [len(ids) for ids, _ in items if len(ids) > self.max_prompt]
        if too_long:
            raise ValueError(f"a prompt of {max(too_long)} tokens exceeds the slots' prompt "
                             f"width {self.max_prompt} (max_prompt)")
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

    def _key(self, what: int):
        return jax.random.fold_in(jax.random.key(self._key_base), self.calls * 2 + what)

    def _insert(self, rows) -> None:
        """Prefill ``rows`` (pool rows without a slot) into free slots, their first token into
        each row's answer."""
        free = sorted(set(range(self.batch)) - set(self.slot_of.values()))
        for lo, piece in enumerate(insert_pieces([len(r.prompt) for r in rows])):
            part = [rows[i] for i in piece]
            n = piece_rows(len(part))
            width = bucket(max(len(r.prompt) for r in part))
            prompt = np.zeros((n, width), np.int32)
            lengths = np.ones((n,), np.int32)
            slot = np.full((n,), self.batch, np.int32)   # out of range: dropped
            for i, row in enumerate(part):
                prompt[i, :len(row.prompt)] = row.prompt
                lengths[i] = len(row.prompt)
                slot[i] = free.pop(0)
                self.slot_of[row.key] = int(slot[i])
            self.state, first = insert_rows(
                self.target.params, self.state, jnp.asarray(prompt), jnp.asarray(lengths),
                jnp.asarray(slot), jax.random.fold_in(self._key(0), lo), cfg=self.target.config,
                temperature=self.temperature)
            for row, tok in zip(part, np.asarray(jax.device_get(first))[:len(part)].tolist()):
                self.watch[row.key] = LoopWatch(self.loop_window, self.loop_repeats)
                self._append(row, int(tok))

    def call(self) -> None:
        """Insert the pool's new rows, run ``segment`` steps for every slot, then harvest rows
        that stopped or reached the cap."""
        if not self.pool:
            raise ValueError("no row in flight")
        t0 = time.time()
        if self.state is None:
            self.state = empty_slots(self.target.config, self.batch, self.slots_len,
                                     jax.tree.leaves(self.target.params)[0].dtype)
        new = [r for r in self.pool if r.key not in self.slot_of]
        fresh = len(new)
        if new:
            self._insert(new)
        live = [r for r in self.pool if not self._finished(r)]
        if live:
            widths = self._arrange(live)
            self.state, toks = step_slots(self.target.params, self.state, self._key(1),
                                          cfg=self.target.config, steps=self.segment,
                                          temperature=self.temperature, widths=widths)
            toks = np.asarray(jax.device_get(toks))
            for row in live:
                for tok in toks[self.slot_of[row.key]].tolist():
                    self._append(row, int(tok))
                    if self._finished(row):
                        break
        self._seconds += time.time() - t0
        self.calls += 1
        self._calls_since += 1
        self.full_calls += len(self.pool) == self.batch
        self.call_log.append((len(self.pool), fresh))
        keep = []
        for row in self.pool:
            if self._finished(row):
                self.done.append(row)
                del self.slot_of[row.key], self.watch[row.key]
            else:
                keep.append(row)
        self.pool = keep

    def _arrange(self, live) -> tuple[int, ...]:
        """Group the slots for a call: live rows ranked by position, longest first, then the
        free slots (``regroup``; only rows whose group changed move); the groups' widths
        (``slot_widths``). A live row's position is the slot of its newest token."""
        need = [0] * self.batch
        for row in live:
            need[self.slot_of[row.key]] = len(row.prompt) + len(row.answer) - 1 + self.segment
        order = regroup(need, self.groups, self.slots_len)
        # a free slot's contents do not matter: only live rows are copied
        moved = [i for i in range(self.batch) if order[i] != i and need[order[i]] > 0]
        now = slot_widths(need, self.groups, self.slots_len)
        after = slot_widths([need[i] for i in order], self.groups, self.slots_len)
        if moved and (sum(now) - sum(after)) * self.segment * MOVE_WORTH < len(moved) * self.groups:
            return now          # not worth the copies: keep the layout (its widths fit it)
        if moved:
            n = piece_rows(len(moved), MOVE_ROWS) if len(moved) <= MOVE_ROWS[-1] else len(moved)
            dst = np.full((n,), self.batch, np.int32)    # past the batch: dropped (padding)
            src = np.zeros((n,), np.int32)
            dst[:len(moved)] = moved
            src[:len(moved)] = [order[i] for i in moved]
            self.state = move_slots(self.state, jnp.asarray(src), jnp.asarray(dst))
            new_slot = {old: new for new, old in enumerate(order)}
            self.slot_of = {k: new_slot[v] for k, v in self.slot_of.items()}
            return after
        return now

    def _append(self, row, tok: int) -> None:
        row.answer.append(tok)
        if self.watch[row.key].looped(row.answer):
            self.looped.add(row.key)

    def _finished(self, row) -> bool:
        a = row.answer
        return (len(a) >= self.max_new or (bool(a) and a[-1] in self.stop)
                or row.key in self.looped)

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
            prompt_width=bucket(max(p for _, p, _ in rows), ROW_BUCKETS), seed=self.seed,
            seconds=self._seconds,
            capped_rows=sum(len(r.answer) >= self.max_new for r in rows_in),
            extra_info=self.extra_info, segment=self.segment, decode_calls=self._calls_since,
            loop_stop=[self.loop_window, self.loop_repeats] if self.loop_window else None,
            loop_stopped_rows=sum(r.key in self.looped for r in rows_in))
        self.looped.difference_update(r.key for r in rows_in)
        topk = (answer_topk(self.target, rows, self.store_topk, bucket(longest, ROW_BUCKETS))
                if self.store_topk else None)
        e = self.store.append("answers", rows, info, topk=topk)
        for r in rows_in:
            self.busy.discard(r.key)
        dt, self._seconds, self._calls_since = self._seconds, 0.0, 0
        # rows completed by calls already timed in an earlier shard (``finish``) take no time
        rate = (f"in {dt:.0f}s ({e['answer_tokens'] / dt:.0f} tok/s)" if dt > 0
                else "(their calls timed in the shard before)")
        self.log(f"{e['file']}: {e['rows']} prompts (slot refill, {info['decode_calls']} calls "
                 f"of <= {self.segment} tokens), {e['answer_tokens']} answer tokens {rate}")
        return e

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


def generate_answers_slots(target, store: ShardStore, items: Iterable[tuple[list[int], str]], *,
                           batch: int, max_new: int, segment: int, seed: int, max_prompt: int,
                           deadline: float | None = None, max_batches: int | None = None,
                           temperature: float = 0.0, store_topk: int = 0,
                           loop_window: int = 0, loop_repeats: int = 3,
                           extra_info: dict | None = None,
                           log: Callable[[str], None] = print) -> dict:
    """``generate.generate_answers`` on a ``SlotAnswerer`` pool: every not-yet-answered prompt
    of ``items``, ``batch`` completed rows a shard. ``max_batches`` admits at most
    ``max_batches * batch`` prompts, so exactly that many shards are written when enough
    prompts remain. Returns the counts of this call, plus ``calls``, ``full_calls`` (calls
    that ran ``batch`` rows) and ``call_log``."""
    todo = pending_prompts(store, items)
    gen = SlotAnswerer(target, store, batch=batch, max_new=max_new, segment=segment, seed=seed,
                       max_prompt=max_prompt, temperature=temperature, store_topk=store_topk,
                       loop_window=loop_window, loop_repeats=loop_repeats,
                       extra_info=extra_info, log=log)
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
