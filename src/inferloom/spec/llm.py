"""The spec's ``agents`` section: which agents a session asks.

Deterministic agents are the default (``agents.llm`` absent: nothing needs an
LLM). ``agents.llm`` turns on LLM-backed roles (docs/llm.md): the provider
(``anthropic``, or ``openai`` for any OpenAI-compatible endpoint given by
``base_url``: a vLLM or SGLang server, Ollama, LM Studio), the model, the name
of the environment variable that holds the key (never the key itself), the
per-session limits on tokens and cost, the timeout and retries of each call,
the temperature, and which roles use it. Every LLM output is validated and
then goes through the same gates as every other proposal.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from inferloom.spec.fields import _n, _Strict

__all__ = ["LLM_ROLES", "LLMSpec", "AgentsSpec", "default_key_env"]

#: the roles an LLM may play; each falls back to the deterministic agent when not listed
LLM_ROLES = ("orchestrator", "critic", "specialist", "kernel_author")

_KEY_ENV = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY"}


def default_key_env(provider: str) -> str:
    """The environment variable the provider's own SDK reads by default."""
    return _KEY_ENV[provider]


class LLMSpec(_Strict):
    provider: Literal["anthropic", "openai"] = Field(
        description="anthropic (Messages API, tool use) or openai (any OpenAI-compatible endpoint, JSON schema)")
    model: str = Field(min_length=1, max_length=200, description="the model name the endpoint serves")
    base_url: str | None = Field(None, max_length=2000,
                                 description="endpoint URL (default: the provider's); e.g. http://localhost:8000/v1")
    api_key_env: str | None = Field(
        None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=200,
        description="name of the environment variable holding the key (default ANTHROPIC_API_KEY / OPENAI_API_KEY)")
    roles: tuple[Literal["orchestrator", "critic", "specialist", "kernel_author"], ...] = Field(
        ("orchestrator", "critic"), min_length=1, description="the roles the LLM plays; the others stay deterministic")
    temperature: float | None = _n(None, 0.0, 2.0, "sampling temperature (default: the endpoint's; some models take none)")
    timeout_s: float = _n(60.0, 0.0, 3600.0, "seconds for one call (each retry gets its own)", gt=True)
    extra_body: dict[str, Any] = Field(
        default_factory=dict, description="extra JSON fields of every request (e.g. a vLLM server's chat_template)")
    max_retries: int = _n(3, 0, 10, "retries with backoff on 429, 5xx, timeouts and dropped connections")
    max_output_tokens: int = _n(2048, 16, 65536, "output tokens per call")
    max_total_tokens: int = _n(200_000, 1, 1_000_000_000, "input + output tokens per session (then stop llm_budget)")
    max_cost_usd: float | None = _n(None, 0.0, 100_000.0, "cost per session (then stop llm_budget); needs prices",
                                     gt=True)
    usd_per_mtok_input: float | None = _n(None, 0.0, 10_000.0, "declared price per million input tokens")
    usd_per_mtok_output: float | None = _n(None, 0.0, 10_000.0, "declared price per million output tokens")

    @field_validator("roles", mode="before")
    @classmethod
    def _split(cls, v: object) -> object:
        return tuple(x.strip() for x in v.split(",") if x.strip()) if isinstance(v, str) else v  # --llm-roles a,b

    @model_validator(mode="after")
    def _prices(self) -> "LLMSpec":
        if self.max_cost_usd is not None and (self.usd_per_mtok_input is None or self.usd_per_mtok_output is None):
            raise ValueError("max_cost_usd needs usd_per_mtok_input and usd_per_mtok_output (the declared prices "
                             "a call's cost is computed from)")
        if len(set(self.roles)) != len(self.roles):
            raise ValueError("roles: each role once")
        return self

    @property
    def key_env(self) -> str:
        return self.api_key_env or default_key_env(self.provider)


class AgentsSpec(_Strict):
    llm: LLMSpec | None = Field(None, description="LLM-backed roles (docs/llm.md); absent: deterministic agents only")
