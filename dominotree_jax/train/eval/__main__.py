"""``python -m dominotree_jax.train.eval COMMAND [ARGS]``: measure drafters and data
(``train/cli.py``'s ``EVAL_COMMANDS``: acceptance, tree, ablate, agreement, report).

    python -m dominotree_jax.train.eval acceptance --drafter shipped --n 10 --json OUT.json
    python -m dominotree_jax.train.eval report --heldout PNG RUN_DIR [RUN_DIR ...]
"""

import sys

from dominotree_jax.train.cli import EVAL_COMMANDS, dispatch

if __name__ == "__main__":
    sys.exit(dispatch("python -m dominotree_jax.train.eval", EVAL_COMMANDS))
