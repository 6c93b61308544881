"""What the benchmarks share: the table of entry points (``python -m benchmarks GROUP NAME``),
the repository's paths and the command line a result file records.

Standard library only: ``python -m benchmarks`` lists the entry points from here without
loading jax.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]     # the repository
RESULTS = ROOT / "benchmarks" / "results"      # the measured tables

# group -> (what the group measures, {name: one line}); NAME runs ``benchmarks/GROUP/NAME.py``
# ``main(argv)``, and ``NAME --help`` prints that module's docstring: what it measures and how.
# ``python -m benchmarks tables`` (``benchmarks/tables.py``) renders the docs' tables from
# ``results/``. Closed investigations: experiments/investigations/README.md.
GROUPS: dict[str, tuple[str, dict[str, str]]] = {
    "methods": ("decoding methods end to end on real prompts: tokens/s, tau, speedup over ar", {
        "bench": "every method on HumanEval / MT-Bench / MATH500, batch 1, fixed budget and "
                 "auto (make bench): bench.json, bench.md",
        "bf16_host": "auto and lookup auto on bf16 and float32 weights vs float32 ar, in "
                     "one process, per set incl. copyedit (the README's table)",
    }),
    "gpu": ("the prepared runs on a lent GPU (gpu_*.sh call these)", {
        "suite": "the Pallas kernel check and real-size round stages in one ~10-minute call",
        "ar_profile": "the AR step kernel by kernel (time, bytes, GB/s) against the roof",
        "round_profile": "a round's stages inside the one compiled round (device time, idle, wall)",
        "carry": "a file larger than one device call takes, split / staged / joined in parts",
    }),
}


def command_line(group: str, name: str, argv=None) -> str:
    """The command a result records: ``python -m benchmarks GROUP NAME ARGS`` (quoted)."""
    argv = sys.argv[1:] if argv is None else argv
    return " ".join(["python -m benchmarks", group, name] + [shlex.quote(a) for a in argv])


def python_m(group: str, name: str, *args: str) -> list[str]:
    """argv of a subprocess running ``GROUP NAME ARGS`` with this interpreter (run it with
    ``cwd=ROOT``)."""
    return [sys.executable, "-m", "benchmarks", group, name, *args]
