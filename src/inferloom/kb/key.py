"""The seven-field workload key a recipe is filed under.

A :class:`WorkloadKey` is a frozen dataclass of seven non-empty strings:
``model, hardware, framework, model_type, architecture, framework_version,
precision``. Build one with the plain constructor, from a finished session
(:meth:`WorkloadKey.from_session`, reading ``manifest.json``'s dict), or from a
spec before any session exists (:meth:`WorkloadKey.from_spec`, for
``inferloom kb lookup SPEC`` and PRELUDE). The two derive every field the
same way, so a session's key equals the key of the spec it ran:

* ``model``: the spec's ``model``; a local model directory is reduced to its
  directory name (a KB moves between machines, absolute paths do not). An
  image workload (``framework: diffusers``) appends what sizes its work:
  ``sd3-tiny@64x64/steps4/batch1`` (resolution, denoising steps, batch), so
  a recipe is replayed only on the same shape.
* ``hardware``: the device's name (the GPU's name, or the CPU model on CPU).
* ``framework``: the adapter's framework (``transformers``, ``synthetic``).
* ``model_type`` / ``architecture``: the Hugging Face config's ``model_type``
  and first ``architectures`` entry (a diffusion pipeline's family, ``unet``
  or ``sd3``, and its denoiser's class); ``unknown`` when there is no config.
* ``framework_version``: the framework library's version (for ``synthetic``,
  inferloom's own); ``unknown`` when not recorded.
* ``precision``: the spec's ``dtype``.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, Mapping

from inferloom import __version__
from inferloom.frameworks import described
from inferloom.frameworks import framework as framework_of
from inferloom.models.diffusion_presets import pipeline_info
from inferloom.models.presets import model_info as preset_model_info
from inferloom.provenance import cpu_model

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["KEY_FIELDS", "UNKNOWN", "WorkloadKey"]

KEY_FIELDS: tuple[str, ...] = (
    "model", "hardware", "framework", "model_type", "architecture", "framework_version", "precision",
)
UNKNOWN = "unknown"
_MAX_LEN = 255


def _clean(value: Any) -> str:
    text = " ".join(str(value).split()) if value is not None else ""
    return text or UNKNOWN


def _model_name(model: Any, diffusion: Any = None) -> str:
    text = str(model or "").rstrip("/\\")
    if os.sep in text or (os.altsep and os.altsep in text):
        text = os.path.basename(text)
    if diffusion:  # an image workload: its shape is part of the workload
        d = diffusion if isinstance(diffusion, Mapping) else diffusion.model_dump()
        text += f"@{d['width']}x{d['height']}/steps{d['steps']}/batch{d['batch_size']}"
    return _clean(text)


@dataclass(frozen=True)
class WorkloadKey:
    """One workload: the seven fields a recipe is filed under (see module doc)."""

    model: str
    hardware: str
    framework: str
    model_type: str
    architecture: str
    framework_version: str
    precision: str

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if not isinstance(v, str) or not v.strip():
                raise ValueError(f"workload key field '{f.name}': expected a non-empty string, got {v!r}")
            if len(v) > _MAX_LEN:
                raise ValueError(f"workload key field '{f.name}': longer than {_MAX_LEN} characters")

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "WorkloadKey":
        missing = [k for k in KEY_FIELDS if k not in data]
        if missing:
            raise ValueError(f"workload key: missing field(s) {', '.join(missing)}; expected all of {', '.join(KEY_FIELDS)}")
        return cls(**{k: data[k] for k in KEY_FIELDS})

    def __str__(self) -> str:
        return " ".join(f"{k}={getattr(self, k)}" for k in KEY_FIELDS)

    @classmethod
    def from_session(cls, manifest: Mapping[str, Any], state: Any = None) -> "WorkloadKey":
        """The key of a session from its ``manifest.json`` dict.

        ``state`` (the session's state object or its ``state.json`` dict)
        is optional: its ``workload`` fills ``model`` / ``precision`` when the
        manifest has no spec."""
        spec = dict(manifest.get("spec") or {})
        adapter = dict(manifest.get("adapter") or {})
        workload: Mapping[str, Any] = {}
        if state is not None:
            workload = (state.get("workload") if isinstance(state, Mapping) else getattr(state, "workload", None)) or {}
        info = adapter.get("model_info") if isinstance(adapter.get("model_info"), Mapping) else {}
        framework = adapter.get("framework") or spec.get("framework")
        device = manifest.get("device") or {}
        hardware = adapter.get("device_name") or device.get("name")
        return cls(
            model=_model_name(spec.get("model") or workload.get("model") or adapter.get("model"), spec.get("diffusion")),
            hardware=_clean(hardware),
            framework=_clean(framework),
            model_type=_clean(info.get("model_type")),
            architecture=_clean(info.get("architecture")),
            framework_version=_clean(_framework_version(str(framework), adapter, manifest.get("versions") or {})),
            precision=_clean(spec.get("dtype") or workload.get("dtype") or adapter.get("dtype")),
        )

    @classmethod
    def from_spec(
        cls,
        spec: WorkloadSpec,
        *,
        hardware: str | None = None,
        framework_version: str | None = None,
        model_info: Mapping[str, Any] | None = None,
    ) -> "WorkloadKey":
        """The key a session on ``spec`` (a WorkloadSpec) would get on this machine.

        Fields not given are detected: ``hardware`` from the resolved device,
        ``framework_version`` from the installed framework, ``model_info`` from
        the model's config (meta device, no weights; imports torch)."""
        framework = spec.framework
        fw = framework_of(framework)
        if model_info is None:
            model_info = {}
            if fw.model_info == "preset":
                model_info = preset_model_info(spec.model, dtype=spec.dtype)
            elif fw.model_info == "pipeline":
                model_info = pipeline_info(spec.model)
        if hardware is None:
            hardware = _this_device(spec)
        if framework_version is None:  # the framework library's (imported here: transformers, diffusers)
            framework_version = (importlib.import_module(fw.version_module).__version__ if fw.version_module
                                 else __version__)
        return cls(
            model=_model_name(spec.model, getattr(spec, "diffusion", None)),
            hardware=_clean(hardware),
            framework=_clean(framework),
            model_type=_clean(model_info.get("model_type")),
            architecture=_clean(model_info.get("architecture")),
            framework_version=_clean(framework_version),
            precision=_clean(spec.dtype),
        )


def _framework_version(framework: str, adapter: Mapping[str, Any], versions: Mapping[str, Any]) -> Any:
    if adapter.get(f"{framework}_version"):
        return adapter[f"{framework}_version"]
    av = adapter.get("versions") if isinstance(adapter.get("versions"), Mapping) else {}
    for source in (av, versions):
        if source.get(framework):
            return source[framework]
    fw = described(framework)
    if fw is not None and fw.builtin:  # part of inferloom: its version is inferloom's
        return av.get("inferloom") or versions.get("inferloom")
    return None


def _this_device(spec: WorkloadSpec) -> str:
    if spec.resolved_device() == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    return cpu_model()
