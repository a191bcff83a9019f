"""The closed sessions an engine choice compares, read from their files alone, and the rules that refuse a pair
that is not one workload on one machine and day.

:func:`read_session` reads one closed session directory (``state.json``, ``ledger.jsonl``, ``manifest.json``)
into an :class:`EngineSession`: its framework, spec, final stack, the stock median and the CLOSE comparison (from
the ledger, :func:`inferloom.report.breakdown.breakdown_from_ledger`), the roofline fractions and the final stack's
precision. :func:`workload_difference` and :func:`machine_difference` are pure: the first field that differs
between two sessions, said in words, or None. :func:`check_comparable` raises :class:`EngineChoiceError` (one line,
exit 2) naming it, before anything is measured or written. :func:`measured_apart` compares the machine the pairs
are about to run on (:func:`here_identity`) with the sessions': another kind of device is refused (the ratio would
be about other hardware); another host or day is said in the report (the sessions' own columns are theirs, the
ratio is the pairs').
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from inferloom.errors import InferloomError
from inferloom.frameworks import framework
from inferloom.report.breakdown import breakdown_from_ledger
from inferloom.session import ledger as L
from inferloom.session.apart import DEVICE, here_identity, identity, machine_apart
from inferloom.session.apart import env_apart as _env_apart
from inferloom.session.shape import SHAPE_ERRORS, damaged_session
from inferloom.session.manifest import manifest_spec, read_manifest
from inferloom.session.state import Phase, load_state
from inferloom.spec import WorkloadSpec
from inferloom.workloads.registry import stack_precision

__all__ = ["EngineChoiceError", "EngineSession", "read_session", "workload_identity", "machine_identity",
           "workload_difference", "machine_difference", "check_count", "check_comparable", "precision_label",
           "here_identity", "measured_apart", "env_apart"]


class EngineChoiceError(InferloomError, ValueError):
    """The sessions can't be compared as one engine choice (what, why, what to do): exit 2, nothing written."""


@dataclass
class EngineSession:
    """One closed session as the engine choice sees it (every number read from its own files)."""

    directory: Path
    session_id: str
    framework: str
    spec: WorkloadSpec
    manifest: dict[str, Any]
    stock_config: dict[str, Any]
    final_config: dict[str, Any]
    breakdown: dict[str, Any]
    roofline_stock: float | None
    roofline_final: float | None
    precision: str
    noise: dict[str, Any] | None = None  # the PRELUDE A/A's noise block (protocol.noise_floor)
    noise_floor: dict[str, Any] | None = None  # state.json's noise_floor (its "quality": the A/A quality floor)

    @property
    def name(self) -> str:
        """How tables name it: the framework and the session directory's name."""
        return f"{self.framework} ({self.directory.name})"

    @property
    def changes(self) -> dict[str, Any]:
        """The final stack's changes from its stock."""
        return {k: v for k, v in self.final_config.items() if self.stock_config.get(k) != v}

    def row(self) -> dict[str, Any]:
        """The side-by-side table's row: what the session itself measured (each number cites its ledger seq)."""
        b = self.breakdown
        stock, final = b.get("stock") or {}, b.get("final") or {}
        kept = bool(final.get("ledger_seq"))
        return {"session": str(self.directory), "session_id": self.session_id, "framework": self.framework,
                "stock_median": stock.get("objective_median"), "stock_seq": stock.get("ledger_seq"),
                "final_changes": self.changes, "final_median": final.get("objective_median") if kept else None,
                "final_ratio": final.get("ratio") if kept else 1.0,
                "final_ci": [final.get("ci_low"), final.get("ci_high")] if kept else None,
                "final_pairs": final.get("n_pairs"), "final_verdict": final.get("protocol_verdict"),
                "final_seq": final.get("ledger_seq"), "quality_passed": final.get("quality_passed") if kept else None,
                "quality_failed": final.get("quality_failed") or [],
                "roofline_stock": self.roofline_stock, "roofline_final": self.roofline_final if kept else
                self.roofline_stock, "precision": self.precision, "stop_reason": b.get("stop_reason")}

    def expected_median(self) -> float:
        """The final stack's median in its own session (stock's when nothing was kept): which engine the session
        data expect to be faster; the cross-engine measurement tests it."""
        r = self.row()
        return float(r["final_median"] or r["stock_median"] or 0.0)


def precision_label(fw_name: str, config: Mapping[str, Any], model_dtype: str) -> str:
    """At which precision ``config`` runs: the framework's own ``stack_precision`` (weights, KV cache,
    activations) where it names one, else the configuration's ``dtype`` (the model's when it has none)."""
    prec = stack_precision(framework(fw_name), config, model_dtype)
    if prec is not None:
        return str(prec["label"])
    dtype = config.get("dtype", model_dtype)
    return f"{dtype} weights and activations"


def read_session(directory: str | Path) -> EngineSession:
    """One closed session; :class:`EngineChoiceError` (one line) when it is not a closed session that measured
    stock. A damaged file raises its own one-line error (ManifestError, StateError, LedgerError)."""
    d = Path(directory).absolute()
    if not d.is_dir():
        raise EngineChoiceError(f"{directory}: not a directory; give the session directories that "
                                "`inferloom optimize --out DIR` (or a fleet's sessions/NAME) wrote")
    manifest = read_manifest(d)
    spec = manifest_spec(d, manifest)
    st = load_state(d)
    if st.phase != Phase.DONE:
        raise EngineChoiceError(f"{directory}: session {st.session_id} is not closed (phase {st.phase.value}); "
                                f"finish it first (`inferloom resume {directory}`)")
    try:
        b = breakdown_from_ledger(L.read_entries(d))
    except SHAPE_ERRORS as exc:
        raise damaged_session(d, exc) from None
    if not (b.get("stock") or {}).get("objective_median"):
        raise EngineChoiceError(f"{directory}: session {st.session_id} never measured stock "
                                f"({(b.get('stock_never_ran') or {}).get('why') or 'no stock measurement'}); "
                                "it has nothing to compare")
    fw = framework(spec.framework)
    if fw.own_code or fw.image:
        raise EngineChoiceError(f"{directory}: framework {spec.framework} is not a text-generation serving engine; "
                                "an engine choice compares vllm, sglang and transformers sessions")
    rs, rf = st.extra.roofline_stock, st.extra.roofline_final
    return EngineSession(directory=d, session_id=st.session_id, framework=spec.framework, spec=spec,
                         manifest=manifest, stock_config=dict(st.stock_config), final_config=dict(st.stack),
                         breakdown=b, roofline_stock=rs.fraction if rs else None,
                         roofline_final=rf.fraction if rf else None,
                         precision=precision_label(spec.framework, st.stack, spec.dtype),
                         noise=(b.get("stock") or {}).get("noise"), noise_floor=st.noise_floor)


def _model(s: EngineSession) -> Any:
    m = (s.manifest.get("pins") or {}).get("model") or {}
    files = m.get("files") if isinstance(m, dict) else None
    if files:  # the same files by content, wherever each session found them
        return sorted((str(f.get("name")), str(f.get("sha256"))) for f in files)
    return (s.spec.model, s.spec.seed)  # a preset: its weights come from the spec's seed


def workload_identity(s: EngineSession) -> dict[str, Any]:
    """What must be equal for two sessions to be one workload: the model (its files' sha256, or a preset's
    name and seed), the traffic (every field, and the requests each timed run sends), the objective and its
    SLOs, the device."""
    sv = s.spec.serving
    out: dict[str, Any] = {"model (files' sha256, or preset and seed)": _model(s)}
    out.update({f"traffic.{k}": v for k, v in s.spec.traffic.model_dump().items()})
    out["requests per timed run (traffic.num_prompts)"] = s.spec.requests_per_run
    out["objective"] = s.spec.objective
    if s.spec.objective != "output_tokens_per_s":
        out.update({f"serving.{k}": getattr(sv, k) for k in ("slo_ttft_ms", "slo_tpot_ms", "slo_e2el_ms")})
    out["device"] = s.spec.resolved_device()
    return out


def machine_identity(s: EngineSession) -> dict[str, Any]:
    """Where and when the session ran (its manifest): host, device, GPU driver, and the UTC day it started."""
    return identity(s.manifest)


def measured_apart(s: EngineSession, here: Mapping[str, Any]) -> list[str]:
    """How the machine the pairs run on (``here``) differs from where session ``s`` ran, in words (empty: the
    same machine and day). Another kind of device is refused (:class:`EngineChoiceError`): the pairs would
    compare the two stacks on hardware neither session ran on."""
    there = machine_identity(s)
    if here.get(DEVICE) != there.get(DEVICE):
        raise EngineChoiceError(f"the sessions ran on {there.get(DEVICE)!r}, this machine is {here.get(DEVICE)!r}: "
                                "run `inferloom engines` on the kind of device the sessions ran on (nothing was written)")
    return machine_apart(there, here, "the sessions'")


def env_apart(s: EngineSession, here: Mapping[str, str] | None = None) -> list[str]:
    """The engines' own environment variables (``session.apart.ENGINE_ENV``) set differently here than in
    session ``s``'s manifest, in words (empty: the same)."""
    return _env_apart(s.manifest, s.name, here)


def _first_difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[str, Any, Any] | None:
    for k in a:
        if a[k] != b.get(k):
            return k, a[k], b.get(k)
    return None


def _shown(v: Any) -> str:
    if isinstance(v, list) and v and isinstance(v[0], tuple):  # a model's files: too long for one line
        return f"{len(v)} file(s), first {v[0][0]} sha256 {v[0][1][:12]}"
    return repr(v)


def workload_difference(a: EngineSession, b: EngineSession) -> str | None:
    """Pure: why ``a`` and ``b`` are not one workload (the first field that differs, both values), or None."""
    d = _first_difference(workload_identity(a), workload_identity(b))
    return None if d is None else f"{d[0]} differs: {_shown(d[1])} in {a.directory.name}, {_shown(d[2])} in {b.directory.name}"


def machine_difference(a: EngineSession, b: EngineSession) -> str | None:
    """Pure: why ``a`` and ``b`` are not from one machine and day (the first field that differs), or None."""
    d = _first_difference(machine_identity(a), machine_identity(b))
    return None if d is None else f"{d[0]} differs: {_shown(d[1])} in {a.directory.name}, {_shown(d[2])} in {b.directory.name}"


def check_count(n: int) -> None:
    """Refuse (:class:`EngineChoiceError`) anything but two sessions."""
    if n != 2:
        raise EngineChoiceError(f"got {n} session(s); an engine choice compares exactly two closed sessions "
                                "(compare more engines two at a time)")


def check_comparable(sessions: Sequence[EngineSession]) -> None:
    """Refuse (:class:`EngineChoiceError`, one line) unless there are exactly two sessions, distinct, of one
    workload, from one machine and day."""
    check_count(len(sessions))
    a, b = sessions
    if a.directory == b.directory or a.session_id == b.session_id:
        raise EngineChoiceError(f"{a.directory} and {b.directory} are the same session ({a.session_id}); give two "
                                "sessions, one per engine")
    why = workload_difference(a, b)
    if why is not None:
        raise EngineChoiceError(f"not one workload: {why}; an engine choice compares the same model, traffic, "
                                "objective and device (run both sessions from one spec, changing only framework:)")
    why = machine_difference(a, b)
    if why is not None:
        raise EngineChoiceError(f"not from one machine and day: {why}; run both sessions on the same machine the "
                                "same day (a fleet of the two, or two optimize runs) so their numbers are comparable")
