"""Typed registry of adapters: framework name -> lazy "module:Class" target."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ADAPTERS", "make_adapter"]

ADAPTERS: dict[str, str] = {
    "transformers": "inferloom.workloads.transformers_engine:TransformersEngine",
    # deterministic fake with known true effects: tests and demos of the coordinator
    "synthetic": "inferloom.workloads.synthetic:from_spec",
    # the user's own code and entrypoint, with its own quality gate (docs/custom.md)
    "custom": "inferloom.workloads.custom:CustomAdapter",
    # an OpenAI-compatible vLLM server as a subprocess, from its own Python environment
    "vllm": "inferloom.workloads.vllm_adapter:from_spec",
    # a diffusers text-to-image pipeline in this process, with the image quality contract (docs/diffusers.md)
    "diffusers": "inferloom.workloads.diffusers_engine:DiffusersEngine",
}


def make_adapter(spec: Any) -> Any:
    """Instantiate the adapter for ``spec.framework`` (heavy imports happen here)."""
    target = ADAPTERS.get(spec.framework)
    if target is None:
        raise ValueError(
            f"framework '{spec.framework}': no adapter, expected one of {', '.join(sorted(ADAPTERS))}"
        )
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)(spec)
