"""Live handles kept for reuse: one start per distinct configuration while it lives.

A server adapter (``vllm_adapter``) starts a server per configuration, and a
session compares the same configurations again and again: stock in PRELUDE,
then as the quality reference and as the stack; the stack in every trial.
:class:`HandlePool` lets a released handle stay alive (idle) and lends it
again to the next :meth:`~HandlePool.acquire` of the same key, so only a
configuration that is not alive yet starts:

* ``acquire(key, start)``: an idle live handle of ``key`` (the earliest
  started: stock's PRELUDE instance, the one the quality references came
  from); else ``start(reason)`` after stopping idle handles until fewer than
  ``max_live`` are alive (a pair is 2). A handle lent out is never lent twice
  at once, so an A/A (the same key twice in one comparison) gets two distinct
  instances.
* An idle handle whose process died is stopped and dropped; its key starts
  again, recorded as a restart (``reason``).
* ``release(handle)``: back to idle while reuse is on (``keep``), else
  stopped at once (as without a pool); a dead handle is stopped and dropped.
* ``stop_idle()``: stop every idle handle (before another adapter needs the
  device, at session end); ``close()``: stop all.
* Every start, failed ones too, is an event (``take_starts()`` drains them)
  with its wall seconds (``startup_s``) and what ``start`` says about it.

Eviction order: an idle handle whose key the coming comparison does not
need (``want(keys)``: the session says which two it will compare) first,
then an idle second instance of a key that has an earlier one alive (the
A/A's stock-2), then the least recently used.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

__all__ = ["HandlePool"]

H = TypeVar("H")


@dataclass
class _Entry(Generic[H]):
    key: str
    handle: H
    busy: bool
    order: int
    last_used: int


class HandlePool(Generic[H]):
    """See the module docstring. ``stop(h)`` ends a handle's process;
    ``alive(h)`` says whether it still runs; ``name(h)`` names it in events."""

    def __init__(self, stop: Callable[[H], None], alive: Callable[[H], bool], name: Callable[[H], str],
                 max_live: int = 2, keep: bool = False) -> None:
        self._stop, self._alive, self._name = stop, alive, name
        self.max_live = max(1, int(max_live))
        self.keep = keep
        self._entries: list[_Entry[H]] = []
        self._tick = itertools.count()
        self._died: dict[str, str] = {}  # key -> the handle that died (for the restart's reason)
        self._starts: list[dict[str, Any]] = []
        self._wanted: set[str] = set()
        self.reuses = 0

    def want(self, keys: Any) -> None:
        """The keys the coming comparison needs: kept alive in preference to others."""
        self._wanted = set(keys)

    # ------------------------------------------------------------------ views
    def live(self) -> list[H]:
        return [e.handle for e in self._entries]

    def idle(self) -> list[H]:
        return [e.handle for e in self._entries if not e.busy]

    def take_starts(self) -> list[dict[str, Any]]:
        """The start events since the last call (oldest first)."""
        out, self._starts = self._starts, []
        return out

    # -------------------------------------------------------------- lending
    def acquire(self, key: str, start: Callable[[str], tuple[H, dict[str, Any]]]) -> H:
        """A live idle handle of ``key``, else a new one from ``start(reason)``
        (which returns the handle and what to record about its start)."""
        for e in sorted((e for e in self._entries if e.key == key and not e.busy), key=lambda e: e.order):
            if self._alive(e.handle):
                e.busy, e.last_used = True, next(self._tick)
                self.reuses += 1
                return e.handle
            self._died[key] = self._name(e.handle)
            self._drop(e)
        evicted = self._make_room()
        dead = self._died.pop(key, None)
        reason = f"restart: server {dead} of this configuration had died" if dead else "new"
        event: dict[str, Any] = {"config": key, "reason": reason, "evicted": evicted, "started_at": time.time()}
        t0 = time.perf_counter()
        try:
            handle, info = start(reason)
        except Exception as exc:
            event.update(startup_s=time.perf_counter() - t0, failed=True, error=f"{type(exc).__name__}: {exc}"[:500],
                         live=len(self._entries))
            self._starts.append(event)
            raise
        event.update(info)
        event.update(startup_s=time.perf_counter() - t0, handle=self._name(handle), live=len(self._entries) + 1)
        self._starts.append(event)
        n = next(self._tick)
        self._entries.append(_Entry(key, handle, True, n, n))
        return handle

    def release(self, handle: H) -> None:
        e = self._find(handle)
        if e is None:  # not lent by this pool (stopped already): stop is idempotent
            self._stop(handle)
            return
        if not self._alive(handle):
            self._died[e.key] = self._name(handle)
            self._drop(e)
        elif not self.keep:
            self._drop(e)
        else:
            e.busy, e.last_used = False, next(self._tick)

    def stop_idle(self) -> list[str]:
        """Stop every handle not lent out; returns their names."""
        names = []
        for e in [e for e in self._entries if not e.busy]:
            names.append(self._name(e.handle))
            self._drop(e)
        return names

    def close(self) -> None:
        for e in list(self._entries):
            self._drop(e)

    # ------------------------------------------------------------ internals
    def _find(self, handle: H) -> _Entry[H] | None:
        return next((e for e in self._entries if e.handle is handle), None)

    def _drop(self, e: _Entry[H]) -> None:
        self._entries.remove(e)
        self._stop(e.handle)

    def _make_room(self) -> list[str]:
        """Stop idle handles until a new one keeps the live count within ``max_live``."""
        evicted = []
        while len(self._entries) >= self.max_live:
            idle = [e for e in self._entries if not e.busy]
            if not idle:
                break  # every live handle is lent out: the new one goes over the bound, never a lent one stopped
            first = {}
            for e in sorted(self._entries, key=lambda e: e.order):
                first.setdefault(e.key, e)
            victim = min(idle, key=lambda e: (e.key in self._wanted, first[e.key] is e, e.last_used))
            evicted.append(self._name(victim.handle))
            self._drop(victim)
        return evicted
