"""``python -m dominotree_jax.train``: train a Domino drafter from the repository's data
(``train/run.py`` holds the run; ``--help`` prints its usage)."""

import sys

from dominotree_jax.train.run import main

if __name__ == "__main__":
    sys.exit(main())
