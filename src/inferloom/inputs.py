"""Reading untrusted input files: strict UTF-8, strict YAML, bounded JSON.

Every reader here turns a bad file into one :class:`InputError` whose message
is one line: what is wrong and what to do (the caller prefixes the file's
name and re-raises it as its own error class, e.g. ``SpecError``). Limits,
each far above anything inferloom writes or a spec needs:

* text is UTF-8, strictly (a UTF-16 / UTF-32 byte-order mark is named);
* at most :data:`MAX_INPUT_BYTES` for a hand-written file (a spec);
* containers nested at most :data:`MAX_DEPTH` deep (a 20,000-deep ``[[[...]]]``
  would otherwise overflow Python's recursion limit);
* integers of at most :data:`MAX_INT_DIGITS` digits that fit in a signed
  64-bit integer (SQLite's and every JSON reader's range); floats finite;
* YAML: no anchors or aliases (an alias "bomb" of a few hundred bytes expands
  to billions of nodes; specs never need them), no duplicate keys (YAML
  would silently keep the last one), only the safe loader's types.

Depends on :mod:`inferloom.errors` only.
"""

from __future__ import annotations

import json
import math
from typing import Any

import yaml

from inferloom.errors import InferloomError

__all__ = ["InputError", "MAX_INPUT_BYTES", "MAX_DEPTH", "MAX_INT_DIGITS", "INT_RANGE", "decode_utf8",
           "load_yaml", "load_json", "check_depth"]

MAX_INPUT_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_INT_DIGITS = 20
INT_RANGE = (-(2**63), 2**63 - 1)

_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
         (b"\xfe\xff", "UTF-16"))


class InputError(InferloomError, ValueError):
    """An input file that can't be read as what it should be (one line, exit 2)."""


def decode_utf8(data: bytes, max_bytes: int | None = MAX_INPUT_BYTES) -> str:
    """``data`` as UTF-8 text (a leading UTF-8 byte-order mark is dropped); InputError otherwise."""
    if max_bytes is not None and len(data) > max_bytes:
        raise InputError(f"{len(data)} bytes, over the limit of {max_bytes}; expected a small text file")
    for bom, name in _BOMS:
        if data.startswith(bom):
            raise InputError(f"encoded as {name} (it starts with a {name} byte-order mark); save it as UTF-8")
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise InputError(f"not UTF-8: byte 0x{data[exc.start]:02x} at line {line} (offset {exc.start}) is "
                         f"{exc.reason}; save it as UTF-8") from None


def _int64(text: str) -> int:
    digits = text.lstrip("+-")
    if len(digits) > MAX_INT_DIGITS:
        raise InputError(f"an integer of {len(digits)} digits; expected at most {MAX_INT_DIGITS} digits")
    v = int(text)
    if not INT_RANGE[0] <= v <= INT_RANGE[1]:
        raise InputError(f"integer {v} is outside the signed 64-bit range; expected a smaller number")
    return v


def check_depth(value: Any, max_depth: int = MAX_DEPTH) -> Any:
    """``value`` unchanged if its lists / dicts nest at most ``max_depth`` deep (checked without recursion)."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            if d > max_depth:
                raise InputError(f"nested more than {max_depth} levels deep; expected a flatter document")
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return value


def _no_constant(name: str) -> Any:
    raise InputError(f"the number {name} is not allowed; expected a finite number")


def _float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise InputError(f"the number {text} overflows a float; expected a finite number")
    return v


def load_json(text: str | bytes, *, max_depth: int = MAX_DEPTH, int64: bool = True) -> Any:
    """Parse JSON with the limits of this module (bytes must be UTF-8); InputError if it is unusable.

    ``int64``: integers must fit in a signed 64-bit integer (files another
    program wrote, e.g. a KB export); False accepts any integer Python can
    read (inferloom's own session files, whose writer never refused one)."""
    if isinstance(text, bytes):
        text = decode_utf8(text, max_bytes=None)
    try:
        value = json.loads(text, parse_int=_int64 if int64 else int, parse_float=_float, parse_constant=_no_constant)
    except ValueError as exc:  # JSONDecodeError is one; int() past Python's digit limit is another
        if isinstance(exc, json.JSONDecodeError):
            raise InputError(f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
        if isinstance(exc, InputError):
            raise
        raise InputError(f"a number that can't be read ({str(exc).split(':')[0]}); expected a smaller number") from None
    except RecursionError:
        raise InputError(f"nested more than {max_depth} levels deep; expected a flatter document") from None
    return check_depth(value, max_depth)


class _StrictLoader(yaml.SafeLoader):
    """The safe loader, refusing anchors, aliases, duplicate keys, deep nesting and huge integers."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            raise InputError(f"a YAML alias (*{event.anchor}) at line {line}: anchors and aliases are not "
                             "allowed in a spec; write the value out")
        if getattr(event, "anchor", None):
            raise InputError(f"a YAML anchor (&{event.anchor}) at line {line}: anchors and aliases are not "
                             "allowed in a spec; write the value out")
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > MAX_DEPTH:
                raise InputError(f"nested more than {MAX_DEPTH} levels deep at line {line}; expected a flatter spec")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                raise InputError(f"a mapping key at line {key_node.start_mark.line + 1} is not a plain value; "
                                 "expected a name") from None
            if key in seen:
                raise InputError(f"duplicate key '{key}' at line {key_node.start_mark.line + 1} (first at line "
                                 f"{seen[key]}); YAML would keep only the last: remove one")
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: Any) -> int:
        text = str(self.construct_scalar(node)).replace("_", "")
        if len(text.lstrip("+-")) > MAX_INT_DIGITS:
            raise InputError(f"an integer of {len(text.lstrip('+-'))} digits at line {node.start_mark.line + 1}; "
                             f"expected at most {MAX_INT_DIGITS} digits")
        v = super().construct_yaml_int(node)
        if not INT_RANGE[0] <= v <= INT_RANGE[1]:
            raise InputError(f"integer at line {node.start_mark.line + 1} is outside the signed 64-bit range")
        return v


    def construct_yaml_float(self, node: Any) -> float:
        v = super().construct_yaml_float(node)
        if not math.isfinite(v):
            raise InputError(f"the number {node.value} at line {node.start_mark.line + 1} is not finite; "
                             "expected a finite number")
        return v

    def construct_as_text(self, node: Any) -> str:
        """A date or time stays the text it was written as (specs hold JSON types only)."""
        return str(self.construct_scalar(node))

    def construct_refused(self, node: Any) -> Any:
        raise InputError(f"the YAML tag {node.tag.replace('tag:yaml.org,2002:', '!!')} at line "
                         f"{node.start_mark.line + 1} is not allowed; expected strings, numbers, lists and mappings")


_StrictLoader.add_constructor("tag:yaml.org,2002:int", _StrictLoader.construct_yaml_int)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _StrictLoader.construct_yaml_float)
_StrictLoader.add_constructor("tag:yaml.org,2002:timestamp", _StrictLoader.construct_as_text)
for _tag in ("binary", "set", "omap", "pairs"):
    _StrictLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _StrictLoader.construct_refused)
_StrictLoader.add_constructor(None, _StrictLoader.construct_refused)


def load_yaml(data: bytes) -> Any:
    """Parse a YAML file's bytes (UTF-8, at most :data:`MAX_INPUT_BYTES`) strictly; InputError if unusable."""
    text = decode_utf8(data)
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None)
        raise InputError(f"not valid YAML{where}" + (f" ({problem})" if problem else "")) from None
    except RecursionError:
        raise InputError(f"nested more than {MAX_DEPTH} levels deep; expected a flatter spec") from None
