"""Type and range checks of configuration fields, run before any value is used.

A checkpoint's ``config.json`` (or GGUF metadata, or an orbax directory's saved config) may
hold a string, a list or a float where an integer belongs, a bool where a number belongs, or a
non-positive size. ``Field`` says what one field must be; ``field_problems`` lists every field
of a mapping that is not, one line each naming the field, the value and what was expected.
A missing or ``None`` field passes (whether it is required is the reader's business).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any, Mapping


def is_int(value) -> bool:
    """An integer that is not a bool (NumPy integers count)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A finite real number that is not a bool."""
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value))


@dataclasses.dataclass(frozen=True)
class Field:
    """What one field must be. ``kind``: "int" (``>= least``), "number" (``> above``, and
    ``<= most`` when given), "bool", "str", "ints" (a list of ints ``>= least``), "strs",
    "object" (a JSON object)."""
    kind: str
    least: int = 0
    above: float | None = None
    most: float | None = None

    def expected(self) -> str:
        if self.kind == "int":
            return f"an integer >= {self.least}"
        if self.kind == "number":
            bounds = [f"> {self.above:g}"] if self.above is not None else []
            bounds += [f"<= {self.most:g}"] if self.most is not None else []
            return "a finite number" + (" " + " and ".join(bounds) if bounds else "")
        return {"bool": "true or false", "str": "a string",
                "ints": f"a list of integers >= {self.least}", "strs": "a list of strings",
                "object": "a JSON object"}[self.kind]

    def accepts(self, value) -> bool:
        if self.kind == "int":
            return is_int(value) and value >= self.least
        if self.kind == "number":
            return (is_number(value) and (self.above is None or value > self.above)
                    and (self.most is None or value <= self.most))
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "str":
            return isinstance(value, str)
        if self.kind == "ints":
            return isinstance(value, (list, tuple)) and all(
                is_int(v) and v >= self.least for v in value)
        if self.kind == "strs":
            return isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        return isinstance(value, Mapping)


POSITIVE = Field("int", least=1)
COUNT = Field("int", least=0)
POSITIVE_NUMBER = Field("number", above=0.0)
NUMBER = Field("number")
FLAG = Field("bool")
TEXT = Field("str")


def field_problems(values: Mapping[str, Any] | Any, fields: Mapping[str, Field],
                   prefix: str = "", none_ok=None) -> list[str]:
    """One line per field of ``values`` (a mapping, or an object read by attribute) that
    ``fields`` describes and that is present and not what it must be. ``None`` passes, unless
    ``none_ok`` (a collection of names) is given and lacks the field's name."""
    get = values.get if isinstance(values, Mapping) else (
        lambda name: getattr(values, name, None))
    out = []
    for name, field in fields.items():
        value = get(name)
        if value is None and none_ok is not None and name not in none_ok:
            out.append(f"{prefix}{name}=None: expected {field.expected()}")
        elif value is not None and not field.accepts(value):
            out.append(f"{prefix}{name}={_shown(value)}: expected {field.expected()}")
    return out


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
