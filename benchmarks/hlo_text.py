"""Reading a compiled module's HLO text: its instructions, one per defining line, for the
benchmarks that map profiled operations back to them (``round inside``, ``gpu ar_profile``,
``gpu round_profile``), and the stage scope each one ran in."""

from __future__ import annotations

import collections
import dataclasses
import re

_DEFINITION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*?) ([\w\-]+)\((.*)$")
_OPERAND = re.compile(r"%([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
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


def instruction_stages(hlo_text: str, stages) -> dict[str, str | None]:
    """``{instruction name: stage}`` from a compiled module's text (``None`` for containers:
    a loop's or branch's own event spans its body's operations); ``"other"`` without a
    stage scope. XLA:CPU's library fusions and some products carry no metadata of their own:
    such an instruction takes the stage of the instructions it reads (else of those that use
    its result)."""
    rows, users = [], collections.defaultdict(list)
    for ins in instructions(hlo_text):
        op = _OP_NAME.search(ins.rest)
        for a in ins.operands:
            users[a].append(ins.name)
        rows.append((ins.name, ins.opcode, op.group(1) if op else "", ins.operands))

    def stage_of(op_name: str) -> str | None:
        hit = [s for s in stages if s in op_name]
        return hit[-1].removeprefix("stage_") if hit else None

    own = {name: stage_of(op_name) for name, _, op_name, _ in rows}
    out: dict[str, str | None] = {}
    for name, opcode, _, operands in rows:
        if opcode in CONTAINERS:
            out[name] = None
            continue
        stage = own[name]
        for near in (operands, users.get(name, ())):
            if stage is None:
                stage = next((own[n] for n in near if own.get(n)), None)
        out[name] = stage or "other"
    return out
