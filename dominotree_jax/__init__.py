"""dominotree-jax: lossless speculative decoding (DFlash, Domino, DDTree, DominoTree) in JAX."""

from dominotree_jax.api import (Pair, Target, generate, load_pair, load_target,  # noqa: F401
                                target_logits)
from dominotree_jax.decoding.decode import DecodeOutput, decode  # noqa: F401
from dominotree_jax.decoding.config import DecodeConfig  # noqa: F401
from dominotree_jax.precision import Precision  # noqa: F401
