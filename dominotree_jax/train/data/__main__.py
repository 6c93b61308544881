"""``python -m dominotree_jax.train.data [COMMAND] [ARGS]``: grow a drafter data directory
(``train/cli.py``'s ``DATA_COMMANDS``; without a command: ``collect``).

    python -m dominotree_jax.train.data --data data/smollm2 --seed 1 --minutes 60
    python -m dominotree_jax.train.data backfill-topk --data data/smollm2 --out DIR --shards N
"""

import sys

from dominotree_jax.train.cli import DATA_COMMANDS, dispatch

if __name__ == "__main__":
    sys.exit(dispatch("python -m dominotree_jax.train.data", DATA_COMMANDS, default="collect"))
