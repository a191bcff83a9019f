"""Kernels an LLM wrote (:mod:`inferloom.agents.llm_kernel`), switched on in
the transformers engine by the KERNEL-phase knob ``llm_kernel``.

The knob exists only in a session whose ``agents.llm.roles`` names
``kernel_author`` (every other session's knob space, stock configuration and
knowledge-base keys are unchanged). Its domain is ``none`` plus the kernels of
this session that passed the reward-hacking guards, the correctness gate and
the microbenchmark: :func:`register` adds one (the KERNEL phase calls it only
after the gates) and records it in ``<session>/llm/kernels/passed.json``, so a
resumed session (:func:`restore`) can still build a stack that has it. A
value is ``<catalog entry>-<sha256 of the source, 10 hex>``: the kernel's
identity is its source.

What a written kernel replaces in the engine (:data:`WRITABLE`: the profile
category it is asked for, then the catalog entry whose signature it takes):

* ``gemm`` -> ``gate_up_silu``: ``kernel(x, w_gate_up, *, out)`` computes
  ``silu(x @ Wg^T) * (x @ Wu^T)`` over the fused ``[2I, H]`` gate/up weight;
  every Llama-style MLP becomes ``down_proj(kernel(x2d, W))``.
* ``elementwise`` -> ``silu_mul``: ``kernel(gu, *, out)`` computes
  ``silu(gu[:, :I]) * gu[:, I:]``; every MLP becomes
  ``down_proj(kernel(F.linear(x2d, W)))`` (one GEMM over the fused weight).

Either fuses the MLP's gate and up weights like ``mlp_kernel=torch_gate_up``
(:mod:`inferloom.workloads.engine_gate_up`), so it needs ``mlp_kernel=eager``.
The written module is imported into the inferloom process, as the catalog's
kernels are (see the role's warning in docs/llm.md). A call through Python and
the written launch each time: not traceable by ``torch.compile(fullgraph)``.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any, Callable, Mapping

from inferloom.kernels.base import model_config
from inferloom.workloads.base import Knob
from inferloom.workloads.engine_gate_up import fuse_gate_up, gate_up_mlps

__all__ = ["WRITABLE", "KNOB", "register", "restore", "registered", "knob", "import_kernel", "apply_written_kernel",
           "kernel_name", "shown_shapes"]

WRITABLE: dict[str, str] = {"gemm": "gate_up_silu", "elementwise": "silu_mul"}
KNOB = "llm_kernel"
PASSED = "passed.json"
_REGISTRY: dict[str, tuple[str, Path]] = {}  # knob value -> (catalog entry, source path)


def kernel_name(entry: str, sha: str) -> str:
    """The knob value of a written kernel: ``<entry>-<sha[:10]>``."""
    return f"{entry}-{sha[:10]}"


def import_kernel(path: Path) -> Callable[..., Any]:
    """Import ``path`` and return its ``kernel``; raises whatever the module raises, or
    ``AttributeError`` when it defines no callable ``kernel``."""
    name = "inferloom_llm_kernel_" + re.sub(r"\W", "_", path.stem)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    fn = getattr(module, "kernel", None)
    if not callable(fn):
        raise AttributeError(f"{path.name} defines no callable `kernel`")
    return fn


def register(session_dir: str | Path, value: str, entry: str, path: str | Path) -> None:
    """Make ``value`` a value of ``llm_kernel`` (after its gates passed), in this process and for a resume."""
    if entry not in WRITABLE.values():
        raise ValueError(f"written kernel {value}: entry {entry!r} has no engine switch (one of "
                         f"{', '.join(WRITABLE.values())})")
    _REGISTRY[value] = (entry, Path(path))
    book = Path(session_dir) / "llm" / "kernels" / PASSED
    known = json.loads(book.read_text()) if book.is_file() else {}
    known[value] = {"entry": entry, "path": Path(path).name}
    book.write_text(json.dumps(known, indent=1, sort_keys=True))


def restore(session_dir: str | Path) -> list[str]:
    """Register again the kernels a session's gates passed (a resumed session); their values."""
    book = Path(session_dir) / "llm" / "kernels" / PASSED
    if not book.is_file():
        return []
    known = json.loads(book.read_text())
    for value, rec in known.items():
        _REGISTRY[value] = (str(rec["entry"]), book.parent / str(rec["path"]))
    return sorted(known)


def registered() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def knob() -> Knob:
    """The ``llm_kernel`` knob with the kernels registered now."""
    return Knob(KNOB, "choice", "none",
                "a kernel the LLM kernel author wrote that passed the guards and the kernel gates (KERNEL phase): "
                "none, or <catalog entry>-<source sha256>; see kernels/written.py",
                choices=("none", *registered()), changes_numerics=True, phase="KERNEL")


def shown_shapes(entry: str, workload: Mapping[str, Any]) -> list[dict[str, int]]:
    """The shapes the author is shown: the decode step's and a prefill chunk's (at most 256 tokens)."""
    cfg = model_config(str(workload["model"]))
    batch, inter = int(workload["batch"]), int(cfg["intermediate_size"])
    prefill = min(batch * int(workload["input_len"]), 256)
    base = {"intermediate": inter} if entry == "silu_mul" else {"hidden": int(cfg["hidden_size"]), "intermediate": inter}
    return [{"tokens": batch, **base}, {"tokens": prefill, **base}]


def _forward(mod: Any, inter: int, entry: str, fn: Callable[..., Any]) -> Callable[[Any], Any]:
    import torch
    import torch.nn.functional as F

    def forward(x: Any) -> Any:
        x2 = x.reshape(-1, x.shape[-1])
        out = torch.empty((x2.shape[0], inter), dtype=x.dtype, device=x.device)
        if entry == "gate_up_silu":
            fn(x2, mod.gate_up_proj.weight, out=out)
        else:
            fn(F.linear(x2, mod.gate_up_proj.weight).contiguous(), out=out)
        return mod.down_proj(out.reshape(*x.shape[:-1], inter))

    return forward


def apply_written_kernel(model: Any, value: str) -> str:
    """Rewrite ``model``'s MLPs to call the written kernel ``value``; a note. ``ValueError`` for
    a value not registered in this process or a model without Llama-style MLPs."""
    if value not in _REGISTRY:
        raise ValueError(f"{KNOB}={value!r}: no such written kernel in this session (have: "
                         f"{', '.join(registered()) or 'none'})")
    entry, path = _REGISTRY[value]
    fn = import_kernel(path)
    mods = gate_up_mlps(model)  # every module checked before any is changed
    for _, mod in mods:
        inter = fuse_gate_up(mod)
        mod.forward = _forward(mod, inter, entry, fn)
    return f"{value}: {len(mods)} MLP modules call the written {entry} kernel ({path.name})"
