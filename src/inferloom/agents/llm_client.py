"""LLM clients over the official ``anthropic`` and ``openai`` SDKs.

:class:`LLMClient.ask` sends one request for one role and returns a pydantic
model instance or raises :class:`~inferloom.agents.llm_record.LLMRefusal`
with a named rule:

* structured output: Anthropic by a forced tool call whose ``input_schema`` is
  the pydantic model's JSON schema; OpenAI-compatible endpoints by
  ``response_format`` ``json_schema``. The reply is validated by pydantic; an
  invalid one gets ONE repair attempt (the validation error sent back), then
  ``llm_schema_invalid``.
* retries with exponential backoff on 429, 5xx, timeouts and dropped
  connections are the SDKs' own (``max_retries``; they honour Retry-After);
  each attempt has the spec's ``timeout_s``. What still fails is
  ``llm_timeout``, ``llm_http_error`` (with the status) or ``llm_transport``.
* the session's limits (``max_total_tokens``, ``max_cost_usd``) are checked
  before every call: past them, ``llm_budget`` (and the coordinator stops the
  search with that stop reason: :meth:`LLMClient.budget_reason`).
* every call (its tokens, latency and declared-price cost) is one line of the
  session's transcript (:class:`~inferloom.agents.llm_record.Transcript`) and
  is returned to the role, which puts it in its ledger entry.

The SDKs are optional (``pip install inferloom[llm]``): without them,
inferloom runs with its deterministic agents, and a spec that asks for an LLM
is refused with ``llm_sdk_missing`` on the first call.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Mapping, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ValidationError

from inferloom.agents.llm_record import LLMRefusal, Reply, Transcript, request_digest, usage_totals

try:  # optional: the `llm` extra
    import anthropic
except ImportError:  # pragma: no cover - exercised where the extra is not installed
    anthropic = None  # type: ignore[assignment]
try:
    import openai
except ImportError:  # pragma: no cover
    openai = None  # type: ignore[assignment]

__all__ = ["Transport", "AnthropicTransport", "OpenAITransport", "LLMClient", "make_transport"]

M = TypeVar("M", bound=BaseModel)


@runtime_checkable
class Transport(Protocol):
    """Sends one request and returns the reply's JSON text and usage; raises
    :class:`LLMRefusal` (a named rule) when it gets no reply."""

    name: str

    def send(self, role: str, system: str, messages: list[dict[str, Any]], schema: Mapping[str, Any],
             schema_name: str, max_tokens: int) -> Reply: ...


def _sdk_error(exc: Exception, sdk: Any, what: str) -> LLMRefusal:
    if isinstance(exc, sdk.APITimeoutError):
        return LLMRefusal("llm_timeout", f"{what}: no reply within the timeout after the retries ({exc})")
    if isinstance(exc, sdk.APIStatusError):
        return LLMRefusal("llm_http_error", f"{what}: HTTP {exc.status_code} after the retries: {str(exc)[:300]}")
    if isinstance(exc, sdk.APIConnectionError):
        return LLMRefusal("llm_transport", f"{what}: could not connect ({exc}); check base_url")
    return LLMRefusal("llm_transport", f"{what}: {type(exc).__name__}: {str(exc)[:300]}")


class AnthropicTransport:
    """The Messages API with one forced tool whose input schema is the answer's."""

    name = "anthropic"

    def __init__(self, model: str, api_key: str, *, base_url: str | None, timeout_s: float, max_retries: int,
                 temperature: float | None, extra_body: Mapping[str, Any] | None = None) -> None:
        if anthropic is None:
            raise LLMRefusal("llm_sdk_missing", "the anthropic SDK is not installed: pip install 'inferloom[llm]'")
        self.model = model
        # sent as extra JSON (the SDKs differ on sampling parameters); None: nothing extra
        self.sampling = {**(extra_body or {}), **({"temperature": temperature} if temperature is not None else {})} or None
        self.client = anthropic.Anthropic(api_key=api_key, base_url=base_url, timeout=timeout_s,
                                          max_retries=max_retries)

    def send(self, role: str, system: str, messages: list[dict[str, Any]], schema: Mapping[str, Any],
             schema_name: str, max_tokens: int) -> Reply:
        try:
            msg = self.client.messages.create(
                model=self.model, max_tokens=max_tokens, system=system, extra_body=self.sampling,
                messages=messages, tools=[{"name": schema_name, "description": f"the {role}'s answer",
                                           "input_schema": dict(schema)}],
                tool_choice={"type": "tool", "name": schema_name})
        except anthropic.AnthropicError as exc:
            raise _sdk_error(exc, anthropic, f"{self.model} ({role})") from None
        tool = [b for b in msg.content if getattr(b, "type", None) == "tool_use"]
        text = json.dumps(tool[0].input) if tool else "".join(getattr(b, "text", "") for b in msg.content)
        u = msg.usage
        return Reply(text, int(u.input_tokens or 0), int(u.output_tokens or 0), msg.stop_reason)


class OpenAITransport:
    """Chat Completions with ``response_format`` json_schema (any OpenAI-compatible server)."""

    name = "openai"

    def __init__(self, model: str, api_key: str, *, base_url: str | None, timeout_s: float, max_retries: int,
                 temperature: float | None, extra_body: Mapping[str, Any] | None = None) -> None:
        if openai is None:
            raise LLMRefusal("llm_sdk_missing", "the openai SDK is not installed: pip install 'inferloom[llm]'")
        self.model = model
        # sent as extra JSON (the SDKs differ on sampling parameters); None: nothing extra
        self.sampling = {**(extra_body or {}), **({"temperature": temperature} if temperature is not None else {})} or None
        self.client = openai.OpenAI(api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=max_retries)

    def send(self, role: str, system: str, messages: list[dict[str, Any]], schema: Mapping[str, Any],
             schema_name: str, max_tokens: int) -> Reply:
        try:
            resp = self.client.chat.completions.create(
                model=self.model, max_tokens=max_tokens, extra_body=self.sampling,
                messages=[{"role": "system", "content": system}, *messages],
                response_format={"type": "json_schema", "json_schema": {"name": schema_name, "schema": dict(schema)}})
        except openai.OpenAIError as exc:
            raise _sdk_error(exc, openai, f"{self.model} ({role})") from None
        choice = resp.choices[0] if resp.choices else None
        text = (choice.message.content or "") if choice is not None else ""
        u = resp.usage
        return Reply(text, int(getattr(u, "prompt_tokens", 0) or 0), int(getattr(u, "completion_tokens", 0) or 0),
                     choice.finish_reason if choice is not None else None)


def make_transport(llm: Any, environ: Mapping[str, str] = os.environ) -> Transport:
    """The transport ``llm`` (an :class:`~inferloom.spec.llm.LLMSpec`) names, its key read from ``llm.key_env``."""
    key = environ.get(llm.key_env)
    if not key:
        raise LLMRefusal("llm_no_key", f"${llm.key_env} is not set; export the API key there (or set "
                         "agents.llm.api_key_env to the variable that holds it)")
    cls = AnthropicTransport if llm.provider == "anthropic" else OpenAITransport
    return cls(llm.model, key, base_url=llm.base_url, timeout_s=llm.timeout_s, max_retries=llm.max_retries,
               temperature=llm.temperature, extra_body=llm.extra_body)


class LLMClient:
    """One session's LLM: a transport, the spec's limits and the transcript (see the module docstring).

    ``transport`` may be a :class:`Transport` or a refusal raised while making
    one (no key, no SDK): then every call is refused with that rule."""

    def __init__(self, llm: Any, transport: "Transport | LLMRefusal", directory: str | os.PathLike[str], *,
                 replayed_from: str | None = None) -> None:
        self.llm, self.transport, self.replayed_from = llm, transport, replayed_from
        self.transcript = Transcript(directory)

    def totals(self) -> dict[str, Any]:
        return usage_totals(self.transcript.records)

    def budget_reason(self) -> str | None:
        """``llm_budget: ...`` once the session's token or cost limit is reached, else None."""
        t = self.totals()
        used = t["input_tokens"] + t["output_tokens"]
        if used >= self.llm.max_total_tokens:
            return f"llm_budget: {used} of {self.llm.max_total_tokens} LLM tokens used (agents.llm.max_total_tokens)"
        cost, cap = t["cost_usd"], self.llm.max_cost_usd
        if cap is not None and cost is not None and cost >= cap:
            return f"llm_budget: ${cost:.4f} of ${cap:g} spent on LLM calls (agents.llm.max_cost_usd)"
        return None

    def _cost(self, reply: Reply) -> float | None:
        pi, po = self.llm.usd_per_mtok_input, self.llm.usd_per_mtok_output
        if pi is None or po is None:
            return None
        return (reply.input_tokens * pi + reply.output_tokens * po) / 1e6

    def _call(self, role: str, system: str, messages: list[dict[str, Any]], model: type[BaseModel],
              attempt: int, calls: list[dict[str, Any]]) -> Reply:
        base = {"role": role, "attempt": attempt, "provider": self.llm.provider, "model": self.llm.model,
                "schema": model.__name__, "request_digest": request_digest(system, messages, model.__name__),
                "replayed_from": self.replayed_from}
        t0 = time.perf_counter()
        try:
            if isinstance(self.transport, LLMRefusal):
                raise LLMRefusal(self.transport.rule, self.transport.why)
            reply = self.transport.send(role, system, messages, model.model_json_schema(), model.__name__,
                                        self.llm.max_output_tokens)
        except LLMRefusal as exc:
            rec = self.transcript.append({**base, "system": system, "messages": messages, "reply": None,
                                          "error": {"rule": exc.rule, "why": exc.why},
                                          "latency_s": time.perf_counter() - t0, "input_tokens": 0,
                                          "output_tokens": 0, "cost_usd": None})
            calls.append(_ledger_view(rec))
            raise LLMRefusal(exc.rule, exc.why, calls) from None
        rec = self.transcript.append({**base, "system": system, "messages": messages, "reply": reply.text,
                                      "error": None, "stop_reason": reply.stop_reason,
                                      "latency_s": time.perf_counter() - t0, "input_tokens": reply.input_tokens,
                                      "output_tokens": reply.output_tokens, "cost_usd": self._cost(reply)})
        calls.append(_ledger_view(rec))
        return reply

    def ask(self, role: str, system: str, user: str, model: type[M]) -> tuple[M, list[dict[str, Any]]]:
        """The validated answer and the calls it took (for the ledger); :class:`LLMRefusal` otherwise."""
        calls: list[dict[str, Any]] = []
        reason = self.budget_reason()
        if reason:
            raise LLMRefusal("llm_budget", reason, calls)
        messages: list[dict[str, Any]] = [{"role": "user", "content": user}]
        reply = self._call(role, system, messages, model, 1, calls)
        try:
            return model.model_validate_json(reply.text or "null"), calls
        except ValidationError as exc:
            first = _short(exc)
        if self.budget_reason():
            raise LLMRefusal("llm_budget", f"{self.budget_reason()}; no repair attempt for: {first}", calls)
        messages += [{"role": "assistant", "content": reply.text or "(empty)"},
                     {"role": "user", "content": f"That answer is not valid: {first}. Answer again with only a JSON "
                      f"object that matches the {model.__name__} schema."}]
        reply = self._call(role, system, messages, model, 2, calls)
        try:
            return model.model_validate_json(reply.text or "null"), calls
        except ValidationError as exc:
            raise LLMRefusal("llm_schema_invalid", f"{role}: invalid after one repair attempt: {_short(exc)} "
                             f"(first: {first})", calls) from None


def _short(exc: ValidationError) -> str:
    e = exc.errors()[0]
    loc = ".".join(str(x) for x in e["loc"]) or "(root)"
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"{loc}: {e['msg']}{more}"[:400]


def _ledger_view(rec: Mapping[str, Any]) -> dict[str, Any]:
    """What the ledger keeps of a call (the transcript keeps the text)."""
    keys = ("n", "role", "attempt", "model", "input_tokens", "output_tokens", "latency_s", "cost_usd", "error")
    return {k: rec.get(k) for k in keys}
