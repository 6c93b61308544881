"""What ``DominoTreeRollout(trainer_logprobs=True)`` costs (issue 66 §4): ``generate`` on a
GRPO-shaped batch of the shipped SmolLM2 pair with the decode's own log-probs against the
trainer's bits (one more teacher-forced forward through tunix's ``compute_per_token_logps``),
the two engines' calls interleaved on the same prompts and keys. Writes
``benchmarks/results/rl/trainer_logprobs_cost.json``.

    python -m experiments.grpo.trainer_logprobs_cost --prompts 4 --group 4 --new 48 --calls 6
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

OUT = os.path.join("benchmarks", "results", "rl", "trainer_logprobs_cost.json")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args(argv)

    import dominotree_jax as dj
    from dominotree_jax.assets import smollm2_drafter_path, smollm2_gguf_path
    from dominotree_jax.measure.timing import bf16_units, cpu_model
    from dominotree_jax.rollout import DominoTreeRollout, RolloutConfig, TunixCausalLM
    import random

    from experiments.grpo.grpo_smollm2 import word_problem

    p = dj.load_pair(smollm2_gguf_path(), smollm2_drafter_path())
    tok = p.target.tokenizer
    pad = tok.convert_tokens_to_ids("<|im_end|>")
    model = TunixCausalLM.from_params(p.target.config, p.target.params, pad)
    engines = {}
    for name, exact in (("decode log-probs", False), ("trainer_logprobs", True)):
        engines[name] = DominoTreeRollout(
            rollout_actor=model, tokenizer=tok, drafter_config=p.drafter_config,
            drafter_params=p.drafter_params, budget="auto", trainer_logprobs=exact)
    seconds = {name: [] for name in engines}
    for call in range(args.calls + 1):   # call 0 compiles
        texts = [tok.apply_chat_template([{"role": "user", "content": q}],
                                         add_generation_prompt=True, tokenize=False)
                 for q in [word_problem(random.Random(100 * call + i))[0]
                           for i in range(args.prompts)] for _ in range(args.group)]
        rc = RolloutConfig(max_tokens_to_generate=args.new, max_prompt_length=128,
                           temperature=0.9, seed=call, return_logprobs=True)
        order = list(engines) if call % 2 == 0 else list(reversed(engines))
        for name in order:
            t0 = time.perf_counter()
            engines[name].generate(texts, rc)
            if call:
                seconds[name].append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) for k, v in seconds.items()}
    out = {"command": "python -m experiments.grpo.trainer_logprobs_cost "
                      f"--prompts {args.prompts} --group {args.group} --new {args.new} "
                      f"--calls {args.calls}",
           "machine": f"{cpu_model()} ({bf16_units()}), 2 cores, {platform.node()}",
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "batch": args.prompts * args.group, "median_call_seconds": med,
           "cost": round(med["trainer_logprobs"] / med["decode log-probs"], 3)}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
