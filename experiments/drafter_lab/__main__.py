"""``python -m experiments.drafter_lab COMMAND [ARGS]``: the drafter lab's tools (its
``__init__``)."""

import sys

from dominotree_jax.train.cli import dispatch
from experiments.drafter_lab import COMMANDS

if __name__ == "__main__":
    sys.exit(dispatch("python -m experiments.drafter_lab", COMMANDS))
