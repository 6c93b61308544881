"""``python -m dominotree_jax.train.data [COMMAND] [ARGS]``: grow a drafter data directory
(``train/cli.py``'s ``DATA_COMMANDS``; without a command: ``collect``).

    python -m dominotree_jax.train.data --target CKPT --data DIR --prompts P.jsonl --minutes 60

(The SmolLM2 drafter's data, ``data/smollm2``, grows with its recipes:
``python -m experiments.smollm2_campaign.collect``.)
"""

import sys

from dominotree_jax.train.cli import DATA_COMMANDS, dispatch

if __name__ == "__main__":
    sys.exit(dispatch("python -m dominotree_jax.train.data", DATA_COMMANDS, default="collect"))
