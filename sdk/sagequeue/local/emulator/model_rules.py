"""Every constraint of an operation's input, read from the service model botocore ships.

SageMaker refuses what breaks its model (lengths, ranges, patterns, enums, list and map sizes) with a
ValidationException naming the member; botocore checks only required members, types and minima before
sending. Walking the model generically keeps the emulator as strict as SageMaker for every shape, not just
the members sagequeue happens to use. Patterns are Java regular expressions matched against the whole value;
their Unicode classes (\\p{L} and friends) are translated to Python approximations.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from sagequeue.local.emulator.errors import ValidationError

#: Java's Unicode property classes as Python character-class contents (letters, separators, digits, ...).
_UNICODE_CLASSES = {
    r"\p{L}": "a-zA-Z\u00c0-\u024f\u0370-\u03ff\u0400-\u04ff\u3040-\u30ff\u4e00-\u9fff\uac00-\ud7af",
    r"\p{Z}": " \u00a0\u2000-\u200b\u3000",
    r"\p{N}": "0-9",
    r"\p{M}": "\u0300-\u036f",
    r"\p{Alnum}": "a-zA-Z0-9",
    r"\p{Alpha}": "a-zA-Z",
    r"\p{Digit}": "0-9",
    r"\p{Punct}": r"!-/:-@\[-`{-~",
}


@functools.cache
def _pattern(java: str) -> re.Pattern[str]:
    out: list[str] = []
    index = 0
    depth = 0  # inside a bracketed class, a Unicode class contributes its contents only
    while index < len(java):
        if java.startswith("\\p{", index):
            end = java.index("}", index)
            contents = _UNICODE_CLASSES[java[index : end + 1]]
            out.append(contents if depth else f"[{contents}]")
            index = end + 1
            continue
        char = java[index]
        if char == "\\":
            out.append(java[index : index + 2])
            index += 2
            continue
        if char == "[":
            depth += 1
        elif char == "]" and depth:
            depth -= 1
        out.append(char)
        index += 1
    return re.compile("".join(out), re.DOTALL)


@functools.cache
def _service_model() -> Any:
    # One session for every operation: each new session parses the SageMaker model (megabytes of JSON) again.
    import botocore.session

    return botocore.session.get_session().get_service_model("sagemaker")


@functools.cache
def _input_shape(operation: str) -> Any:
    return _service_model().operation_model(operation).input_shape


def _camel(name: str) -> str:
    return name[:1].lower() + name[1:]


class _Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, value: Any, where: str, constraint: str) -> None:
        shown = "null" if value is None else f"'{value}'"
        self.items.append(
            f"Value {shown} at '{where}' failed to satisfy constraint: Member must {constraint}"
        )


def check(operation: str, request: Mapping[str, Any]) -> None:
    """Raises SageMaker's ValidationException listing every constraint of the model that `request` breaks."""
    shape = _input_shape(operation)
    if shape is None:
        return
    problems = _Problems()
    _walk(shape, request, "", problems)
    if problems.items:
        count = len(problems.items)
        noun = "error" if count == 1 else "errors"
        raise ValidationError(f"{count} validation {noun} detected: " + "; ".join(problems.items))


def _walk(shape: Any, value: Any, where: str, problems: _Problems) -> None:
    kind = shape.type_name
    meta = shape.metadata
    if kind == "structure":
        if not isinstance(value, Mapping):
            problems.add(value, where, "be a structure")
            return
        for name in getattr(shape, "required_members", []):
            if value.get(name) is None:
                problems.add(None, _join(where, name), "not be null")
        for name, member_value in value.items():
            member = shape.members.get(name)
            if member is not None and member_value is not None:
                _walk(member, member_value, _join(where, name), problems)
        return
    if kind == "list":
        if not isinstance(value, list):
            problems.add(value, where, "be a list")
            return
        _size(len(value), value, where, meta, problems, "have length")
        for index, item in enumerate(value):
            _walk(shape.member, item, f"{where}.{index + 1}.member", problems)
        return
    if kind == "map":
        if not isinstance(value, Mapping):
            problems.add(value, where, "be a map")
            return
        _size(len(value), value, where, meta, problems, "have length")
        for key, item in value.items():
            _walk(shape.key, key, f"{where}.key", problems)
            _walk(shape.value, item, f"{where}.{key}.member", problems)
        return
    if kind == "string":
        if not isinstance(value, str):
            problems.add(value, where, "be a string")
            return
        _size(len(value), value, where, meta, problems, "have length")
        if shape.enum and value not in shape.enum:
            problems.add(value, where, f"satisfy enum value set: [{', '.join(shape.enum)}]")
        pattern = meta.get("pattern")
        if pattern is not None and _pattern(pattern).fullmatch(value) is None:
            problems.add(value, where, f"satisfy regular expression pattern: {pattern}")
        return
    if kind in ("integer", "long"):
        if isinstance(value, bool) or not isinstance(value, int):
            problems.add(value, where, "be an integer")
            return
        if "min" in meta and value < meta["min"]:
            problems.add(value, where, f"have value greater than or equal to {meta['min']}")
        if "max" in meta and value > meta["max"]:
            problems.add(value, where, f"have value less than or equal to {meta['max']}")
        return
    if kind in ("float", "double"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            problems.add(value, where, "be a number")
            return
        if "min" in meta and value < meta["min"]:
            problems.add(value, where, f"have value greater than or equal to {meta['min']}")
        if "max" in meta and value > meta["max"]:
            problems.add(value, where, f"have value less than or equal to {meta['max']}")
        return
    if kind == "boolean" and not isinstance(value, bool):
        problems.add(value, where, "be a boolean")


def _size(size: int, value: Any, where: str, meta: Mapping[str, Any], problems: _Problems, what: str) -> None:
    if "min" in meta and size < meta["min"]:
        problems.add(value, where, f"{what} greater than or equal to {meta['min']}")
    if "max" in meta and size > meta["max"]:
        problems.add(value, where, f"{what} less than or equal to {meta['max']}")


def _join(where: str, name: str) -> str:
    return f"{where}.{_camel(name)}" if where else _camel(name)
