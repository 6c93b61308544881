"""Reading a compiled module's HLO text: its instructions, one per defining line, for the
benchmarks that map profiled operations back to them (``round inside``, ``gpu ar_profile``)."""

from __future__ import annotations

import dataclasses
import re

_DEFINITION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*?) ([\w\-]+)\((.*)$")
_OPERAND = re.compile(r"%([\w.\-]+)")
# instructions whose profiled events span other instructions' (loops, branches, calls)
CONTAINERS = {"while", "conditional", "call", "async-start", "async-done", "async-update"}


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    shape: str                  # the result's shape text, e.g. ``f32[3,4]{1,0}`` or a tuple
    opcode: str
    operands: tuple[str, ...]   # the instructions it reads, by name
    rest: str                   # the line after the opening parenthesis (attributes, metadata)


def instructions(hlo_text: str) -> list[Instruction]:
    """Every instruction defined in ``hlo_text``, in order (fused computations' too)."""
    out = []
    for line in hlo_text.splitlines():
        m = _DEFINITION.match(line)
        if not m:
            continue
        name, shape, opcode, rest = m.groups()
        args = rest.split("calls=")[0].split("metadata=")[0].split("custom_call_target=")[0]
        out.append(Instruction(name, shape, opcode,
                               tuple(a for a in _OPERAND.findall(args) if a != name), rest))
    return out
