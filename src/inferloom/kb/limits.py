"""Caps on what ``inferloom kb import FILE`` accepts from a handed-over export.

An export comes from another team's KB, so it is input to check, not a trusted
copy: the file's size is bounded before it is parsed, every string and every
list (and object) in it is capped, and the whole document is checked before
anything is written (a refusal writes nothing). A refusal is one line naming
the field by its path in the document (``recipes[0].lessons[3].text``) and the cap.

Approvals are never imported: a winner's ``promotion`` and ``promotion``
history entries are dropped (:func:`inferloom.kb.merge.parse_document`); an
approval is made in this KB only, by ``inferloom promote``.
"""

from __future__ import annotations

from typing import Any

from inferloom.kb.db import KBError

__all__ = ["ImportRefused", "MAX_IMPORT_BYTES", "MAX_STRING_CHARS", "MAX_LIST_ITEMS", "MAX_RECIPES",
           "MAX_CEILINGS", "check_document"]

MAX_IMPORT_BYTES = 16 * 1024 * 1024   # the export file, checked before it is read
MAX_STRING_CHARS = 64 * 1024          # any string value or key (a lesson's text, a note, ...)
MAX_LIST_ITEMS = 1000                 # any list or object inside a recipe (sessions, lessons, a config ...)
MAX_RECIPES = 10_000                  # the document's top-level "recipes"
MAX_CEILINGS = 1000                   # the document's top-level "ceilings"


class ImportRefused(KBError):
    """A KB export exceeds one of the import caps (one line: the field and the cap)."""


def _cap_for(path: str) -> int:
    return {"recipes": MAX_RECIPES, "ceilings": MAX_CEILINGS}.get(path, MAX_LIST_ITEMS)


def check_document(doc: Any, name: str) -> None:
    """Raise :class:`ImportRefused` for the first field of ``doc`` over a cap (``name``: the file, for the message)."""
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        path, v = stack.pop()
        where = path or "(document)"
        if isinstance(v, str):
            if len(v) > MAX_STRING_CHARS:
                raise ImportRefused(f"KB export {name}: {where} is {len(v)} characters, over the cap of "
                                    f"{MAX_STRING_CHARS}; nothing was imported")
        elif isinstance(v, list):
            cap = _cap_for(path)
            if len(v) > cap:
                raise ImportRefused(f"KB export {name}: {where} has {len(v)} entries, over the cap of {cap}; "
                                    f"nothing was imported")
            stack.extend((f"{path}[{i}]", x) for i, x in enumerate(v))
        elif isinstance(v, dict):
            if path and len(v) > MAX_LIST_ITEMS:
                raise ImportRefused(f"KB export {name}: {where} has {len(v)} keys, over the cap of "
                                    f"{MAX_LIST_ITEMS}; nothing was imported")
            for k, x in v.items():
                key = str(k)
                if len(key) > MAX_STRING_CHARS:
                    raise ImportRefused(f"KB export {name}: a key in {where} is {len(key)} characters, over the "
                                        f"cap of {MAX_STRING_CHARS}; nothing was imported")
                stack.append((f"{path}.{key}" if path else key, x))
