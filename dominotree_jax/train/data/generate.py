"""Answer generation: the target's own answers to prompts, with the jitted batched ``decode``.

Answers come from ``dominotree_jax.decode`` with ``method="ar"`` (the same program users run;
greedy by default), one batch of right-padded prompts at a time. Prompts are grouped in a
few width buckets so only a few programs compile. Each finished batch is one ``answers`` shard
(``shards.ShardStore``); a killed run loses at most the batch in flight, and the next run skips
every prompt that already has an answer (``answered_keys``), so runs append to the same data.
"""

from __future__ import annotations

import functools
import time
from typing import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.decoding.config import DecodeConfig
from dominotree_jax.decoding.decode import decode
from dominotree_jax.precision import params_precision
from dominotree_jax.train.data.shards import ShardStore

PROMPT_BUCKETS = (64, 128, 192, 256, 384, 512, 768, 1024)

@functools.partial(jax.jit, static_argnames=("cfg", "k"))
def _topk_logits(tparams, tokens_BT, *, cfg, k: int):
    """The target's ``k`` largest next-token logits at every position of a causal forward:
    ``(ids [B, T, k] int32, logits [B, T, k] float32)``, descending."""
    from dominotree_jax.api import _plain_forward   # the one causal full-logits forward
    vals, ids = jax.lax.top_k(_plain_forward(tparams, tokens_BT, cfg), k)
    return ids, vals


def answer_topk(target, rows: list[tuple[list[int], int, str]], k: int, width: int):
    """Top-``k`` target logits predicting every answer token of ``rows`` (``(ids, prompt
    length, source)``, each at most ``width`` tokens): ``(ids [answer tokens, k] int32, logits
    [answer tokens, k] float32)``, rows concatenated, positions ``prompt_length - 1 … len - 2``
    of each row (the layout ``ShardStore.append`` stores)."""
    toks = np.zeros((len(rows), width), np.int32)
    for r, (ids, _, _) in enumerate(rows):
        toks[r, :len(ids)] = ids
    ids_BTk, vals_BTk = jax.device_get(_topk_logits(target.params, jnp.asarray(toks),
                                                    cfg=target.config, k=k))
    sel = [(r, slice(p - 1, len(ids) - 1)) for r, (ids, p, _) in enumerate(rows)]
    return (np.concatenate([np.asarray(ids_BTk)[r, s] for r, s in sel], 0),
            np.concatenate([np.asarray(vals_BTk)[r, s] for r, s in sel], 0))


def bucket(n: int, buckets: tuple[int, ...] = PROMPT_BUCKETS) -> int:
    """The smallest bucket width that holds ``n`` tokens (error when none does)."""
    for b in buckets:
        if n <= b:
            return b
    raise ValueError(f"prompt of {n} tokens is longer than the largest bucket {buckets[-1]}")


def prompt_key(ids) -> bytes:
    """Identity of a prompt for de-duplication across runs: its token ids."""
    return np.asarray(ids, np.uint16).tobytes()


def answered_keys(store: ShardStore) -> set[bytes]:
    return {prompt_key(t[:p]) for t, p, _ in store.rows("answers")}


def run_decode(target, prompts: list[list[int]], *, width: int, batch: int, max_new: int,
               temperature: float = 0.0, key=None, stop_ids: tuple[int, ...] | None = None):
    """Decode ``prompts`` (at most ``batch``; padded to ``[batch, width]``, so one program per
    ``(batch, width)``); returns ``(tokens [n, max_new] int32, num_tokens [n])`` as NumPy."""
    if not prompts or len(prompts) > batch:
        raise ValueError(f"need 1..{batch} prompts, got {len(prompts)}")
    prompt = np.zeros((batch, width), np.int32)
    lengths = np.ones((batch,), np.int32)
    for r, ids in enumerate(prompts):
        if not 0 < len(ids) <= width:
            raise ValueError(f"prompt {r} has {len(ids)} tokens; width is {width}")
        prompt[r, :len(ids)] = ids
        lengths[r] = len(ids)
    stop = tuple(target.eos_ids if stop_ids is None else stop_ids)
    cfg = DecodeConfig(target=target.config, method="ar", max_new_tokens=max_new,
                       temperature=temperature, stop_ids=stop)
    out = decode({"target": target.params, "drafter": None}, jnp.asarray(prompt),
                  config=cfg, key=key, prompt_lengths=jnp.asarray(lengths))
    toks, num = jax.device_get((out.tokens, out.num_tokens))
    return np.asarray(toks)[:len(prompts)], np.asarray(num)[:len(prompts)]


def plan_batches(items: list[tuple[list[int], str]], batch: int) -> list[tuple[int, list[int]]]:
    """Split ``items`` (prompt ids, source) into ``(width, item indices)`` batches of one
    bucket each, in the order of each bucket's first item (the input order is kept within a
    bucket, so a shuffled input gives mixed batches of every kind)."""
    by_width: dict[int, list[int]] = {}
    order: list[int] = []
    for i, (ids, _) in enumerate(items):
        w = bucket(len(ids))
        if w not in by_width:
            by_width[w] = []
            order.append(w)
        by_width[w].append(i)
    plan = [(w, by_width[w][k:k + batch]) for w in order
            for k in range(0, len(by_width[w]), batch)]
    # Interleave buckets: sort by each batch's first item so long prompts are not left last.
    return sorted(plan, key=lambda b: b[1][0])


def answer_shard_info(target, *, generator: str, temperature: float, max_new: int, batch: int,
                      prompt_width: int, seed: int, seconds: float, capped_rows: int,
                      extra_info: dict | None = None, **details) -> dict:
    """The manifest entry's description of one answer shard: how it was generated (shared by
    the plain and the slot-refill path; ``details`` are a path's own fields)."""
    return {"generator": generator, "temperature": temperature, "max_new_tokens": max_new,
            "batch": batch, "prompt_width": prompt_width, "seed": seed,
            "gen_seconds": round(seconds, 2), "capped_rows": capped_rows, **details,
            "dtype": params_precision(target.params, "target parameters"), **(extra_info or {})}


def pending_prompts(store, items) -> list[tuple[list[int], str]]:
    """``(ids, source)`` of every prompt in ``items`` the store has no answer to yet, each
    once, in order."""
    done = answered_keys(store)
    todo, seen = [], set()
    for ids, src in items:
        k = prompt_key(ids)
        if k not in done and k not in seen:
            seen.add(k)
            todo.append((list(ids), src))
    return todo


def generate_answers(target, store: ShardStore, items: Iterable[tuple[list[int], str]], *,
                     batch: int, max_new: int, seed: int, deadline: float | None = None,
                     max_batches: int | None = None, temperature: float = 0.0,
                     store_topk: int = 0, extra_info: dict | None = None,
                     log: Callable[[str], None] = print) -> dict:
    """Answer every not-yet-answered prompt of ``items`` (``(chat-templated ids, source)``),
    appending one ``answers`` shard per batch; stops starting batches after ``deadline``
    (epoch seconds) or ``max_batches``. ``temperature > 0`` samples (key from the seed and the
    shard number). ``store_topk = K > 0`` also stores the target's top-K logits of every answer
    position (``answer_topk``; one extra teacher-forced forward per batch). The refilling
    engine is ``slots.generate_answers_slots`` (same rows). Returns counts of this call."""
    if store_topk < 0:
        raise ValueError(f"store_topk must be >= 0, got {store_topk}")
    todo = pending_prompts(store, items)
    stats = {"batches": 0, "rows": 0, "answer_tokens": 0, "seconds": 0.0, "pending": len(todo)}
    for width, idx in plan_batches(todo, batch):
        if max_batches is not None and stats["batches"] >= max_batches:
            break
        if deadline is not None and time.time() > deadline:
            log("deadline reached: no new batch started")
            break
        t0 = time.time()
        shard_no = len(store.entries("answers"))
        key = jax.random.key(seed * 1_000_003 + shard_no) if temperature > 0 else None
        toks, num = run_decode(target, [todo[i][0] for i in idx], width=width, batch=batch,
                               max_new=max_new, temperature=temperature, key=key)
        dt = time.time() - t0
        rows = [(todo[i][0] + toks[r, :num[r]].tolist(), len(todo[i][0]), todo[i][1])
                for r, i in enumerate(idx)]
        info = answer_shard_info(target, generator="dominotree_jax.decode(method='ar')",
                                 temperature=temperature, max_new=max_new, batch=batch,
                                 prompt_width=width, seed=seed, seconds=dt,
                                 capped_rows=int(np.sum(num >= max_new)), extra_info=extra_info)
        topk = answer_topk(target, rows, store_topk, width + max_new) if store_topk else None
        e = store.append("answers", rows, info, topk=topk)
        stats["batches"] += 1
        stats["rows"] += e["rows"]
        stats["answer_tokens"] += e["answer_tokens"]
        stats["seconds"] += dt
        log(f"{e['file']}: {e['rows']} prompts (width {width}), {e['answer_tokens']} answer "
            f"tokens in {dt:.0f}s ({e['answer_tokens'] / dt:.0f} tok/s)")
    return stats
