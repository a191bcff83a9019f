"""A deterministic synthetic adapter: production code for fast tests and demos.

Contract (the :class:`~inferloom.workloads.base.WorkloadAdapter` Protocol, in
full, with no model, no device and no real sleeping):

* Throughput of a timed run is ``base_tps * prod(effects) * noise * drift``:
  ``effects[knob][value]`` is the TRUE relative multiplier of that knob value
  (missing values mean 1.0), ``noise = exp(noise_sd * z)`` is lognormal with
  ``z ~ N(0, 1)`` drawn from an RNG seeded by ``(adapter seed, handle id,
  prompt seed)``, and ``drift = exp(drift_per_run * k)`` for the adapter's
  ``k``-th run (default 0: no drift). ``wall_s`` is computed, never slept, and
  ``started_at`` is a virtual clock (seconds since the adapter was built), so
  the same calls always give the same records.
* ``greedy`` / ``score`` answer from pseudo-logits that are a deterministic
  function of the context (prompt plus tokens so far): ``logit_scale *
  N(0, 1)`` per vocabulary entry from an RNG seeded by a hash of the context,
  plus ``s * N(0, 1)`` where ``s`` is the configuration's numerics scale
  (``sqrt`` of the sum of squares of ``numerics[knob][value]``) and the
  perturbation is seeded by the context and the numerics-changing settings.
  So a configuration with scale 0 reproduces stock exactly, greedy agrees
  with ``score``'s argmax, and a large scale fails the quality contract.
* Failures are data: a knob value listed in ``fail_runs`` makes ``run``
  return ``success=False`` (``extra["kind"] = "synthetic"``); one listed in
  ``fail_prepare`` makes ``prepare`` raise :class:`AdapterError`; one listed
  in ``fail_quality`` makes ``greedy`` / ``score`` raise ``RuntimeError`` (a
  configuration whose timed runs work but whose quality probe crashes, like a
  forced CUDA attention kernel with no support for the padded probe's mask).
* ``profile`` (category -> share of a run, optional) is the profile the
  adapter declares for the KERNEL phase's target selection
  (:meth:`profile_categories`); it runs no operators, so there is nothing
  to profile for real.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from inferloom import __version__
from inferloom.workloads.base import AdapterError, Knob, RunRecord, config_key, resolve_config

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = [
    "DEFAULT_EFFECTS",
    "DEFAULT_NUMERICS",
    "SYNTHETIC_KNOBS",
    "SyntheticAdapter",
    "SyntheticHandle",
]

SYNTHETIC_KNOBS: tuple[Knob, ...] = (
    Knob("fast_path", "bool", False, "synthetic: a real speed-up with identical numerics"),
    Knob("useless", "bool", False, "synthetic: changes nothing at all"),
    Knob(
        "precision", "choice", "fp32", "synthetic: lower precision, faster, slightly different numerics",
        choices=("fp32", "bf16"), changes_numerics=True,
    ),
    Knob(
        "approx_math", "bool", False, "synthetic: fastest, but breaks the model's outputs",
        changes_numerics=True,
    ),
)

DEFAULT_EFFECTS: dict[str, dict[Any, float]] = {
    "fast_path": {True: 1.15},
    "precision": {"bf16": 1.25},
    "approx_math": {True: 1.40},
}

DEFAULT_NUMERICS: dict[str, dict[Any, float]] = {
    "precision": {"bf16": 0.005},  # passes the default quality contract
    "approx_math": {True: 1.5},  # fails it
}

# per-run lognormal noise sd (INFERLOOM_SYNTHETIC_NOISE overrides it for framework: synthetic)
_NOISE_SD = 0.05

_MASK = (1 << 64) - 1


def _h64(*parts: bytes) -> int:
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(len(p).to_bytes(4, "little"))
        h.update(p)
    return int.from_bytes(h.digest(), "little")


@dataclass
class SyntheticHandle:
    """One prepared configuration."""

    id: int
    config: dict[str, Any]
    config_id: str
    multiplier: float
    numerics_scale: float
    numerics_key: str
    released: bool = False
    runs: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _check_table(name: str, table: Mapping[str, Mapping[Any, Any]], knobs: Mapping[str, Knob]) -> dict[str, dict[Any, Any]]:
    out: dict[str, dict[Any, Any]] = {}
    for kname, per_value in table.items():
        if kname not in knobs:
            raise ValueError(f"{name}: unknown knob '{kname}', expected one of " + ", ".join(sorted(knobs)))
        out[kname] = {knobs[kname].validate(v): x for v, x in per_value.items()}
    return out


def _jsonable(table: Mapping[str, Mapping[Any, Any]]) -> dict[str, dict[str, Any]]:
    return {k: {str(v): x for v, x in vals.items()} for k, vals in table.items()}


class SyntheticAdapter:
    """Fake engine with known true effects (see the module docstring)."""

    name = "synthetic"
    special_ids: tuple[int, ...] = ()
    tokenizer: Any = None

    def __init__(
        self,
        effects: Mapping[str, Mapping[Any, float]] | None = None,
        *,
        noise_sd: float = _NOISE_SD,
        base_tps: float = 1000.0,
        seed: int = 0,
        numerics: Mapping[str, Mapping[Any, float]] | None = None,
        vocab_size: int = 64,
        logit_scale: float = 3.0,
        knobs: Sequence[Knob] | None = None,
        num_requests: int = 8,
        concurrency: int = 4,
        input_len: int = 16,
        output_len: int = 16,
        drift_per_run: float = 0.0,
        fail_runs: Mapping[str, Mapping[Any, str]] | None = None,
        fail_prepare: Mapping[str, Mapping[Any, str]] | None = None,
        fail_quality: Mapping[str, Mapping[Any, str]] | None = None,
        profile: Mapping[str, float] | None = None,
        delay_s: float = 0.0,
    ) -> None:
        if noise_sd < 0 or base_tps <= 0 or vocab_size < 2 or logit_scale <= 0:
            raise ValueError("SyntheticAdapter: need noise_sd >= 0, base_tps > 0, vocab_size >= 2, logit_scale > 0")
        if min(num_requests, concurrency, input_len, output_len) < 1:
            raise ValueError("SyntheticAdapter: num_requests, concurrency, input_len, output_len must be >= 1")
        self._knobs = list(knobs if knobs is not None else SYNTHETIC_KNOBS)
        by_name = {k.name: k for k in self._knobs}
        self.effects = _check_table("effects", DEFAULT_EFFECTS if effects is None else effects, by_name)
        self.numerics = _check_table("numerics", DEFAULT_NUMERICS if numerics is None else numerics, by_name)
        for kname, vals in self.effects.items():
            if any(not (x > 0 and math.isfinite(x)) for x in vals.values()):
                raise ValueError(f"effects['{kname}']: multipliers must be positive and finite")
        for kname, vals in self.numerics.items():
            if any(not (x >= 0 and math.isfinite(x)) for x in vals.values()):
                raise ValueError(f"numerics['{kname}']: scales must be >= 0 and finite")
        self.fail_runs = _check_table("fail_runs", fail_runs or {}, by_name)
        self.fail_prepare = _check_table("fail_prepare", fail_prepare or {}, by_name)
        self.fail_quality = _check_table("fail_quality", fail_quality or {}, by_name)
        if profile is not None and any(not 0.0 <= float(v) <= 1.0 for v in profile.values()):
            raise ValueError("SyntheticAdapter: profile shares must be in [0, 1]")
        self.profile = dict(profile) if profile is not None else None
        self.noise_sd = float(noise_sd)
        self.base_tps = float(base_tps)
        self.seed = int(seed)
        self.vocab_size = int(vocab_size)
        self.logit_scale = float(logit_scale)
        self.num_requests, self.concurrency = int(num_requests), int(concurrency)
        self.input_len, self.output_len = int(input_len), int(output_len)
        self.drift_per_run = float(drift_per_run)
        self.delay_s = float(delay_s)  # real sleep per run, for crash/resume tests
        self._ids = itertools.count(1)
        self._handles: dict[int, SyntheticHandle] = {}
        self._clock = 0.0
        self._total_runs = 0

    # -- description and configuration ------------------------------------------------

    def describe(self) -> dict[str, Any]:
        return {
            "framework": "synthetic",
            "model": f"synthetic-v{self.vocab_size}",
            "device": "cpu",
            "versions": {"inferloom": __version__},
            "seed": self.seed,
            "base_tps": self.base_tps,
            "noise_sd": self.noise_sd,
            "drift_per_run": self.drift_per_run,
            "effects": _jsonable(self.effects),
            "numerics": _jsonable(self.numerics),
            "traffic": {"num_requests": self.num_requests, "concurrency": self.concurrency,
                        "input_len": self.input_len, "output_len": self.output_len},
        }

    def knob_space(self) -> list[Knob]:
        return list(self._knobs)

    def true_multiplier(self, config: Mapping[str, Any]) -> float:
        """The configuration's true throughput multiplier over stock (for tests)."""
        cfg = resolve_config(self._knobs, config)
        return math.prod(self.effects.get(k, {}).get(v, 1.0) for k, v in cfg.items())

    def numerics_scale(self, config: Mapping[str, Any]) -> float:
        """The configuration's logit perturbation scale (0: identical to stock)."""
        cfg = resolve_config(self._knobs, config)
        return math.sqrt(sum(self.numerics.get(k, {}).get(v, 0.0) ** 2 for k, v in cfg.items()))

    def prepare(self, config: Mapping[str, Any]) -> SyntheticHandle:
        cfg = resolve_config(self._knobs, config)
        for k, v in cfg.items():
            msg = self.fail_prepare.get(k, {}).get(v)
            if msg is not None:
                raise AdapterError(f"prepare {k}={v}: {msg}", kind="synthetic")
        num_key = config_key({k: v for k, v in cfg.items() if self.numerics.get(k, {}).get(v, 0.0) > 0})
        h = SyntheticHandle(
            id=next(self._ids), config=cfg, config_id=config_key(cfg),
            multiplier=self.true_multiplier(cfg), numerics_scale=self.numerics_scale(cfg),
            numerics_key=num_key,
        )
        self._handles[h.id] = h
        return h

    def _live(self, handle: SyntheticHandle) -> SyntheticHandle:
        if not isinstance(handle, SyntheticHandle) or handle.released or handle.id not in self._handles:
            raise ValueError("SyntheticAdapter: not a live handle of this adapter (released or foreign)")
        return handle

    # -- timed runs -------------------------------------------------------------------

    def run(self, handle: SyntheticHandle, seed: int) -> RunRecord:
        h = self._live(handle)
        started = self._clock
        for k, v in h.config.items():
            msg = self.fail_runs.get(k, {}).get(v)
            if msg is not None:
                return RunRecord(config_id=h.config_id, seed=seed, success=False, started_at=started,
                                 num_requests=self.num_requests, error=f"{k}={v}: {msg}",
                                 extra={"kind": "synthetic", "handle_id": h.id})
        if self.delay_s > 0:
            time.sleep(self.delay_s)
        ss = np.random.SeedSequence([self.seed & _MASK, h.id, int(seed) & _MASK])
        z = float(np.random.default_rng(ss).standard_normal())
        drift = math.exp(self.drift_per_run * self._total_runs)
        tps = self.base_tps * h.multiplier * math.exp(self.noise_sd * z) * drift
        out_tokens = self.num_requests * self.output_len
        wall = out_tokens / tps
        batches = []
        for start in range(0, self.num_requests, self.concurrency):
            size = min(self.concurrency, self.num_requests - start)
            batches.append({"size": size, "wall_s": wall * size / self.num_requests,
                            "output_tokens": size * self.output_len})
        self._clock += wall
        self._total_runs += 1
        h.runs += 1
        return RunRecord(
            config_id=h.config_id, seed=seed, success=True, started_at=started, wall_s=wall,
            num_requests=self.num_requests, input_tokens=self.num_requests * self.input_len,
            output_tokens=out_tokens, expected_output_tokens=out_tokens, batches=batches,
            extra={"synthetic": True, "handle_id": h.id, "true_tps": self.base_tps * h.multiplier,
                   "noise_z": z, "virtual_clock": True},
        )

    # -- quality probes ---------------------------------------------------------------

    def prompts(self, seed: int, n: int, length: int) -> list[list[int]]:
        rng = np.random.default_rng([self.seed & _MASK, int(seed) & _MASK])
        return rng.integers(0, self.vocab_size, size=(n, length)).tolist()

    def profile_categories(self, config: Mapping[str, Any]) -> dict[str, dict[str, float]] | None:
        """The declared profile (the same for every configuration), shaped like a
        real profile's ``categories``; None when none was declared."""
        if self.profile is None:
            return None
        return {k: {"share": float(v)} for k, v in self.profile.items()}

    def _check_probe(self, h: SyntheticHandle) -> None:
        for k, v in h.config.items():
            msg = self.fail_quality.get(k, {}).get(v)
            if msg is not None:
                raise RuntimeError(f"{k}={v}: {msg}")

    def _logits(self, h: SyntheticHandle, context: Sequence[int]) -> np.ndarray:
        ctx = np.asarray(context, dtype=np.int64)
        if ctx.size and (ctx.min() < 0 or ctx.max() >= self.vocab_size):
            raise ValueError(f"token ids must be in [0, {self.vocab_size})")
        ctx_hash = _h64(b"ctx", ctx.tobytes())
        base = np.random.default_rng([self.seed & _MASK, ctx_hash]).standard_normal(self.vocab_size)
        logits = self.logit_scale * base
        if h.numerics_scale > 0:
            p_hash = _h64(b"num", h.numerics_key.encode(), ctx.tobytes())
            eps = np.random.default_rng([self.seed & _MASK, p_hash]).standard_normal(self.vocab_size)
            logits = logits + h.numerics_scale * eps
        return logits

    def greedy(self, handle: SyntheticHandle, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
        """The ``max_new_tokens`` greedily generated tokens of each prompt (prompt excluded)."""
        h = self._live(handle)
        self._check_probe(h)
        out = []
        for prompt in prompts:
            ctx = list(prompt)
            new: list[int] = []
            for _ in range(max_new_tokens):
                tok = int(np.argmax(self._logits(h, ctx)))
                new.append(tok)
                ctx.append(tok)
            out.append(new)
        return out

    def score(self, handle: SyntheticHandle, prompts: list[list[int]], continuations: list[list[int]]) -> Any:
        """Teacher-forced log-softmax, float32 CPU tensor [n, T, V]."""
        import torch

        h = self._live(handle)
        self._check_probe(h)
        if len(prompts) != len(continuations):
            raise ValueError(f"{len(prompts)} prompts but {len(continuations)} continuations")
        lengths = {len(c) for c in continuations}
        if len(lengths) > 1:
            raise ValueError(f"continuations must share one length, got {sorted(lengths)}")
        t_len = lengths.pop() if lengths else 0
        if any(not 0 <= int(tok) < self.vocab_size for c in continuations for tok in c):
            raise ValueError(f"token ids must be in [0, {self.vocab_size})")
        out = np.empty((len(prompts), t_len, self.vocab_size), dtype=np.float64)
        for i, (prompt, cont) in enumerate(zip(prompts, continuations)):
            ctx = list(prompt)
            for t in range(t_len):
                z = self._logits(h, ctx)
                z = z - z.max()
                out[i, t] = z - math.log(float(np.exp(z).sum()))
                ctx.append(int(cont[t]))
        return torch.from_numpy(out.astype(np.float32))

    # -- lifetime ---------------------------------------------------------------------

    def release(self, handle: SyntheticHandle) -> None:
        if isinstance(handle, SyntheticHandle):
            handle.released = True
            self._handles.pop(handle.id, None)

    def close(self) -> None:
        for h in list(self._handles.values()):
            self.release(h)


def from_spec(spec: WorkloadSpec) -> SyntheticAdapter:
    """The adapter behind ``framework: synthetic`` (tests and demos of the
    coordinator; its numbers are synthetic, and its describe() says so).
    Environment: INFERLOOM_SYNTHETIC_NOISE (per-run sd, default 0.05) and
    INFERLOOM_SYNTHETIC_DELAY_S (real sleep per run, default 0)."""
    import os

    t = spec.traffic
    return SyntheticAdapter(
        seed=spec.seed, noise_sd=float(os.environ.get("INFERLOOM_SYNTHETIC_NOISE", _NOISE_SD)),
        delay_s=float(os.environ.get("INFERLOOM_SYNTHETIC_DELAY_S", "0")),
        num_requests=spec.requests_per_run, concurrency=t.concurrency, input_len=t.input_len, output_len=t.output_len,
    )
