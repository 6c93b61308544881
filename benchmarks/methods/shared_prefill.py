"""One prefill shared by a prompt's G samples vs every row prefilling its own copy, through the
tunix rollout engine on the real SmolLM2-135M pair (released drafter), side by side in one
process: ``DominoTreeRollout(share_prefill=True / False)``, the same prompts, seeds and
settings; the samples are checked equal.

    python -m benchmarks methods shared_prefill --prompts 4 --group 4 --new 32 --repeat 3

Prints one line per setting (median wall seconds of ``generate`` over ``--repeat`` calls after
a compiling one) and the ratio. Pause other CPU work while it runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

from dominotree_jax.measure.timing import cpu_model

QUESTIONS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips "
    "in May. How many clips did Natalia sell altogether in April and May?",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
    "How much did she earn?",
    "Betty is saving money for a new wallet which costs $100. Betty has only half of the money "
    "she needs. Her parents decided to give her $15 for that purpose, and her grandparents "
    "twice as much as her parents. How much more money does Betty need to buy the wallet?",
    "James writes a 3-page letter to 2 different friends twice a week. How many pages does he "
    "write a year?",
    "Albert is wondering how much pizza he can eat in one day. He buys 2 large pizzas and 2 "
    "small pizzas. A large pizza has 16 slices and a small pizza has 8 slices. If he eats it "
    "all, how many pieces does he eat that day?",
    "Ken created a care package to send to his brother, who was away at boarding school. How "
    "many pounds of jelly beans, brownies and gummy worms did the box weigh in the end?",
]
SYSTEM = ("You are a careful math tutor. Think step by step, show the arithmetic on its own "
          "line, and end with 'Answer: <number>'. Keep the explanation short and precise.")




def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--budget", default="8")
    args = ap.parse_args(argv)

    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_drafter_path, smollm2_gguf_path
    from dominotree_jax.rollout import DominoTreeRollout, TunixCausalLM
    from dominotree_jax.rollout.tunix_types import RolloutConfig

    pair = dj.load_pair(smollm2_gguf_path(), smollm2_drafter_path())
    tok = pair.target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    texts = [tok.apply_chat_template([{"role": "system", "content": SYSTEM},
                                      {"role": "user", "content": q}],
                                     add_generation_prompt=True, tokenize=False)
             for q in QUESTIONS[:args.prompts]]
    prompts = [t for t in texts for _ in range(args.group)]   # GRPO: G copies of each
    lengths = [len(tok.encode(t)) for t in texts]
    budget = args.budget if args.budget == "auto" else int(args.budget)
    rc = RolloutConfig(max_tokens_to_generate=args.new, max_prompt_length=256,
                       temperature=0.9, top_p=1.0, seed=0, return_logprobs=True)
    engines = {share: DominoTreeRollout(
        rollout_actor=TunixCausalLM.from_params(pair.target.config, pair.target.params, pad),
        tokenizer=tok, drafter_config=pair.drafter_config, drafter_params=pair.drafter_params,
        budget=budget, node_topk=4, share_prefill=share) for share in (True, False)}
    outs = {s: e.generate(prompts, rc) for s, e in engines.items()}   # compile both
    for a, b in zip(outs[True].tokens, outs[False].tokens):
        np.testing.assert_array_equal(a, b)
    times = {True: [], False: []}
    for _ in range(args.repeat):   # interleaved, so drift hits both alike
        for share, e in engines.items():
            t0 = time.perf_counter()
            e.generate(prompts, rc)
            times[share].append(time.perf_counter() - t0)
    med = {s: statistics.median(t) for s, t in times.items()}
    print(f"SmolLM2-135M + drafter, {args.prompts} prompts ({min(lengths)}-{max(lengths)} "
          f"tokens) x G={args.group}, {args.new} new tokens, T=0.9, budget={budget}, "
          f"jax {jax.__version__}, {cpu_model()}")
    for share in (False, True):
        print(f"share_prefill={share!s:5}  median {med[share]:.3f} s  "
              f"({', '.join(f'{t:.3f}' for t in times[share])})")
    print(f"shared / unshared = {med[True] / med[False]:.3f}; tokens identical")
