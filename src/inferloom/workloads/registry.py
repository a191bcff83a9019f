"""The adapter for a spec, and the one place that resolves a framework's lazy
``"module:attr"`` targets (:mod:`inferloom.frameworks` names them; heavy imports
happen here, when one is first needed)."""

from __future__ import annotations

import importlib
from typing import Any, Mapping

from inferloom.frameworks import FRAMEWORKS, Framework, framework

__all__ = ["ADAPTERS", "make_adapter", "resolve", "stack_precision", "deploy", "kernel_backend", "session_overlays",
           "server_profile", "written_served"]

#: framework name -> its adapter's lazy target (the descriptors' ``adapter`` field)
ADAPTERS: dict[str, str] = {name: f.adapter for name, f in FRAMEWORKS.items()}


def resolve(target: str) -> Any:
    """The object a lazy ``"module:attr"`` target names (imports its module)."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def make_adapter(spec: Any) -> Any:
    """Instantiate the adapter for ``spec.framework``; UnknownFramework (a ValueError) for a name with none."""
    return resolve(framework(spec.framework).adapter)(spec)


def stack_precision(fw: Framework, config: Mapping[str, Any], model_dtype: str) -> dict[str, Any] | None:
    """At which precision ``config`` runs under framework ``fw`` (weight / KV bytes, a label), or None
    where the framework's knobs don't change it beyond the config's ``dtype``."""
    return resolve(fw.stack_precision)(config, model_dtype) if fw.stack_precision else None


def deploy(fw: Framework, spec: Any, final: Mapping[str, Any], manifest: Mapping[str, Any],
           entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The final stack ``final`` as a user deploys it (the descriptor's ``deploy`` target), or None where
    the framework names none."""
    return resolve(fw.deploy)(spec, final, manifest, entries) if fw.deploy else None


def kernel_backend(fw: Framework) -> Any:
    """The framework's own KERNEL phase backend (the descriptor's ``kernel_backend`` target, instantiated), or
    None where kernels.registry's backends apply."""
    return resolve(fw.kernel_backend)() if fw.kernel_backend else None


def written_served(fw: Framework, workload: Mapping[str, Any], entry: str, name: str, path: Any,
                   claimed_speedup: float) -> Any:
    """A written kernel as the framework's server runs it (the descriptor's ``written_served`` target: a
    ``KernelCandidate`` for the gates' second look), or None where the framework names none."""
    return resolve(fw.written_served)(workload, entry, name, path, claimed_speedup) if fw.written_served else None


def session_overlays(fw: Framework, d: Any, changes: Mapping[str, Any], entries: list[dict[str, Any]]) -> list[Any]:
    """``verify --remeasure``: the engine overlays the final stack's ``changes`` name, rebuilt and checked against
    the session's files and records (the descriptor's ``session_overlays`` target; raises an InferloomError
    naming a missing or changed file); [] where the framework names none."""
    return list(resolve(fw.session_overlays)(d, changes, entries)) if fw.session_overlays else []


def server_profile(fw: Framework, spec: Any, config: Mapping[str, Any], trace_dir: Any, log_dir: Any,
                   progress: Any) -> dict[str, Any]:
    """A profile of ``config`` through the server's own profiler (the descriptor's ``server_profile`` target);
    ValueError where the framework names none."""
    if not fw.server_profile:
        raise ValueError(f"framework {fw.name}: no server profile")
    return dict(resolve(fw.server_profile)(spec, config, trace_dir, log_dir, progress))
