"""Record and replay of LLM exchanges.

Every call an LLM-backed agent makes is one line of
``SESSION_DIR/llm/exchanges.jsonl`` (append-only, fsync'd, secrets redacted,
never the key): the role, the attempt (1, or 2 for the repair), the request
(system prompt, messages, schema name), the reply text or the named error,
tokens, latency and the cost computed from the declared prices. The file is
the source of truth for the session's LLM usage: a resumed session counts the
tokens and cost already spent from it.

:class:`ReplayTransport` answers a new session's calls with a recorded
session's replies (``optimize --llm-replay SESSION_DIR``): per role, in the
order they were recorded, a recorded error replayed as the same error; no
network, no key. When a role's recorded replies run out the call is refused
(``llm_replay_exhausted``).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from inferloom.inputs import InputError, load_json
from inferloom.redact import redact

__all__ = ["EXCHANGES", "LLMRefusal", "Reply", "Transcript", "ReplayTransport", "read_exchanges", "usage_totals",
           "request_digest"]

EXCHANGES = Path("llm") / "exchanges.jsonl"


class LLMRefusal(Exception):
    """An LLM call that gave nothing usable, with the rule that names why
    (``llm_timeout``, ``llm_http_error``, ``llm_transport``, ``llm_schema_invalid``,
    ``llm_budget``, ``llm_no_key``, ``llm_sdk_missing``, ``llm_replay_exhausted``). Control flow, not an
    InferloomError: the LLM roles always catch it and hand the coordinator a refusal under its rule
    (:class:`~inferloom.agents.llm_setup.LLMSetupError` is what a user sees before a session starts)."""

    def __init__(self, rule: str, why: str, calls: list[dict[str, Any]] | None = None) -> None:
        super().__init__(f"{rule}: {why}")
        self.rule, self.why = rule, why
        self.calls: list[dict[str, Any]] = list(calls or [])


@dataclass(frozen=True)
class Reply:
    """What one call returned: the JSON text (tool input or message content) and its usage."""

    text: str
    input_tokens: int
    output_tokens: int
    stop_reason: str | None = None


def request_digest(system: str, messages: list[dict[str, Any]], schema_name: str) -> str:
    blob = json.dumps({"system": system, "messages": messages, "schema": schema_name}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def read_exchanges(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The exchanges recorded in ``directory`` (a session directory); [] when there are none.
    A line that is not a JSON object is an error naming the file and line."""
    path = Path(directory) / EXCHANGES
    if not path.is_file():
        return []
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = load_json(line.encode())
        except InputError as exc:
            raise ValueError(f"{path} line {n}: {exc}; the transcript was damaged") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{path} line {n}: expected a JSON object; the transcript was damaged")
        out.append(obj)
    return out


def usage_totals(exchanges: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Calls, tokens, latency and cost summed over ``exchanges`` (cost None when no call was priced)."""
    costs = [float(e["cost_usd"]) for e in exchanges if isinstance(e.get("cost_usd"), (int, float))]
    return {"calls": len(exchanges),
            "input_tokens": sum(int(e.get("input_tokens") or 0) for e in exchanges),
            "output_tokens": sum(int(e.get("output_tokens") or 0) for e in exchanges),
            "latency_s": sum(float(e.get("latency_s") or 0.0) for e in exchanges),
            "cost_usd": sum(costs) if costs else None,
            "errors": sum(1 for e in exchanges if e.get("error"))}


class Transcript:
    """Appends exchanges to ``directory/llm/exchanges.jsonl`` (one line each, fsync'd)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.path = Path(directory) / EXCHANGES
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.records = read_exchanges(directory)

    def append(self, record: Mapping[str, Any]) -> dict[str, Any]:
        rec = redact({"n": len(self.records) + 1, "ts": time.time(), **dict(record)})
        line = json.dumps(rec, sort_keys=True, allow_nan=False) + "\n"
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        self.records.append(rec)
        return rec


class ReplayTransport:
    """Plays back a recorded session's exchanges (see the module docstring)."""

    name = "replay"

    def __init__(self, source: str | os.PathLike[str], skip: Mapping[str, int] | None = None) -> None:
        """``skip``: replies per role already used (a resumed replay session's own transcript counts them)."""
        self.source = Path(source)
        recs = read_exchanges(self.source)
        if not recs:
            raise ValueError(f"--llm-replay {self.source}: no recorded LLM exchanges there ({self.source / EXCHANGES} "
                             "is missing or empty); name a session directory that ran with agents.llm")
        self.queues: dict[str, deque[dict[str, Any]]] = defaultdict(deque)
        for r in recs:
            self.queues[str(r.get("role"))].append(r)
        for role, n in (skip or {}).items():
            for _ in range(min(n, len(self.queues[role]))):
                self.queues[role].popleft()

    def send(self, role: str, system: str, messages: list[dict[str, Any]], schema: Mapping[str, Any],
             schema_name: str, max_tokens: int) -> Reply:
        q = self.queues.get(role)
        if not q:
            raise LLMRefusal("llm_replay_exhausted", f"the recorded session {self.source} has no more {role} replies")
        r = q.popleft()
        err = r.get("error")
        if isinstance(err, Mapping):
            raise LLMRefusal(str(err.get("rule")), f"(replayed) {err.get('why')}")
        return Reply(text=str(r.get("reply") or ""), input_tokens=int(r.get("input_tokens") or 0),
                     output_tokens=int(r.get("output_tokens") or 0), stop_reason=r.get("stop_reason"))
