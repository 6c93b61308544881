"""Grow a drafter data directory with any target: prompts in, the target's answers out, run
after run.

    python -m dominotree_jax.train.data --target CKPT --data DIR --prompts P.jsonl --minutes 60

The prompt pool of a run comes from the caller (``collect(prompts=...)``: a function of the pool
seed; on the command line ``--prompts``, a JSON-lines file of ``{"text": ..., "source": ...}``);
without one, the run answers only the prompts the target writes itself (``self_prompts``). The
pool drops prompts that overlap a benchmark (``overlap.BenchmarkFilter``) or are already
answered (several seeds, ``--seed 11 12``: their pools one after another; the first seed keys
sampling and self-written requests). A run alternates: every ``--request-every`` answer
batches, one batch of prompts written by the target itself; each answer batch takes up to
``--request-share`` of its rows from the stored requests that have no answer yet. Every batch is
one shard, appended to ``manifest.json`` as soon as it is done; stop it any time (a killed run
loses only the batch in flight) and run it again to continue.

Options, all off by default: ``--followup-share`` (multi-turn prompts: one of ``follow_ups``
asked after one of the target's own earlier answers to this pool's prompts),
``--sample-share`` (that share of the answer batches sampled at ``--sample-temperature``
instead of greedy) and ``--store-topk K`` (the target's top-K logits of every answer token, for
soft targets). The manifest records each shard's temperature, top-k and pool name.
``--refill K`` (``slots.py``): refilling generation on a persistent KV cache, each call runs K
steps for a full batch of in-flight rows, so no call idles on finished rows and a continuing
row is not prefilled again; ``--max-batches`` then counts full shards, and on stopping the rows
in flight are finished into one more shard per temperature.

The SmolLM2 drafter's prompt recipes and their command line are in
``experiments/smollm2_campaign/`` (``collect``, ``prompts``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import time
from collections.abc import Callable, Iterable, Sequence


MAX_PROMPT_TOKENS = 256   # chat-templated; longer corpus prompts are skipped
MAX_FOLLOWUP_TOKENS = 768  # a follow-up turn carries the first question and its answer
# A prompt pool: the pool seed -> prompts ``{"text": str, "source": str, ...}``.
PromptPool = Callable[[int], Iterable[dict]]


def collect_parser(prog: str, description: str | None = None,
                   data: str | None = None) -> argparse.ArgumentParser:
    """The options every collection command shares (``run_collect`` reads them); ``data``: the
    default data directory (None: ``--data`` is required)."""
    from dominotree_jax.precision import add_precision_argument
    p = argparse.ArgumentParser(prog=prog, description=description or __doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=data, required=data is None,
                   help="data directory (manifest + shards)")
    p.add_argument("--target", default=None, help="target checkpoint (default: SmolLM2 GGUF)")
    p.add_argument("--seed", type=int, nargs="+", default=[1],
                   help="prompt pool seed(s), answered in this order; the first also seeds "
                        "sampling and self-written requests")
    p.add_argument("--batch", type=int, default=48)
    add_precision_argument(p, pairs=False, help="the target's precision for generation (each "
                                                "shard's manifest entry records it)")
    p.add_argument("--max-new", type=int, default=160, help="answer length cap")
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
    return p


def parse_args(argv=None):
    p = collect_parser("python -m dominotree_jax.train.data [collect]")
    p.add_argument("--prompts", default=None, metavar="FILE",
                   help='JSON lines {"text": ..., "source": ...} (source default: file:NAME); '
                        "without it only the target's own requests are answered")
    p.add_argument("--follow-ups", default=None, metavar="FILE",
                   help="follow-up questions for --followup-share, one a line")
    return p.parse_args(argv)


def prompts_from_file(path: str) -> list[dict]:
    """The prompts of a JSON-lines file: each line ``{"text": str}``, with an optional
    ``"source"`` (default ``file:<name>``)."""
    default = f"file:{os.path.splitext(os.path.basename(path))[0]}"
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                text = row["text"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ValueError(f'{path}:{n}: expected a JSON object with a "text" field, got '
                                 f"{line.strip()[:80]!r}") from None
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"{path}:{n}: the prompt text must be a non-empty string")
            out.append({"text": text, "source": str(row.get("source", default))})
    return out


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


def pool_items(tokenizer, prompts: Iterable[dict], bench, known: set[str]):
    """Chat-templated ids of ``prompts`` (a pool's) that pass the filters."""
    from dominotree_jax.train.data.self_prompts import normalize
    out, dropped = [], {"benchmark_overlap": 0, "too_long": 0}
    for p in prompts:
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


def followup_items(tokenizer, store, texts: list[str], bench, seed: int, eos_ids,
                   follow_ups: Sequence[str]) -> list:
    """Multi-turn prompts ``(ids, source)``: for each of ``texts`` (this seed's prompts) that
    already has an answer in ``store``, the conversation [that prompt, the target's answer, one
    of ``follow_ups``], chat-templated with the generation prompt. Conversations that overlap a
    benchmark or exceed ``MAX_FOLLOWUP_TOKENS`` are skipped."""
    from dominotree_jax.train.data.generate import prompt_key
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
        follow = rng.choice(follow_ups)
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


def collect(target, data: str, *, seed: int | Sequence[int], batch: int, max_new: int,
            deadline: float | None, max_batches: int | None, request_every: int,
            request_share: float, request_temperature: float = 1.0,
            prompts: PromptPool | None = None, pool_name: str = "none",
            follow_ups: Sequence[str] = (), followup_share: float = 0.0,
            sample_share: float = 0.0, sample_temperature: float = 0.7, store_topk: int = 0,
            refill: int = 0, loop_stop: int = 0, tokenizer_name: str | None = None) -> dict:
    """Answer ``prompts(s)`` for each pool seed ``s`` (and the target's own requests) into the
    data directory ``data``; ``pool_name`` is recorded in each shard's manifest entry
    (``prompt_mix``), ``tokenizer_name`` in a new directory's manifest."""
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
    if followup_share and not follow_ups:
        raise ValueError("followup_share needs follow_ups (the follow-up questions to ask)")
    if tokenizer_name is None:
        tok = target.tokenizer
        tokenizer_name = f"{getattr(tok, 'name_or_path', '') or type(tok).__name__} chat template"
    store = ShardStore(data, vocab_size=target.config.vocab_size, tokenizer=tokenizer_name)
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
            items, drop, seed_texts = pool_items(target.tokenizer, prompts(s) if prompts else (),
                                                 bench, known)
            items = [it for it in items if prompt_key(it[0]) not in queued]
            queued.update(prompt_key(it[0]) for it in items)
            random.Random(s).shuffle(items)
            pool += items
            texts += seed_texts
            dropped.update(drop)
        follow = (followup_items(target.tokenizer, store, texts, bench, seed, target.eos_ids,
                                 follow_ups) if followup_share else [])
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
                                pool_name=pool_name, loop_stop=loop_stop,
                                followups=followup_share > 0)
            else:
                s = generate_answers(target, store, items, batch=batch, max_new=max_new,
                                     seed=seed, deadline=deadline, max_batches=1, log=log,
                                     temperature=temp, store_topk=store_topk,
                                     extra_info={"prompt_mix": pool_name})
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
                deadline: float | None, pool_name: str, loop_stop: int = 0,
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
            store_topk=store_topk, extra_info={"prompt_mix": pool_name}, log=log)
    others = set().union(*(g.busy for t, g in answerers.items() if t != temperature))
    e = answerers[temperature].fill_shard(items, deadline=deadline, exclude=others)
    if e is None:
        return {"batches": 0, "rows": 0, "answer_tokens": 0}
    return {"batches": 1, "rows": e["rows"], "answer_tokens": e["answer_tokens"]}


def run_collect(args, *, prompts: PromptPool | None = None, pool_name: str = "none",
                follow_ups: Sequence[str] = (), tokenizer_name: str | None = None) -> dict:
    """``collect`` with the options of ``collect_parser`` (the target: ``args.target``, or the
    SmolLM2 GGUF)."""
    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_gguf_path
    target = dj.load_target(args.target or smollm2_gguf_path(), precision=args.precision)
    return collect(target, args.data, seed=args.seed, batch=args.batch, max_new=args.max_new,
                   deadline=deadline_from(args.minutes, args.until),
                   max_batches=args.max_batches, request_every=args.request_every,
                   request_share=args.request_share,
                   request_temperature=args.request_temperature, prompts=prompts,
                   pool_name=pool_name, follow_ups=follow_ups,
                   followup_share=args.followup_share, sample_share=args.sample_share,
                   sample_temperature=args.sample_temperature, store_topk=args.store_topk,
                   refill=args.refill, loop_stop=args.loop_stop, tokenizer_name=tokenizer_name)


def main(argv=None):
    args = parse_args(argv)
    pool = prompts_from_file(args.prompts) if args.prompts else None
    follow_ups: list[str] = []
    if args.follow_ups:
        with open(args.follow_ups, encoding="utf-8") as f:
            follow_ups = [line.strip() for line in f if line.strip()]
    name = os.path.splitext(os.path.basename(args.prompts))[0] if args.prompts else "none"
    run_collect(args, prompts=(lambda seed: pool) if pool else None, pool_name=name,
                follow_ups=follow_ups)
    return 0
