"""Verbatim repetition loops in an answer: where one starts to repeat itself.

SmolLM2-135M's greedy answers often fall into a loop that runs to the answer cap (in the v4 mix,
44 % of greedy answer tokens come after the loop point; ``benchmarks/results/drafter_v4`` §10).
``loop_end`` finds the point; collection stops rows there (``slots.SlotAnswerer``
``loop_window``) and training can trim stored answers there (``SequenceDataset trim_loops``).
"""

from __future__ import annotations

LOOP_REPEATS = 3   # a window seen this many times marks a loop (its onset, twice, is kept)


def loop_end(answer, window: int, repeats: int = LOOP_REPEATS) -> int | None:
    """The length of ``answer`` up to the end of the first ``window``-token window that occurs
    for the ``repeats``-th time (None when none does)."""
    watch, grown = LoopWatch(window, repeats), []
    for t in answer:
        grown.append(int(t))
        if watch.looped(grown):
            return len(grown)
    return None


class LoopWatch:
    """``loop_end`` incrementally: feed one row's answer as it grows."""

    def __init__(self, window: int, repeats: int = LOOP_REPEATS):
        self.window, self.repeats = window, repeats
        self.seen: dict[tuple, int] = {}

    def looped(self, answer: list[int]) -> bool:
        """Whether the window ending at ``answer``'s last token is the ``repeats``-th."""
        if not self.window or len(answer) < self.window:
            return False
        w = tuple(answer[-self.window:])
        self.seen[w] = self.seen.get(w, 0) + 1
        return self.seen[w] >= self.repeats
