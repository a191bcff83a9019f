"""Several written kernels in one value of the ``llm_kernel`` knob
(:mod:`inferloom.kernels.written`): a session can keep more than one.

A value is ``none``, one written kernel ``<catalog entry>-<sha10>`` (as
before), or a *combination*: written kernels that rewrite different modules,
sorted and joined by ``+`` (:data:`SEP`, the canonical order: one spelling per
set), e.g. ``add_rmsnorm-0123456789+decode_attention-abcdef0123``. Two
members may not rewrite the same modules (:func:`overlap`: the same catalog
entry, or the same knob of :data:`~inferloom.kernels.written.REPLACES`:
``gate_up_silu`` and ``silu_mul`` both rewrite the MLP).

The KERNEL phase (``phases/kernel_llm.py``) makes a kernel whose gates passed
the candidate :func:`combine` (the stack's value plus the new kernel; a member
that rewrites the same modules is replaced by it) and registers the
combination (:func:`register_combined`, recorded in
``<session>/llm/kernels/combined.json``), so the knob's domain holds ``none``,
each registered kernel and the combinations registered. Every consumer reads a
value through :func:`members`: the transformers engine applies each member
(:func:`inferloom.workloads.engine_written.apply`), the diffusers engine only ``add_rmsnorm`` members
(:func:`inferloom.workloads.engine_written.apply_norms`; anything else is refused by
``diffusers_ops.written_rule``),
:func:`conflict` checks each member's REPLACES and NEEDS, :func:`restore` (a
resumed session) and :func:`restore_checked` (``verify --remeasure``: each
member's source checked, a missing or changed one refused naming it) register
the members and then the combination. A single-kernel value reads exactly as
before (its notes, refusals and records are unchanged)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping

from inferloom.kernels import written
from inferloom.kernels.written import KNOB, REPLACES, WrittenKernelError, entry_of

__all__ = ["SEP", "COMBINED", "members", "overlap", "compose", "combine", "conflict", "register_combined", "restore",
           "restore_checked"]

SEP = "+"
COMBINED = "combined.json"


def members(value: str) -> tuple[str, ...]:
    """The written kernels ``llm_kernel=value`` names: none for ``none``, else each member in its order."""
    value = str(value)
    return () if value == "none" else tuple(value.split(SEP))


def _modules(member: str) -> tuple[str, str]:
    """(the knob whose modules ``member`` rewrites, or its entry; what it rewrites)."""
    entry = entry_of(member)
    knob, _, what = REPLACES.get(entry, (entry, "", f"the {entry} modules"))
    return knob, what


def overlap(value: str) -> str | None:
    """Why the combination ``value`` is not one (two members rewriting the same modules, a repeated member, not in
    the canonical order), else None."""
    ms = members(value)
    seen: dict[str, str] = {}
    for m in ms:
        knob, what = _modules(m)
        if knob in seen:
            return (f"{seen[knob]} and {m} both rewrite {what}; a combination holds one written kernel per set of "
                    "modules")
        seen[knob] = m
    if len(ms) > 1 and list(ms) != sorted(ms):
        return f"{value}: its members are not in the canonical order ({SEP.join(sorted(ms))})"
    return None


def compose(values: Iterable[str]) -> str:
    """The canonical value of the written kernels ``values`` (each a kernel or a combination; ``none`` for none);
    ``ValueError`` when two of them rewrite the same modules."""
    ms = sorted({m for v in values for m in members(v)})
    value = SEP.join(ms) or "none"
    why = overlap(value)
    if why:
        raise ValueError(f"{KNOB}: {why}")
    return value


def combine(current: str, new: str) -> tuple[str, list[str]]:
    """The value of a candidate that adds the written kernel ``new`` to a stack with ``llm_kernel=current``, and the
    members of ``current`` it replaces (its own catalog entry's, or one that rewrites the same modules)."""
    mine = _modules(new)[0]
    dropped = [m for m in members(current) if _modules(m)[0] == mine]
    return compose([*(m for m in members(current) if m not in dropped), new]), dropped


def conflict(value: str, cfg: Mapping[str, Any]) -> str | None:
    """Why ``llm_kernel=value`` can't run with the rest of ``cfg`` (:func:`inferloom.kernels.written.conflict` for
    every member, named when there are several; members that overlap), else None."""
    ms = members(value)
    if len(ms) <= 1:
        return written.conflict(str(value), cfg)
    why = overlap(value)
    if why:
        return why
    for m in ms:
        why = written.conflict(m, cfg)
        if why:
            return f"{m}: {why}"
    return None


def _book(session_dir: str | Path) -> Path:
    return Path(session_dir) / "llm" / "kernels" / COMBINED


def register_combined(session_dir: str | Path, value: str) -> None:
    """Make the combination ``value`` (every member registered already) a value of ``llm_kernel``, in this process
    and for a resume; a single kernel: nothing to do (:func:`inferloom.kernels.written.register` did it)."""
    ms = members(value)
    if len(ms) <= 1:
        return
    why = overlap(value)
    if why:
        raise ValueError(f"{KNOB}={value}: {why}")
    have = written.registered()
    missing = [m for m in ms if m not in have]
    if missing:
        raise ValueError(f"{KNOB}={value}: {', '.join(missing)} is not a written kernel of this session")
    written.COMBINED[value] = ms
    book = _book(session_dir)
    known = set(json.loads(book.read_text())) if book.is_file() else set()
    book.write_text(json.dumps(sorted(known | {value}), indent=1))


def restore(session_dir: str | Path) -> list[str]:
    """Register again the kernels a session's gates passed and the combinations of them it registered (a resumed
    session); their values."""
    values = written.restore(session_dir)
    book = _book(session_dir)
    combos = [str(v) for v in json.loads(book.read_text())] if book.is_file() else []
    for value in combos:
        if overlap(value) is None and all(m in values for m in members(value)):
            written.COMBINED[value] = members(value)
    return sorted({*values, *(v for v in combos if v in written.COMBINED)})


def restore_checked(session_dir: str | Path, values: list[str] | tuple[str, ...]) -> None:
    """Register ``values`` (kernels or combinations) exactly as the session did (``verify --remeasure``): every
    member checked by :func:`inferloom.kernels.written.restore_checked` (a missing or changed one refused naming
    that member), then the combination; :class:`WrittenKernelError` for a combination that is not one."""
    for value in values:
        ms = members(value)
        why = overlap(value) if len(ms) > 1 else None
        if why:
            raise WrittenKernelError(f"written kernels {value}: {why}")
        written.restore_checked(session_dir, list(ms))
        if len(ms) > 1:
            written.COMBINED[value] = ms
