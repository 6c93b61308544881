"""tunix prompts into the rollout engine's padded token batches, and decoded rows back into
tunix's ``RolloutOutput``.

- ``prompt_pads_for``: how a pad id inside a prompt is read (``"keep"`` / ``"drop"``), checked
  against the actor's own reading.
- ``prompt_batch`` / ``pad_prompts``: a ``PromptBatch``: what the target conditions on,
  right-padded to ``max_prompt_length`` columns (or the next power of two above the longest
  prompt, as tunix's sampler widens), and the prompts as given, left-padded (tunix's output
  field).
- ``stop_ids`` / ``row_stop_array``: the stop ids every row shares (EOS, pad) and the per-row
  ones as a ``[B, e]`` array.
- ``shared_prefill_rows``: the distinct prompts of a batch and each row's one.
- ``rollout_output``: decoded rows cut at their first stop id, as tunix's ``RolloutOutput``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dominotree_jax.rollout.engine_tokenizer import RolloutTokenizer, prompt_ids
from dominotree_jax.rollout.masked_forward import PROMPT_PADS
from dominotree_jax.rollout.placement import BatchPlacement
from dominotree_jax.rollout.tunix_model import TunixCausalLM
from dominotree_jax.rollout.tunix_types import RolloutConfig, RolloutOutput


def next_pow2(n: int) -> int:
    """The smallest power of two ``>= n`` (1 for ``n <= 1``)."""
    return 1 << max(0, int(n) - 1).bit_length()


def prompt_pads_for(actor, prompt_pads: str | None, tokenizer) -> str:
    """The ``prompt_pads`` reading (``DominoTreeRollout.__init__``), checked against the actor's
    own: a ``TunixCausalLM`` with a ``pad_id`` reads inner pads as tokens (``"keep"``).
    ``None``: ``"drop"`` for a ``TunixCausalLM`` without ``pad_id`` (tunix's trainer's
    reading), else ``"keep"``."""
    model_pad = actor.pad_id if isinstance(actor, TunixCausalLM) else None
    if prompt_pads is None:   # tunix's trainer reading only for a tunix model without pad_id
        prompt_pads = "drop" if isinstance(actor, TunixCausalLM) and model_pad is None \
            else "keep"
    if prompt_pads not in PROMPT_PADS:
        raise ValueError(f"prompt_pads must be one of {PROMPT_PADS}, got {prompt_pads!r}")
    if isinstance(actor, TunixCausalLM) and (model_pad is None) != (prompt_pads == "drop"):
        raise ValueError(f"prompt_pads={prompt_pads!r} disagrees with the actor TunixCausalLM "
                         f"(pad_id={model_pad}): the trainer would score another context; "
                         "build it with pad_id=<the pad id> for 'keep', without for 'drop'")
    if model_pad is not None and tokenizer is not None and \
            int(RolloutTokenizer(tokenizer).pad_id()) != model_pad:
        raise ValueError(f"the actor TunixCausalLM's pad_id {model_pad} is not the tokenizer's "
                         f"pad id {RolloutTokenizer(tokenizer).pad_id()}")
    return prompt_pads


@dataclasses.dataclass(frozen=True)
class PromptBatch:
    """One ``generate`` call's prompts as host arrays (this process's rows)."""
    prompt_BT: np.ndarray   # int32: what the target conditions on, right-padded with the pad id
    lengths_B: np.ndarray   # int32: the lengths of those prompts
    left_BT: np.ndarray     # int32: the prompts as given, left-padded (RolloutOutput's field)

    @property
    def size(self) -> int:
        return int(self.prompt_BT.shape[0])


def pad_prompts(ids: list[list[int]], max_prompt_length: int, pad: int, drop_pads: bool,
                place: BatchPlacement) -> PromptBatch:
    """``ids`` (token ids, one list per prompt) as a ``PromptBatch`` of ``max_prompt_length``
    columns, or the next power of two above the longest prompt of any process (tunix's sampler
    widens, never truncates, its prompt window). ``drop_pads``: the target conditions on each
    prompt without its pad ids (``prompt_pads="drop"``; a prompt of pads only keeps its last).
    Every process must hand over as many prompts."""
    width = max(int(max_prompt_length), 1)
    B, longest = place.agree(len(ids), max(len(p) for p in ids))  # the same in every process
    if B != len(ids):
        raise ValueError(f"every process must generate the same number of prompts; this "
                         f"one has {len(ids)}, another {B}")
    if longest > width:
        width = next_pow2(longest)
    cond = ids   # what the target conditions on: under "drop" the trainer skips every pad id
    if drop_pads:
        cond = [[t for t in p if t != pad] or p[-1:] for p in ids]
    prompt_BT = np.full((B, width), pad, np.int32)
    left_BT = np.full((B, width), pad, np.int32)
    for b, (p, c) in enumerate(zip(ids, cond)):
        prompt_BT[b, :len(c)] = c
        left_BT[b, width - len(p):] = p
    return PromptBatch(prompt_BT, np.array([len(c) for c in cond], np.int32), left_BT)


def prompt_batch(prompts, max_prompt_length: int, tokenizer: RolloutTokenizer | None,
                 prompt_pads: str, place: BatchPlacement) -> PromptBatch:
    """``prompts`` (strings, or token-id lists used as they are) as a ``PromptBatch``
    (``pad_prompts``), padded with the tokenizer's pad id (0 without one), pad ids dropped from
    what the target conditions on under ``prompt_pads="drop"``."""
    ids = [prompt_ids(p, tokenizer) for p in prompts]
    pad = int(tokenizer.pad_id()) if tokenizer is not None else 0
    return pad_prompts(ids, max_prompt_length, pad,
                       prompt_pads == "drop" and tokenizer is not None, place)


def stop_ids(rc: RolloutConfig, tokenizer: RolloutTokenizer | None) -> tuple[int, ...]:
    """The stop ids of every row: ``rc.eos_tokens`` (default: the tokenizer's EOS) and the pad
    id (the trainer masks pad ids: a completion ends there)."""
    stop = [int(t) for t in rc.eos_tokens] if rc.eos_tokens else (
        [int(tokenizer.eos_id())] if tokenizer is not None else [])
    if tokenizer is not None and int(tokenizer.pad_id()) not in stop:
        stop.append(int(tokenizer.pad_id()))
    return tuple(stop)


def row_stop_array(stop_tokens, B: int, vocab_size: int,
                   place: BatchPlacement) -> np.ndarray | None:
    """``stop_tokens`` (one list of ids per prompt, may be empty; None: none) as a ``[B, e]``
    int32 array, -1-padded, ``e`` a power of two (the same in every process)."""
    if stop_tokens is None:
        return None
    if len(stop_tokens) != B:
        raise ValueError(f"stop_tokens needs one list per prompt: {len(stop_tokens)} lists "
                         f"for {B} prompts")
    rows = [[int(t) for t in np.asarray(r).reshape(-1)] for r in stop_tokens]
    bad = sorted({t for r in rows for t in r if not 0 <= t < vocab_size})
    if bad:
        raise ValueError(f"stop_tokens outside the vocabulary [0, {vocab_size}): {bad[:10]}")
    (longest,) = place.agree(max(len(r) for r in rows))
    stops_Be = np.full((B, next_pow2(max(longest, 1))), -1, np.int32)
    for b, r in enumerate(rows):
        stops_Be[b, :len(r)] = r
    return stops_Be


def shared_prefill_rows(prompt_BT: np.ndarray, lengths_B: np.ndarray):
    """``(distinct prompts [U, T], their lengths [U], each row's prompt [B])`` when some rows
    repeat a prompt (GRPO's G samples of each), in order of first appearance; else None."""
    first: dict[bytes, int] = {}
    rows_B = np.array([first.setdefault(prompt_BT[b, :n].tobytes(), len(first))
                       for b, n in enumerate(lengths_B)], np.int32)
    if len(first) == len(rows_B):
        return None
    distinct_U = np.unique(rows_B, return_index=True)[1]   # first row of each prompt
    return prompt_BT[distinct_U], lengths_B[distinct_U], rows_B


def rollout_output(tokens_BY: np.ndarray, num_B: np.ndarray, logprobs_BY: np.ndarray | None,
                   stop: tuple[int, ...], row_stops_Be: np.ndarray | None, left_BT: np.ndarray,
                   tokenizer: RolloutTokenizer | None) -> RolloutOutput:
    """tunix's ``RolloutOutput`` of decoded rows (host arrays, ``num_B`` tokens each): each row
    up to, not including, its first id of ``stop`` or of its ``row_stops_Be`` row (tunix drops
    the EOS token), its log-probs (``logprobs_BY`` None: no log-probs) and its text (empty
    without a tokenizer)."""
    tokens, logprobs, text = [], [], []
    for b in range(len(left_BT)):
        row = tokens_BY[b, :num_B[b]]
        hit = np.flatnonzero(np.isin(row, stop) | (
            False if row_stops_Be is None else np.isin(row, row_stops_Be[b])))
        end = int(hit[0]) if hit.size else len(row)
        tokens.append(row[:end].copy())
        if logprobs_BY is not None:
            logprobs.append(logprobs_BY[b, :end].copy())
        text.append(tokenizer.decode(row[:end]) if tokenizer is not None else "")
    return RolloutOutput(text=text, logits=[], tokens=tokens, left_padded_prompt_tokens=left_BT,
                         logprobs=logprobs if logprobs_BY is not None else None)
