"""Trained presets: small models trained by inferloom itself and shipped as
Hugging Face model directories inside the package (``inferloom/data/``), so
they load offline like any local model directory.

``llama-tiny-trained``: a 1.6M-parameter Llama with a character-level
tokenizer, trained by ``benchmarks/train_tiny.py`` on synthetic tasks with
exact answers (addition, sorting, key-value recall) plus the shipped corpus.
Its directory also holds ``tasks.jsonl`` (the declared task eval, with the
``eval`` / ``heldout`` split) and ``train_log.json`` (the training run and its
measured accuracy). Unlike a random preset, its next-token distributions are
peaked where the task is determined, so the quality contract and the task gate
can tell harmless rounding from damage.

The spec resolves a trained preset's name to its directory.

Shipped task evals (:data:`TASK_SETS`): ``quality.task.file`` may name one
instead of a path: a trained preset's ``tasks.jsonl``, or the few-shot set
written for the real model ``smollm2-135m-instruct``
(``data/tasks/smollm2-135m-instruct.jsonl``, by
``benchmarks/smollm2_tasks.py``: eight tasks, 48 eval + 48 held-out items).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["TRAINED_PRESETS", "TASK_SETS", "trained_preset_dir", "task_eval_file"]

#: name -> directory under the package's ``data/``
TRAINED_PRESETS: dict[str, str] = {"llama-tiny-trained": "llama-tiny-trained"}

#: a shipped task eval's name (``quality.task.file``) -> its JSONL under the package's ``data/``
TASK_SETS: dict[str, str] = {**{n: f"{d}/tasks.jsonl" for n, d in TRAINED_PRESETS.items()},
                             "smollm2-135m-instruct": "tasks/smollm2-135m-instruct.jsonl"}


def trained_preset_dir(name: str) -> Path:
    """The model directory of trained preset ``name``; a ValueError naming what is missing otherwise."""
    if name not in TRAINED_PRESETS:
        raise ValueError(f"unknown trained preset {name!r}; expected one of {', '.join(sorted(TRAINED_PRESETS))}")
    path = Path(str(resources.files("inferloom").joinpath("data", TRAINED_PRESETS[name])))
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise ValueError(f"trained preset {name!r}: {path} has no config.json / model.safetensors; "
                         "reinstall inferloom or rebuild it with benchmarks/train_tiny.py")
    return path


def task_eval_file(name: str) -> Path:
    """The shipped task eval named ``name`` (:data:`TASK_SETS`); a ValueError naming what is missing otherwise."""
    if name not in TASK_SETS:
        raise ValueError(f"unknown task set {name!r}; expected one of {', '.join(sorted(TASK_SETS))}")
    if name in TRAINED_PRESETS:
        return trained_preset_dir(name) / "tasks.jsonl"
    path = Path(str(resources.files("inferloom").joinpath("data", TASK_SETS[name])))
    if not path.is_file():
        raise ValueError(f"task set {name!r}: {path} is missing; reinstall inferloom or rewrite it with "
                         "benchmarks/smollm2_tasks.py")
    return path
