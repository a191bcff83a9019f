"""Kernels an LLM wrote (:mod:`inferloom.agents.llm_kernel`), switched on in
the transformers engine (and, for ``add_rmsnorm``, the diffusers engine's
denoiser; for ``silu_mul`` and ``add_rmsnorm``, a vLLM server through its plugin
overlay: :data:`ENGINES`) by the KERNEL-phase knob ``llm_kernel``. This module is
the library's part (the registry, a kernel's identity, what it replaces and
needs, the shapes its author is shown); the knob and the rewrite of a model's
modules, the delivery into the engines, are
:mod:`inferloom.workloads.engine_written`'s.

The knob exists only in a session whose ``agents.llm.roles`` names
``kernel_author`` (every other session's knob space, stock configuration and
knowledge-base keys are unchanged). Its domain is ``none`` plus the kernels of
this session that passed the reward-hacking guards, the correctness gate and
the microbenchmark: :func:`register` adds one (the KERNEL phase calls it only
after the gates) and records it in ``<session>/llm/kernels/passed.json``, so a
resumed session (:func:`restore`) and ``verify --remeasure``
(:func:`restore_checked`, the source's sha256 checked first) can still build
a stack that has it. A
kernel's value is ``<catalog entry>-<sha256 of the source, 10 hex>``: the
kernel's identity is its source.

A session can keep several: a value may also be a combination of written
kernels that rewrite different modules, sorted and joined by ``+``
(:mod:`inferloom.kernels.written_set`, which every consumer reads a value
through). A kernel that passes its gates while the stack has
``llm_kernel=X`` is measured as X plus it (a member of X that rewrites the
same modules, e.g. ``gate_up_silu`` and ``silu_mul`` both the MLP, replaced
by it); the combination is registered too (``combined.json`` beside
``passed.json``) and :data:`REPLACES` / :data:`NEEDS` apply to every member.

What a written kernel replaces in the engine (:data:`WRITABLE`: the profile
category it is asked for, then the catalog entry whose signature it takes):

* ``gemm`` -> ``gate_up_silu``: ``kernel(x, w_gate_up, *, out)`` computes
  ``silu(x @ Wg^T) * (x @ Wu^T)`` over the fused ``[2I, H]`` gate/up weight;
  every Llama-style MLP becomes ``down_proj(kernel(x2d, W))``.
* ``elementwise`` -> ``silu_mul``: ``kernel(gu, *, out)`` computes
  ``silu(gu[:, :I]) * gu[:, I:]``; every MLP becomes
  ``down_proj(kernel(F.linear(x2d, W)))`` (one GEMM over the fused weight).

* ``normalization`` -> ``add_rmsnorm`` (in an in-process engine as a plain
  RMSNorm: the shapes it is shown and checked at carry ``no_residual=1``; in a
  vLLM server with the decoder's residual, and once without, as vLLM's
  ``RMSNorm(x, residual)`` is called): ``kernel(x, residual, weight,
  eps, *, out)`` writes ``(norm(x + residual) * weight, x + residual)`` into
  the pair ``out`` (``residual`` None: ``x`` itself); every Llama-style
  RMSNorm module (``weight`` and ``variance_epsilon``, as ``rmsnorm_impl``
  rewrites) calls it on its rows instead of its own ops, so it needs
  ``rmsnorm_impl=eager``.

* ``attention`` -> ``decode_attention``: ``kernel(q, k_cache, v_cache, seq_lens,
  starts=None, scale=None, *, out)`` writes into ``out`` ``[B, Hq, 1, D]`` the
  attention of each row's one query token over ``[starts[b], seq_lens[b])`` of
  the cache (GQA; the padding outside is never to be read). It is registered
  on the attention path exactly as ``attention_kernel`` registers the
  catalog's (:func:`inferloom.workloads.engine_attention.register`, under its
  knob value): decode steps (one query token, a boolean mask) call it with the
  rows' ranges as int32 and ``scale=None`` (the gates check only the default
  ``1/sqrt(head_dim)``: a model whose attention scales otherwise is refused);
  prefill stays on SDPA. So it needs ``attention_kernel=sdpa`` and
  ``attn_implementation=sdpa`` (:data:`NEEDS`: the author isn't asked for a
  stack with another attention implementation).

The MLP ones fuse the MLP's gate and up weights like ``mlp_kernel=torch_gate_up``
(:mod:`inferloom.workloads.engine_gate_up`), so they need ``mlp_kernel=eager``.
Each configuration is checked by :func:`conflict` (:data:`REPLACES`: the knob
each rewrites the modules of, and its untouched value; a combination's every
member by :func:`inferloom.kernels.written_set.conflict`).
The written module is imported into the inferloom process, as the catalog's
kernels are (see the role's warning in docs/llm.md). A call through Python and
the written launch each time: not traceable by ``torch.compile(fullgraph)``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from pathlib import Path
from typing import Any, Callable, Mapping

from inferloom.errors import InferloomError
from inferloom.frameworks import FRAMEWORKS
from inferloom.kernels.base import model_config
from inferloom.kernels.catalog_backend import DECODE_ATTENTION_COVERS, decode_attention_shape

__all__ = ["WRITABLE", "KNOB", "register", "restore", "restore_checked", "WrittenKernelError", "registered", "lookup",
           "import_kernel", "kernel_name", "shown_shapes", "source_sha256", "ENGINES", "writable",
           "REPLACES", "NEEDS", "COVERS", "entry_of", "conflict", "stack_refusal", "contained_source"]

WRITABLE: dict[str, str] = {"gemm": "gate_up_silu", "elementwise": "silu_mul", "normalization": "add_rmsnorm",
                            "attention": "decode_attention"}
# framework -> what a written kernel can replace in its engine: the in-process engines (an image engine: its RMSNorms),
# and a server that loads written kernels itself (its descriptor's written_ops: vLLM's plugin, workloads/vllm_written.py)
ENGINES: dict[str, dict[str, str]] = {
    **{f.name: {"normalization": "add_rmsnorm"} if f.image else WRITABLE for f in FRAMEWORKS.values() if f.kernel_engine},
    **{f.name: dict(f.written_ops) for f in FRAMEWORKS.values() if f.written_ops}}
# entry -> (the KERNEL-phase knob whose modules it rewrites, that knob's untouched value, what it rewrites): the
# candidate sets the knob back to that value, and a configuration with another value is refused (:func:`conflict`)
REPLACES: dict[str, tuple[str, str, str]] = {
    "gate_up_silu": ("mlp_kernel", "eager", "the MLP"), "silu_mul": ("mlp_kernel", "eager", "the MLP"),
    "add_rmsnorm": ("rmsnorm_impl", "eager", "the RMSNorms"),
    "decode_attention": ("attention_kernel", "sdpa", "the decode attention")}
# entry -> knobs of earlier phases it needs as they are (the author is not asked when the stack has another value)
NEEDS: dict[str, dict[str, str]] = {"decode_attention": {"attn_implementation": "sdpa"}}
# entry -> profile categories its op spends besides its target's (the Amdahl share, phases/kernel_trial.share), as the
# catalog's own candidate for the op has them: a written decode attention replaces repeat_kv's cache copy too
COVERS: dict[str, tuple[str, ...]] = {"decode_attention": DECODE_ATTENTION_COVERS}
KNOB = "llm_kernel"
PASSED = "passed.json"
_REGISTRY: dict[str, tuple[str, Path]] = {}  # knob value -> (catalog entry, source path)
# a combination of written kernels (``+``-joined, :mod:`inferloom.kernels.written_set`) -> its members: a value of the
# knob while every member is registered
COMBINED: dict[str, tuple[str, ...]] = {}


class WrittenKernelError(InferloomError, ValueError):
    """A session's written kernel can't be registered again as the session ran it (what, why, what to do)."""


_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\.py")


def contained_source(book: Path, value: str, name: object) -> Path:
    """The source file ``name`` that ``passed.json`` (``book``) records for the written kernel ``value``: a plain
    file name under ``llm/kernels/`` (no directory part, no ``..``, no absolute path, no symlink leading out of the
    folder); :class:`WrittenKernelError` otherwise, so a handed-over session can't point a kernel at a file
    elsewhere on this machine (docs/security.md)."""
    text = str(name)
    if not _PLAIN_NAME.fullmatch(text):
        raise WrittenKernelError(f"written kernel {value}: {book} names its source {text!r}, not a plain file name "
                                 "under llm/kernels/ (refused: a session's kernels live in its own folder)")
    path = book.parent / text
    folder = book.parent.resolve()
    if path.exists() and path.resolve().parent != folder:
        raise WrittenKernelError(f"written kernel {value}: its source {path} leads outside {folder} (a link; "
                                 "refused: a session's kernels live in its own folder)")
    return path


def source_sha256(path: Path) -> str:
    """The sha256 of a written kernel's source file (its identity)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def writable(framework: str) -> dict[str, str]:
    """The profile categories a written kernel can replace in ``framework``'s engine, and their catalog entries
    (empty for an engine without the ``llm_kernel`` switch)."""
    return dict(ENGINES.get(framework, {}))


def entry_of(value: str) -> str:
    """The catalog entry of the knob value ``<entry>-<sha[:10]>``."""
    return value.rsplit("-", 1)[0]


def stack_refusal(entry: str, cfg: Mapping[str, Any]) -> str | None:
    """Why a written ``entry`` kernel can't run on ``cfg`` whatever the KERNEL phase sets (a knob of an
    earlier phase, :data:`NEEDS`), else None: the author is not asked then."""
    for name, want in NEEDS.get(entry, {}).items():
        if str(cfg.get(name, want)) != want:
            return (f"the written {entry} kernel replaces the {want} path of {name}; the stack's {name} is "
                    f"{cfg.get(name)}")
    return None


def conflict(value: str, cfg: Mapping[str, Any]) -> str | None:
    """Why ``llm_kernel=value`` can't run with the rest of ``cfg`` (the knob it replaces set too, or a needed
    knob of an earlier phase changed), else None."""
    entry = entry_of(value)
    if value == "none" or entry not in REPLACES:
        return None
    name, untouched, what = REPLACES[entry]
    if str(cfg.get(name, untouched)) != untouched:
        return f"the written kernel rewrites {what} itself; {name} is {cfg[name]}"
    return stack_refusal(entry, cfg)


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
    known[value] = {"entry": entry, "path": Path(path).name, "sha256": source_sha256(Path(path))}
    book.write_text(json.dumps(known, indent=1, sort_keys=True))


def restore(session_dir: str | Path) -> list[str]:
    """Register again the kernels a session's gates passed (a resumed session); their values."""
    book = Path(session_dir) / "llm" / "kernels" / PASSED
    if not book.is_file():
        return []
    known = json.loads(book.read_text())
    for value, rec in known.items():
        _REGISTRY[value] = (str(rec["entry"]), contained_source(book, value, rec["path"]))
    return sorted(known)


def restore_checked(session_dir: str | Path, values: list[str] | tuple[str, ...]) -> None:
    """Register the written kernels ``values`` of a session exactly as the session did (``verify --remeasure``),
    after checking each one's source against the sha256 the session stored with it (``passed.json``) and the one
    its name carries (``<entry>-<sha256[:10]>``); :class:`WrittenKernelError` naming the kernel when its record
    or source is missing or its hash differs."""
    book = Path(session_dir) / "llm" / "kernels" / PASSED
    known = json.loads(book.read_text()) if book.is_file() else {}
    for value in values:
        rec = known.get(value)
        if not isinstance(rec, dict):
            raise WrittenKernelError(f"written kernel {value}: {book} has no record of it (the session registers a "
                                     "kernel there once its gates passed); restore the session directory from a backup")
        path = contained_source(book, value, rec.get("path"))
        if not path.is_file():
            raise WrittenKernelError(f"written kernel {value}: its source {path} is missing; restore the session "
                                     "directory from a backup")
        sha, stored = source_sha256(path), str(rec.get("sha256") or "")
        suffix = value.rsplit("-", 1)[-1]
        named = suffix if re.fullmatch(r"[0-9a-f]{10}", suffix) else ""
        want = stored if stored and sha != stored else named if not sha.startswith(named) else None
        if want is not None or not (stored or named):
            raise WrittenKernelError(f"written kernel {value}: its source {path.name} has sha256 {sha[:16]}..., not "
                                     + (f"the {want[:16]}... the session stored (the file changed since the session "
                                        "ran it)" if want else "checkable (no sha256 recorded for it)")
                                     + "; restore the session directory from a backup")
        if str(rec.get("entry")) not in WRITABLE.values():
            raise WrittenKernelError(f"written kernel {value}: entry {rec.get('entry')!r} has no engine switch")
        _REGISTRY[value] = (str(rec["entry"]), path)


def registered() -> tuple[str, ...]:
    """The knob's values now: the kernels registered, and the combinations of them (:data:`COMBINED`)."""
    return tuple(sorted([*_REGISTRY, *(v for v, ms in COMBINED.items() if all(m in _REGISTRY for m in ms))]))


def lookup(value: str) -> tuple[str, Path]:
    """``(catalog entry, source path)`` of the written kernel ``value`` registered in this process; ``ValueError``
    naming the ones there are otherwise."""
    if value not in _REGISTRY:
        raise ValueError(f"{KNOB}={value!r}: no such written kernel in this session (have: "
                         f"{', '.join(registered()) or 'none'})")
    return _REGISTRY[value]


def _fused_add(workload: Mapping[str, Any]) -> bool:
    """Whether the workload's engine calls its RMSNorm with the decoder's residual (the fused add): a server that
    runs written kernels itself (its descriptor's ``written_ops``: vLLM's ``RMSNorm(x, residual)``), not
    transformers' modules, whose residual adds are outside the norm."""
    fw = FRAMEWORKS.get(str(workload.get("framework")))
    return fw is not None and dict(fw.written_ops).get("normalization") == "add_rmsnorm"


def shown_shapes(entry: str, workload: Mapping[str, Any]) -> list[dict[str, int]]:
    """The shapes the author is shown: the decode step's and a prefill chunk's (at most 256 tokens)."""
    d = workload.get("diffusion") or {}
    if entry == "add_rmsnorm" and d:  # an image workload: the denoiser's q/k norms over head_dim
        norm = {"hidden": int(d["head_dim"]), "no_residual": 1}
        return [{"tokens": int(d["rms_rows"]), **norm}, {"tokens": min(int(d["rms_rows"]), 64), **norm}]
    if entry == "decode_attention":  # the mean decode step's, and a ragged left-padded batch as the engine runs
        shape = decode_attention_shape(workload)
        return [shape, {**shape, "ragged": 1, "left_pad": 1}]
    cfg = model_config(str(workload["model"]))
    batch = int(workload["batch"])
    prefill = min(batch * int(workload["input_len"]), 256)
    if entry == "add_rmsnorm" and _fused_add(workload):  # a server's RMSNorm adds the decoder's residual itself
        norm = {"hidden": int(cfg["hidden_size"])}
        return [{"tokens": batch, **norm}, {"tokens": prefill, **norm}, {"tokens": batch, **norm, "no_residual": 1}]
    if entry == "add_rmsnorm":  # the model's RMSNorms take no residual
        norm = {"hidden": int(cfg["hidden_size"]), "no_residual": 1}
        return [{"tokens": batch, **norm}, {"tokens": prefill, **norm}]
    inter = int(cfg["intermediate_size"])
    base = {"intermediate": inter} if entry == "silu_mul" else {"hidden": int(cfg["hidden_size"]), "intermediate": inter}
    return [{"tokens": batch, **base}, {"tokens": prefill, **base}]
