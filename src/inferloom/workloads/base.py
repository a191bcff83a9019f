"""The WorkloadAdapter Protocol: what every engine or server adapter provides.

Contract (every implementation is checked by ``tests/test_adapter_conformance.py``):

* ``describe()`` returns a JSON-serialisable dict naming the framework, model,
  device and the versions that matter; it never loads anything heavy twice.
* ``knob_space()`` returns every :class:`Knob` the adapter can change, with the
  stock value as ``default``. A configuration is a ``dict`` knob name -> value;
  :func:`resolve_config` fills the stock values in and validates.
* ``prepare(config)`` builds whatever one configuration needs (a model
  instance, a compiled graph, a server) and returns an opaque handle. It may
  raise :class:`AdapterError`; it never reports a performance number.
* ``run(handle, seed)`` performs one timed measurement over fresh prompts drawn
  from ``seed`` and returns a raw :class:`RunRecord`. A failure is data:
  ``success=False`` with ``error`` set, never an exception escaping to the
  caller (programming errors excepted).
* ``prompts(seed, n, length)`` draws the token-id prompts a run or a quality
  probe uses (random ids or the workload's texts), deterministically.
* ``greedy(handle, prompts, max_new_tokens)`` and ``score(handle, prompts,
  continuations)`` answer the quality contract's probes (see
  ``inferloom.measure.quality``).
* ``release(handle)`` frees one configuration; ``close()`` frees everything.

Adapters never decide keep / revert: only ``inferloom.measure.protocol`` does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Mapping, Protocol, Sequence, runtime_checkable

from inferloom.errors import EXIT_RUN_FAILED, InferloomError

__all__ = [
    "AdapterError",
    "ConfigError",
    "Knob",
    "RunRecord",
    "WorkloadAdapter",
    "resolve_config",
    "config_key",
]

Platform = Literal["cpu", "cuda", "rocm"]


class AdapterError(InferloomError, RuntimeError):
    """A configuration could not be prepared or run. ``kind`` classifies it."""

    exit_code = EXIT_RUN_FAILED
    hint = "Check the knob against `inferloom knobs`, or rerun with fewer changes to isolate it."

    def __init__(self, message: str, kind: str = "error") -> None:
        super().__init__(message)
        self.kind = kind


class ConfigError(InferloomError, ValueError):
    """A bad configuration (unknown knob, bad value, pinned knob changed): bad input."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class Knob:
    """One tunable setting, its domain, where it applies and whether it can
    change the model's numerics (then the quality contract must pass)."""

    name: str
    kind: Literal["choice", "int", "bool"]
    default: Any
    description: str
    choices: tuple[Any, ...] | None = None
    low: int | None = None
    high: int | None = None
    applies_to: frozenset[str] = frozenset({"cpu", "cuda"})
    changes_numerics: bool = False
    # Which phase may change it: FRAMEWORK (serving configuration) or KERNEL
    # (a kernel replacement, proposed only by the KERNEL phase's backend after
    # its correctness and microbenchmark gates).
    phase: Literal["FRAMEWORK", "KERNEL"] = "FRAMEWORK"

    def domain_text(self) -> str:
        if self.kind == "bool":
            return "true or false"
        if self.kind == "int":
            return f"an integer in [{self.low}, {self.high}]"
        return "one of " + ", ".join(str(c) for c in (self.choices or ()))

    def parse(self, text: str) -> Any:
        """Parse a CLI ``key=value`` string, then validate it."""
        if self.kind == "bool":
            low = text.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ConfigError(f"knob '{self.name}': got {text!r}, expected {self.domain_text()}")
        if self.kind == "int":
            try:
                return self.validate(int(text))
            except ValueError:
                raise ConfigError(
                    f"knob '{self.name}': got {text!r}, expected {self.domain_text()}"
                ) from None
        return self.validate(text)

    def validate(self, value: Any) -> Any:
        bad = ConfigError(f"knob '{self.name}': got {value!r}, expected {self.domain_text()}")
        if self.kind == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str):
                return self.parse(value)
            raise bad
        if self.kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad
            if (self.low is not None and value < self.low) or (
                self.high is not None and value > self.high
            ):
                raise bad
            return value
        if value not in (self.choices or ()):
            raise bad
        return value

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["applies_to"] = sorted(self.applies_to)
        d["choices"] = list(self.choices) if self.choices is not None else None
        return d


def resolve_config(
    knobs: Sequence[Knob],
    overrides: Mapping[str, Any],
    pinned: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Stock values, then ``pinned`` (which define stock), then ``overrides``.

    An unknown knob, a bad value, or an override of a pinned knob raises
    :class:`ConfigError` with a one-line message naming the knob.
    """
    by_name = {k.name: k for k in knobs}
    pinned = dict(pinned or {})
    cfg = {k.name: k.default for k in knobs}
    for source, values in (("pinned", pinned), ("candidate", overrides)):
        for key, value in values.items():
            if key not in by_name:
                raise ConfigError(
                    f"{source} setting '{key}': unknown knob, expected one of "
                    + ", ".join(sorted(by_name))
                )
            knob = by_name[key]
            parsed = knob.parse(value) if isinstance(value, str) else knob.validate(value)
            if source == "candidate" and key in pinned and parsed != cfg[key]:
                raise ConfigError(
                    f"candidate setting '{key}': pinned to {cfg[key]!r} by the spec; "
                    "no candidate may change it"
                )
            cfg[key] = parsed
    return cfg


def config_key(config: Mapping[str, Any]) -> str:
    """A stable, readable identity for a configuration."""
    return ",".join(f"{k}={config[k]}" for k in sorted(config))


@dataclass
class RunRecord:
    """Raw record of one timed run. Metrics are pure functions of these."""

    config_id: str
    seed: int
    success: bool
    started_at: float = 0.0  # unix time
    wall_s: float = 0.0  # the timed region, prefill + decode of every request
    num_requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    expected_output_tokens: int = 0
    batches: list[dict[str, Any]] = field(default_factory=list)  # size, wall_s, output_tokens
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RunRecord":
        return cls(**dict(d))


@runtime_checkable
class WorkloadAdapter(Protocol):
    name: str

    def describe(self) -> dict[str, Any]: ...

    def knob_space(self) -> list[Knob]: ...

    def prepare(self, config: Mapping[str, Any]) -> Any: ...

    def run(self, handle: Any, seed: int) -> RunRecord: ...

    def prompts(self, seed: int, n: int, length: int) -> list[list[int]]:
        """``n`` prompts of ``length`` token ids drawn from ``seed`` (the same
        seed always gives the same prompts)."""
        ...

    def greedy(
        self, handle: Any, prompts: list[list[int]], max_new_tokens: int
    ) -> list[list[int]]:
        """Greedy continuation of each prompt through the configuration's real
        generation path (its cache, compile mode, batching, speculation)."""
        ...

    def score(
        self, handle: Any, prompts: list[list[int]], continuations: list[list[int]]
    ) -> "Any":
        """Teacher-forced log-probabilities: a float32 CPU tensor of shape
        [n, T, V], row t being the distribution predicting continuations[i][t]
        given prompt + continuations[i][:t]. All continuations have length T."""
        ...

    def release(self, handle: Any) -> None: ...

    def close(self) -> None: ...
