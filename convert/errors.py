"""The one error type converters raise, with the full list of problems."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint does not match the model it is loaded into (or cannot be read)."""

    def __init__(self, source: str, missing=(), unexpected=(), mismatched=(), other=()):
        self.missing, self.unexpected = sorted(missing), sorted(unexpected)
        self.mismatched, self.other = list(mismatched), list(other)
        lines = [f"cannot load {source}:"]
        lines += [f"  missing tensor: {n}" for n in self.missing]
        lines += [f"  unexpected tensor: {n}" for n in self.unexpected]
        lines += [f"  shape mismatch: {n}: expected {e}, found {f}" for n, e, f in self.mismatched]
        lines += [f"  {o}" for o in self.other]
        super().__init__("\n".join(lines))

    @property
    def problems(self) -> bool:
        return bool(self.missing or self.unexpected or self.mismatched or self.other)
