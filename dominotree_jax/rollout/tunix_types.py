"""tunix's rollout interface: the real classes when ``google-tunix`` is importable, otherwise
local stand-ins with the same names, fields and abstract methods
(``tunix.rl.rollout.base_rollout`` in google-tunix 0.1.7), so the engine works either way."""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

try:
    from tunix.rl.rollout.base_rollout import BaseRollout, RolloutConfig, RolloutOutput
    HAVE_TUNIX = True
except ImportError:  # tunix not installed: `pip install dominotree-jax[tunix]` (see README)
    HAVE_TUNIX = False

    @dataclasses.dataclass
    class RolloutOutput:  # type: ignore[no-redef]
        text: list[str]
        logits: list[Any]
        tokens: list[Any]
        left_padded_prompt_tokens: Any
        logprobs: list[Any] | None

    @dataclasses.dataclass
    class RolloutConfig:  # type: ignore[no-redef]
        """The fields of tunix's ``RolloutConfig`` a DominoTree rollout reads (same defaults)."""
        max_tokens_to_generate: int = 64
        temperature: float = 0.9
        top_p: float | None = 1.0
        top_k: int | None = None
        seed: Any = None
        max_prompt_length: int = 64
        kv_cache_size: int = 1024
        data_type: Any = None
        eos_tokens: list[int] | None = None
        return_logprobs: bool = False

    class BaseRollout(abc.ABC):  # type: ignore[no-redef]
        @abc.abstractmethod
        def __init__(self, **kwargs):
            """Initializes the rollout worker."""

        @abc.abstractmethod
        def generate(self, prompts, rollout_config, **kwargs):
            """Generates samples from the model."""

        @abc.abstractmethod
        def get_per_token_logps(self, prompt_tokens, completion_tokens):
            """Per-token log-probabilities of the completions."""

        @abc.abstractmethod
        def update_params(self, params, filter_types=None):
            """Updates the rollout model parameters."""

        @abc.abstractmethod
        def pad_id(self) -> int:
            """The pad id."""

        @abc.abstractmethod
        def eos_id(self) -> int:
            """The end-of-sequence id."""

        @abc.abstractmethod
        def model(self):
            """The rollout model."""
