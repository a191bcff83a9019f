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

Optional hooks: an adapter may also offer any of the small Protocols below
(:data:`OPTIONAL_HOOKS` lists them). Callers test for one with
``isinstance(adapter, Hook)``; without it, the generic behaviour its docstring names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Protocol, Sequence, runtime_checkable

from inferloom.errors import EXIT_RUN_FAILED, InferloomError
from inferloom.workloads.image_hooks import ImageOutputs  # the image generator's hook, listed here too
from inferloom.workloads.engine_hooks import BudgetedStarts, EnginePatches, EngineTables, SourceRungs  # server engines' hooks
from inferloom.workloads.quality_hooks import AAQuality, BatchedProbes  # the quality contract's hooks, too

__all__ = [
    "AdapterError", "ConfigError", "Knob", "RunRecord", "WorkloadAdapter", "resolve_config", "config_key",
    "ServerLogs", "RejectedFlags", "RecoveryOptions", "DeclaredProfile", "OwnQualityGate", "OwnObjective",
    "GreedyLogprobs", "ApproximateScores", "SourceTrees", "ServerReuse", "ImageOutputs", "BatchedProbes", "OPTIONAL_HOOKS",
    "CrossKnobRules", "ServerRuns", "AAQuality", "EnginePatches", "EngineTables", "SourceRungs", "BudgetedStarts"
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
    # its correctness and microbenchmark gates), PATCH (an engine source patch,
    # proposed only by FRAMEWORK's engine-patch step after the patch gates), or
    # ENABLEMENT (the enablement ladder's rungs 3-5 only).
    phase: Literal["FRAMEWORK", "KERNEL", "PATCH", "ENABLEMENT"] = "FRAMEWORK"

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


# ------------------------------------------------------------ optional hooks


@runtime_checkable
class ServerLogs(Protocol):
    """An adapter that runs a server keeps each server's log where the session says.

    ``set_log_dir(path, progress)``: later launches write their logs under
    ``path`` (a session's ``servers/``) and report slow start-ups through
    ``progress``. Without it, nothing is launched whose log the session keeps."""

    def set_log_dir(self, path: str | Path, progress: Callable[[str], None] | None = None) -> None: ...


@runtime_checkable
class RejectedFlags(Protocol):
    """Flags the installed server refused at launch, learned by the adapter.

    ``rejected_flags``: flag -> ``{knob, value, kind, whole_flag, ...}``, filled
    as launches fail; the session persists it in ``state.json`` (and writes a
    ledger entry per new flag) so that no proposal uses one again.
    ``restore_rejected_flags(learned)``: after a resume, a fresh adapter is
    given back what an earlier process learned (merged, never cleared)."""

    rejected_flags: dict[str, dict[str, Any]]

    def restore_rejected_flags(self, learned: Mapping[str, Mapping[str, Any]]) -> None: ...


@runtime_checkable
class RecoveryOptions(Protocol):
    """ENABLEMENT rung 2 from the adapter's own knowledge.

    ``recovery_options(kind, stock)``: configuration changes that may make a
    failing stock run, for the failure ``kind``, least invasive first (each a
    partial configuration over ``stock``). Without it the generic rules of
    :func:`inferloom.phases.enablement.recovery_options` apply."""

    def recovery_options(self, kind: str, stock: dict[str, Any]) -> list[dict[str, Any]]: ...


@runtime_checkable
class DeclaredProfile(Protocol):
    """An adapter that runs no operators declares its pretend profile.

    ``profile_categories(config)``: time shares per profile category
    (``{category: {"share": float}}``) for ``config``, or None when none was
    declared. Without it, the KERNEL phase profiles a real run."""

    def profile_categories(self, config: Mapping[str, Any]) -> dict[str, dict[str, float]] | None: ...


@runtime_checkable
class OwnQualityGate(Protocol):
    """The workload judges its own quality (a custom workload's gate).

    ``gate_quality(records)``: the verdict over a candidate's timed runs,
    fail-closed: ``{"evaluated", "passed", "failed": [why, ...], "rule", ...}``.
    With it, no stock references are captured and the token-level quality
    contract is not run."""

    def gate_quality(self, records: list[RunRecord]) -> dict[str, Any]: ...


@runtime_checkable
class OwnObjective(Protocol):
    """The workload supplies the protocol's metric.

    ``objective_metric(rec)``: one successful run's objective, higher is
    better (inverted by the adapter when its objective is lower-is-better);
    raises on a failed run. Without it, the spec's objective metric applies."""

    def objective_metric(self, rec: RunRecord) -> float: ...


@runtime_checkable
class GreedyLogprobs(Protocol):
    """The decode path's own log-probabilities, for the quality contract.

    ``greedy_logprobs(handle, prompts, max_new_tokens)``: greedy continuations
    plus the log-probabilities generation itself computed at each step
    (float32 CPU, [n, T, V]); stock's are compared with its teacher-forced
    ones to measure the rounding noise between its two paths. Without it, no
    path noise is measured and the declared tie margin is used as is."""

    def greedy_logprobs(self, handle: Any, prompts: list[list[int]], max_new_tokens: int) -> tuple[list[list[int]], Any]: ...


@runtime_checkable
class ApproximateScores(Protocol):
    """``score`` is an approximation (e.g. a server's top-k log-probabilities).

    ``score_approximation``: a sentence saying how, stated in every quality
    verdict's details."""

    score_approximation: str


@runtime_checkable
class SourceTrees(Protocol):
    """A workload whose code is a source tree the session patches (a custom workload).

    ``default_tree``: the tree a configuration without ``@tree`` runs in (the
    session sets it to its stack's tree). ``results_dir``: where entrypoints
    write their results (the session sets it outside every tree).
    ``protected``: the protected files' checksums
    (:class:`~inferloom.session.state_models.ProtectedFiles`) that every run
    verifies in its tree before it starts (the session sets them; None checks nothing)."""

    default_tree: Path | None
    results_dir: Path | None
    protected: Any


@runtime_checkable
class ServerReuse(Protocol):
    """An adapter whose configurations are servers that may outlive a comparison.

    ``reuse_servers(on, max_live)``: from then on a released handle stays alive
    and the next ``prepare`` of its configuration gets it back (at most
    ``max_live`` alive; one that died starts again). ``expect_servers(configs)``:
    the configurations the coming comparison needs (kept alive in preference
    to the others). ``take_server_starts()``:
    the starts since the last call (``startup_s``, ``reason``, ...), for the
    ledger. ``stop_idle()``: stop what is not lent out. Without it, every
    ``prepare`` builds anew and ``release`` frees at once."""

    def reuse_servers(self, on: bool = True, max_live: int = 2) -> None: ...

    def expect_servers(self, configs: Sequence[Mapping[str, Any]]) -> None: ...

    def take_server_starts(self) -> list[dict[str, Any]]: ...

    def stop_idle(self) -> list[str]: ...


@runtime_checkable
class ServerRuns(Protocol):
    """``server_runs(config)``: what the log of the server started for ``config`` said it runs where the knob's
    default says otherwise, ``{knob: {"value", "said"}}`` (``server_says``); None: none started. The session
    keeps stock's (``extra.stock_runs``); no proposal sets a knob to the value stock already runs."""

    def server_runs(self, config: Mapping[str, Any]) -> dict[str, dict[str, Any]] | None: ...


@runtime_checkable
class CrossKnobRules(Protocol):
    """The adapter's rules between knobs, known before anything runs (e.g. prompt_lookup needs
    micro_batch=1). ``config_refusal(config)``: None when the full configuration is allowed, else
    why not (what ``prepare`` would refuse, without building anything). The default orchestrator
    skips refused configurations, so none costs a trial; without the hook, ``prepare`` refuses them."""

    def config_refusal(self, config: Mapping[str, Any]) -> str | None: ...


OPTIONAL_HOOKS: tuple[type, ...] = (ServerLogs, RejectedFlags, RecoveryOptions, DeclaredProfile, OwnQualityGate,
                                    OwnObjective, GreedyLogprobs, ApproximateScores, SourceTrees, ServerReuse,
                                    CrossKnobRules, ServerRuns, ImageOutputs, BatchedProbes, AAQuality, EnginePatches, EngineTables, SourceRungs,
                                    BudgetedStarts)
