"""Checkpoint converters: HF safetensors, GGUF and DFlash/Domino drafters → parameter pytrees.

Only this package reads checkpoint files. Every loader checks the whole checkpoint against the
model it fills and raises ``CheckpointError`` listing every missing tensor, every unexpected
tensor and every shape mismatch; nothing is ever half-loaded.
"""

from convert.errors import CheckpointError  # noqa: F401
