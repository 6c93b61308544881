"""``python -m dominotree_jax.train.eval COMMAND [ARGS]``: measure drafters and data
(``train/cli.py``'s ``EVAL_COMMANDS``: acceptance; the lab's tools: ``experiments.drafter_lab``).

    python -m dominotree_jax.train.eval acceptance --drafter shipped --n 10 --json OUT.json
"""

import sys

from dominotree_jax.train.cli import EVAL_COMMANDS, dispatch

if __name__ == "__main__":
    sys.exit(dispatch("python -m dominotree_jax.train.eval", EVAL_COMMANDS))
