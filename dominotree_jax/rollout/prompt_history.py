"""Earlier rollouts of each prompt, kept by the engine across calls for lookup drafting
(``DecodeConfig.lookup_history = H``).

In GRPO a prompt comes back every epoch, and its new samples repeat the old ones' phrases,
numbers and steps. ``PromptHistory`` keeps, per prompt (its token ids, as the target conditions
on them), the last ``H`` completions; each ``generate`` call hands ``decode`` every row's ``H``
texts as a ``[B, H, C]`` array (``C``: the call's ``max_tokens_to_generate``; -1 past each
text's end; the first ``C`` tokens of a longer one), and adds the call's completions after it.
Memory is bounded: at most ``max_prompts`` prompts (the least recently used leave first), ``H``
texts each. Drafts from earlier texts are fixed before any sampling of the call, so every sample
is still exactly the target's.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

MAX_PROMPTS = 4096   # prompts remembered, at most (least recently used leave first)


class PromptHistory:
    """The last ``per_prompt`` completions of up to ``max_prompts`` prompts (module docstring)."""

    def __init__(self, per_prompt: int, max_prompts: int = MAX_PROMPTS):
        if per_prompt < 1 or max_prompts < 1:
            raise ValueError(f"PromptHistory needs per_prompt >= 1 and max_prompts >= 1, got "
                             f"{per_prompt}, {max_prompts}")
        self.per_prompt, self.max_prompts = int(per_prompt), int(max_prompts)
        self.texts: OrderedDict[bytes, list[np.ndarray]] = OrderedDict()

    @staticmethod
    def key(prompt_ids) -> bytes:
        return np.asarray(prompt_ids, np.int32).tobytes()

    def array(self, prompt_BT: np.ndarray, lengths_B: np.ndarray, width: int) -> np.ndarray:
        """``[B, H, width]`` int32: each row's earlier texts of its prompt, newest first, -1
        past each one's end (and in slots with no text yet)."""
        B = prompt_BT.shape[0]
        out = np.full((B, self.per_prompt, width), -1, np.int32)
        for b in range(B):
            for h, text in enumerate(self.texts.get(self.key(prompt_BT[b, :lengths_B[b]]), ())):
                out[b, h, :min(len(text), width)] = text[:width]
        return out

    def add(self, prompt_BT: np.ndarray, lengths_B: np.ndarray, tokens_BY: np.ndarray,
            num_B: np.ndarray) -> None:
        """Keep each row's completion (its first ``num_B[b]`` tokens) as the newest text of its
        prompt."""
        for b in range(prompt_BT.shape[0]):
            k = self.key(prompt_BT[b, :lengths_B[b]])
            texts = self.texts.pop(k, [])
            if num_B[b] > 0:
                texts = [np.asarray(tokens_BY[b, :num_B[b]], np.int32)] + texts
            self.texts[k] = texts[:self.per_prompt]
            while len(self.texts) > self.max_prompts:
                self.texts.popitem(last=False)

    def checkpoint_state(self) -> dict:
        return {"per_prompt": self.per_prompt, "max_prompts": self.max_prompts,
                "prompts": [np.frombuffer(k, np.int32) for k in self.texts],
                "texts": [list(v) for v in self.texts.values()]}

    @classmethod
    def from_checkpoint(cls, state: dict) -> "PromptHistory":
        out = cls(int(state["per_prompt"]), int(state["max_prompts"]))
        for prompt, texts in zip(state["prompts"], state["texts"], strict=True):
            out.texts[cls.key(prompt)] = [np.asarray(t, np.int32) for t in texts]
        return out
