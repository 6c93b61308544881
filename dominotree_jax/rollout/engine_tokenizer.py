"""The rollout engine's tokenizer: either a Hugging Face tokenizer or one with tunix's
``encode / decode / bos_id / eos_id / pad_id`` methods (tunix's ``TokenizerAdapter``), read one
way, and prompts (text or token ids, as tunix's learners hand them over) turned into token ids
as tunix's ``Sampler.tokenize`` does."""

from __future__ import annotations

import numpy as np


class RolloutTokenizer:
    """encode/decode and special ids of a Hugging Face tokenizer or of a tokenizer with tunix's
    ``encode / decode / bos_id / eos_id / pad_id`` methods."""

    def __init__(self, tok):
        self.tok = tok
        self.hf = hasattr(tok, "eos_token_id") and not callable(getattr(tok, "eos_id", None))

    def bos_id(self):
        return self.tok.bos_token_id if self.hf else self.tok.bos_id()

    def eos_id(self) -> int:
        return self.tok.eos_token_id if self.hf else self.tok.eos_id()

    def pad_id(self) -> int:
        """The pad id (a Hugging Face tokenizer without one: its EOS id)."""
        if self.hf:
            return self.tok.pad_token_id if self.tok.pad_token_id is not None else self.eos_id()
        return self.tok.pad_id()

    def encode_prompt(self, text: str) -> list[int]:
        """As tunix's ``Sampler.tokenize``: encode, prepend BOS if there is one, dedupe BOS."""
        ids = list(self.tok.encode(text))
        bos = self.bos_id()
        if bos:
            ids = [bos] + ids
            while len(ids) > 1 and ids[0] == ids[1] == bos:
                ids = ids[1:]
        return ids

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids])


def prompt_ids(prompt, tokenizer: RolloutTokenizer | None) -> list[int]:
    """The token ids of one prompt: a string (also a one-element string array, as tunix's
    learners may hand over) encoded with ``tokenizer``, or token ids used as they are."""
    if not isinstance(prompt, str) and np.asarray(prompt).dtype.kind in "USO":
        if np.asarray(prompt).size != 1:   # (tunix's learners may hand over [1] arrays)
            raise ValueError(f"a prompt must be one string or a list of token ids, got "
                             f"{prompt!r}")
        prompt = str(np.asarray(prompt).reshape(-1)[0])
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("text prompts need a tokenizer; pass token-id lists instead")
        ids = tokenizer.encode_prompt(prompt)
    else:
        ids = [int(t) for t in np.asarray(prompt).reshape(-1)]
    if not ids:
        raise ValueError("empty prompt")
    return ids
