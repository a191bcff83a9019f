"""``ledger.jsonl``: the append-only record of everything a session did.

Format: one JSON object per line, ``{"seq": n, "ts": unix_time, "kind": ...,
["key": ...,] **payload}``, UTF-8, each line ending in ``\\n``. ``seq`` is
1, 2, 3, ... with no gap; ``kind`` is a free string (the constants below name
the ones the coordinator uses); ``key`` is present only on entries appended
with an idempotency key.

Contract of :class:`Ledger` (the writer):

* :meth:`Ledger.append` writes the whole line, then flushes and ``os.fsync``\\ s
  before returning its ``seq``: a returned seq is durable.
* Opening recovers from a crash mid-append: a torn last line (no trailing
  newline, or not a JSON object) is truncated away, never kept, and reported
  by ``recovered_torn_line`` (and the dropped bytes in ``torn_bytes``) so the
  caller can record it. Any other bad line (unparseable, not an object, wrong
  ``seq``) is corruption and raises :class:`LedgerError`: the ledger is never
  silently repaired beyond dropping an incomplete final write.
* An append that fails part-way inside this process (disk full, ...) is
  rolled back to the previous end of file before :class:`LedgerError` is raised.
* ``append(kind, payload, key=K)``: if an entry with key ``K`` already exists
  it returns that entry's seq and writes nothing, so a resumed coordinator can
  re-issue the same step without duplicating entries (:meth:`Ledger.find`
  returns the existing entry, e.g. to reuse a measurement).
* One writer process: the writer holds an exclusive ``flock`` on the file while
  open; a second writer (another process, or a second :class:`Ledger` on the
  same directory) gets :class:`LedgerError`. The kernel releases the lock when
  the process dies, so ``resume`` after ``kill -9`` just works. Not
  thread-safe. Readers that must not modify the file use :func:`read_entries`.
* No secret reaches the file: every string of a payload goes through
  :func:`inferloom.redact.redact` (a URL's password becomes ``***``).
* Payloads must be JSON-serialisable with finite floats (no NaN / inf): an
  invalid payload raises :class:`LedgerError` before anything is written.

Linux / POSIX only (``fcntl.flock``, directory fsync).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from inferloom.errors import InferloomError
from inferloom.inputs import InputError, load_json
from inferloom.redact import redact
from inferloom.session.atomic import fsync_dir

__all__ = [
    "LEDGER_FILE",
    "LedgerError",
    "Ledger",
    "read_entries",
    "MEASUREMENT",
    "PROPOSAL",
    "VERDICT",
    "REFUSAL",
    "PHASE",
    "AGENT_IO",
    "ENABLEMENT_RUNG",
    "ERROR",
    "CLOSE",
    "SERVER_START",
    "KINDS",
    "RESERVED_FIELDS",
]

LEDGER_FILE = "ledger.jsonl"

# Entry kinds the session uses (issue 3). Free strings are allowed too.
MEASUREMENT = "measurement"  # raw run records of one measurement
PROPOSAL = "proposal"  # a proposed configuration, its agent and predicted gain
VERDICT = "verdict"  # keep / revert / inconclusive (protocol + quality)
REFUSAL = "refusal"  # an action or agent output refused, with the rule's name
PHASE = "phase"  # a phase transition
AGENT_IO = "agent_io"  # an agent's input and output
ENABLEMENT_RUNG = "enablement_rung"  # one recovery rung tried in ENABLEMENT
ERROR = "error"  # a failure the session recorded and went on from
CLOSE = "close"  # the session closed, with its stop reason
SERVER_START = "server_start"  # a server started (startup seconds, why, compile cache warm or not)
KINDS = (MEASUREMENT, PROPOSAL, VERDICT, REFUSAL, PHASE, AGENT_IO, ENABLEMENT_RUNG, ERROR, CLOSE, SERVER_START)

RESERVED_FIELDS = frozenset({"seq", "ts", "kind", "key"})


class LedgerError(InferloomError, RuntimeError):
    """The ledger is corrupt, locked by another writer, or an append failed."""


def _parse_line(line: bytes) -> dict[str, Any] | None:
    """The entry on one line (without its newline), or None if it is not a JSON object."""
    try:
        obj = load_json(line, int64=False)
    except InputError:  # not UTF-8 or JSON, nested too deep, a number Python can't read
        return None
    return obj if isinstance(obj, dict) else None


def _scan(data: bytes, path: Path) -> tuple[list[dict[str, Any]], int, bytes]:
    """Parse the file's bytes: (entries, length of the valid prefix, torn tail bytes).

    Raises LedgerError for anything but a torn last line."""
    entries: list[dict[str, Any]] = []
    pos = 0
    lineno = 0
    n = len(data)
    while pos < n:
        nl = data.find(b"\n", pos)
        end = n if nl < 0 else nl
        lineno += 1
        is_last = nl < 0 or nl + 1 == n
        entry = _parse_line(data[pos:end])
        if nl < 0 or entry is None:
            if is_last:
                return entries, pos, data[pos:]
            raise LedgerError(
                f"{path}: line {lineno} is not a JSON object but is not the last line "
                "(corruption, not a crash mid-write); the ledger cannot be trusted: "
                "restore it from a backup or start a new session"
            )
        seq = entry.get("seq")
        if isinstance(seq, bool) or not isinstance(seq, int) or seq != len(entries) + 1:
            raise LedgerError(
                f"{path}: line {lineno} has seq {seq!r}, expected {len(entries) + 1} "
                "(entries were removed, reordered or edited); restore the ledger from a "
                "backup or start a new session"
            )
        if not isinstance(entry.get("kind"), str):
            raise LedgerError(f"{path}: line {lineno} (seq {seq}) has no string 'kind'; the ledger was edited")
        entries.append(entry)
        pos = nl + 1
    return entries, pos, b""


def read_entries(directory: str | os.PathLike[str], kind: str | None = None) -> list[dict[str, Any]]:
    """All entries of ``directory/ledger.jsonl`` (of one ``kind`` if given), read-only.

    Never modifies the file and takes no lock (safe while a writer runs); a torn
    last line is ignored here (the writer truncates it when it next opens).
    A missing ledger reads as empty; a corrupt one raises :class:`LedgerError`."""
    path = Path(directory) / LEDGER_FILE
    if not path.exists():
        return []
    entries, _, _ = _scan(path.read_bytes(), path)
    return [e for e in entries if kind is None or e["kind"] == kind]


class Ledger:
    """The single writer of ``directory/ledger.jsonl`` (see the module docstring).

    Creates the directory and the file if needed. Use as a context manager or
    call :meth:`close`."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.path = self.directory / LEDGER_FILE
        self.directory.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise LedgerError(
                    f"{self.path}: another writer holds it (is this session still running in "
                    "another process?); stop that process first, one writer per session"
                ) from None
            if created:
                fsync_dir(self.directory)
            data = _read_all(self._fd)
            entries, valid, torn = _scan(data, self.path)
            #: True when opening dropped an incomplete last line left by a crash.
            self.recovered_torn_line: bool = bool(torn)
            #: The bytes that were dropped (empty when nothing was).
            self.torn_bytes: bytes = torn
            if torn:
                os.ftruncate(self._fd, valid)
                os.fsync(self._fd)
            self._size = valid
            self._last_seq = len(entries)
            self._keys: dict[str, int] = {}
            self._kinds: dict[int, str] = {}
            for e in entries:
                if isinstance(e.get("key"), str):
                    self._keys[e["key"]] = e["seq"]
                    self._kinds[e["seq"]] = e["kind"]
        except BaseException:
            self.close()
            raise

    # -- context manager -------------------------------------------------
    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the file and its lock. Idempotent."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # releases the flock

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    # -- queries ---------------------------------------------------------
    @property
    def last_seq(self) -> int:
        """The seq of the last entry (0 when empty)."""
        return self._last_seq

    def __len__(self) -> int:
        return self._last_seq

    def has_key(self, key: str) -> bool:
        return key in self._keys

    def find(self, key: str) -> dict[str, Any] | None:
        """The entry appended with idempotency key ``key``, or None."""
        seq = self._keys.get(key)
        if seq is None:
            return None
        for e in self._iter_disk():
            if e["seq"] == seq:
                return e
        raise LedgerError(f"{self.path}: entry seq {seq} (key {key!r}) vanished from the file")

    def entries(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Every entry, in seq order (only those of ``kind`` if given), read from disk."""
        return [e for e in self._iter_disk() if kind is None or e["kind"] == kind]

    def _iter_disk(self) -> Iterator[dict[str, Any]]:
        self._check_open()
        data = _read_all(self._fd)  # type: ignore[arg-type]
        entries, valid, torn = _scan(data, self.path)
        if torn or valid != self._size or len(entries) != self._last_seq:
            raise LedgerError(f"{self.path}: changed on disk behind this writer's back")
        return iter(entries)

    # -- writing ---------------------------------------------------------
    def append(self, kind: str, payload: Mapping[str, Any] | None = None, *, key: str | None = None) -> int:
        """Append one entry durably; returns its seq.

        With ``key``: if an entry with that key exists, return its seq and write
        nothing (a different ``kind`` for the same key raises LedgerError)."""
        self._check_open()
        if not isinstance(kind, str) or not kind:
            raise LedgerError(f"ledger entry kind must be a non-empty string, got {kind!r}")
        if key is not None:
            if not isinstance(key, str) or not key:
                raise LedgerError(f"ledger idempotency key must be a non-empty string, got {key!r}")
            if key in self._keys:
                seq = self._keys[key]
                if self._kinds[seq] != kind:
                    raise LedgerError(
                        f"ledger key {key!r} already used by seq {seq} of kind "
                        f"{self._kinds[seq]!r}, not {kind!r}: two different steps share a key"
                    )
                return seq
        payload = redact(dict(payload or {}))
        clash = RESERVED_FIELDS & payload.keys()
        if clash:
            raise LedgerError(
                f"ledger payload for kind {kind!r} uses reserved field(s) {sorted(clash)}; "
                "rename them (seq, ts, kind and key are set by the ledger)"
            )
        seq = self._last_seq + 1
        entry: dict[str, Any] = {"seq": seq, "ts": time.time(), "kind": kind}
        if key is not None:
            entry["key"] = key
        entry.update(payload)
        try:
            line = json.dumps(entry, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise LedgerError(
                f"ledger payload for kind {kind!r} is not JSON-serialisable ({exc}); "
                "convert it to JSON types with finite numbers"
            ) from None
        if "\n" in line:  # cannot happen with json.dumps, but the format depends on it
            raise LedgerError("ledger line contains a raw newline")
        data = (line + "\n").encode("utf-8")
        try:
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)  # type: ignore[arg-type]
                view = view[written:]
            os.fsync(self._fd)  # type: ignore[arg-type]
        except BaseException as exc:  # disk full, EIO, KeyboardInterrupt between writes
            self._rollback()
            if isinstance(exc, OSError):
                raise LedgerError(
                    f"{self.path}: append of seq {seq} failed ({exc}); nothing was recorded"
                ) from None
            raise
        self._size += len(data)
        self._last_seq = seq
        if key is not None:
            self._keys[key] = seq
            self._kinds[seq] = kind
        return seq

    def _rollback(self) -> None:
        try:
            os.ftruncate(self._fd, self._size)  # type: ignore[arg-type]
            os.fsync(self._fd)  # type: ignore[arg-type]
        except OSError:
            pass  # the next open sees the torn tail and truncates it

    def _check_open(self) -> None:
        if self._fd is None:
            raise LedgerError(f"{self.path}: ledger is closed")


def _read_all(fd: int) -> bytes:
    chunks = []
    offset = 0
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)
