"""One-shot control: the deadline after which no new compile starts, and each part run isolated
(an exception is recorded with its traceback and the next part runs)."""

from __future__ import annotations

import dataclasses
import datetime
import math
import time
import traceback

def now() -> float:
    """Wall clock (UNIX seconds) the deadline is read against (tests replace it)."""
    return time.time()


def parse_deadline(text: str, start: float) -> float:
    """``--deadline``: seconds after ``start`` (``"540"``), a UTC time of day (``"10:30"``,
    ``"10:30:15"``) or an ISO date-time (``"2026-12-01T10:30:00Z"``) → UNIX seconds."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if seconds < 0:
            raise ValueError(f"--deadline {text!r}: seconds must be >= 0")
        return start + seconds
    utc = datetime.timezone.utc
    try:
        if "T" in text or "-" in text:
            when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
            when = when if when.tzinfo else when.replace(tzinfo=utc)
        else:
            clock = datetime.time.fromisoformat(text)
            today = datetime.datetime.fromtimestamp(start, utc).date()
            when = datetime.datetime.combine(today, clock, tzinfo=utc)
    except ValueError:
        raise ValueError(f"--deadline {text!r}: give seconds, HH:MM[:SS] (UTC) or an ISO "
                         "date-time") from None
    if when.timestamp() <= start:
        raise ValueError(f"--deadline {text!r} ({when.isoformat()}) is not in the future")
    return when.timestamp()


@dataclasses.dataclass
class Deadline:
    """Stop starting new compiles ``reserve`` seconds before ``at`` (None: no deadline)."""
    at: float | None
    reserve: float = 0.0

    def left(self) -> float:
        return math.inf if self.at is None else self.at - now()

    def allows_new_work(self) -> bool:
        return self.left() > self.reserve


SKIPPED = {"skipped": "deadline"}


def run_isolated(entry: dict, part: str, fn, deadline: Deadline, log, what: str) -> str:
    """``entry[part] = fn()`` unless the deadline is near (``SKIPPED``; an older result, e.g.
    merged, is kept) or ``fn`` raises (its error and traceback instead). Returns ``"ok"``,
    ``"error"`` or ``"skipped"``."""
    if not deadline.allows_new_work():
        if entry.get(part) is None or entry[part].get("skipped"):
            entry[part] = dict(SKIPPED)
        log(f"  {what}: skipped (deadline, {deadline.left():.0f} s left)")
        return "skipped"
    t = time.perf_counter()
    try:
        result = fn()
    except Exception as err:  # noqa: BLE001  (record it; the next method runs)
        entry[part] = {"error": error_line(err), "traceback": traceback.format_exc()}
        log(f"  {what}: FAILED {error_line(err)}")
        return "error"
    result["wall_s"] = time.perf_counter() - t
    entry[part] = result
    log(f"  {what}: done ({result['wall_s']:.1f} s)")
    return "ok"


def error_line(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text}"


def calling(fn, *args, **kwargs):
    return lambda: fn(*args, **kwargs)
