"""dominotree-jax: lossless speculative decoding (DFlash, Domino, DDTree, DominoTree) in JAX."""

from dominotree_jax.api import (Target, generate, load_target, target_logits)  # noqa: F401
from dominotree_jax.spec.decode import DecodeOutput, decode  # noqa: F401
from dominotree_jax.spec.decode_config import DecodeConfig  # noqa: F401
