"""The LLM kernel author: for a KERNEL-phase target it writes a kernel for a
catalog op against the very signature the catalog uses (``make_inputs``,
``reference``, ``baseline``, the tolerance), and the kernel then passes the
same gates as the catalog's own, after the reward-hacking guards
(:mod:`inferloom.kernels.guards`): guards -> correctness -> microbenchmark
(timed by the catalog's primitive). Each refusal is named; a written kernel
that can't be loaded is ``kernel_load_failed``.

The author is shown a few of the workload's shapes; the guards also check
shapes it was not shown. The source is stored with the session
(``llm/kernels/<tag>.py``) and imported into the inferloom process (as the
catalog's kernels are): only turn on the ``kernel_author`` role for an
endpoint you trust.

In a session (``phases/kernel_llm.py``) a written kernel that passes its
gates is switched on end to end by the engine's ``llm_kernel`` knob
(:mod:`inferloom.kernels.written`) and measured like a catalog kernel.
"""

from __future__ import annotations

import hashlib
import inspect
import random
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from inferloom.agents.llm_client import LLMClient
from inferloom.agents.llm_record import LLMRefusal
from inferloom.kernels.base import KernelCandidate
from inferloom.kernels.gates import GateResult, correctness, microbenchmark
from inferloom.kernels.guards import reward_hacking_guards, unseen_shapes
from inferloom.kernels.written import import_kernel, kernel_name

__all__ = ["KernelSource", "LLMKernelAuthor", "KERNEL_SYSTEM", "load_kernel", "gate_written_kernel", "written_candidate"]


class KernelSource(BaseModel):
    """The kernel author's answer."""

    model_config = ConfigDict(extra="forbid")
    source: str = Field(min_length=1, max_length=40_000,
                        description="a Python module (Triton) defining kernel(<the reference's parameters>, *, out)")
    claimed_speedup: float = Field(gt=0.0, le=100.0, description="expected speed-up over the baseline op")
    rationale: str = Field(min_length=1, max_length=2000)


KERNEL_SYSTEM = (
    "You are the kernel author of inferloom. Write a Triton kernel for the op below, as a Python module that "
    "defines `kernel(<the reference's parameters>, *, out)`: it writes the result into the preallocated `out` "
    "(a tensor, or a tuple of tensors like the reference's result) and returns None. It must be correct at any "
    "shape (you are shown only some), for any input values (NaN and Inf propagate like the reference), write "
    "every output element, never write into or return its inputs, and never cache results between calls. It is "
    "checked against the float64 reference within the tolerance, then raced against the baseline. Answer only "
    "with the JSON object of the schema.")


def load_kernel(source: str, path: Path) -> Any:
    """Write ``source`` to ``path`` and import its ``kernel``; :class:`LLMRefusal` ``kernel_load_failed``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source, encoding="utf-8")
    try:
        return import_kernel(path)
    except Exception as exc:  # noqa: BLE001 - whatever the written module raises is a refusal
        raise LLMRefusal("kernel_load_failed", f"{path.name}: {type(exc).__name__}: {str(exc)[:300]}") from None


def written_candidate(entry: Any, dtype: str, shown: Sequence[Mapping[str, int]], fn: Any, name: str,
                      claimed_speedup: float, notes: str) -> KernelCandidate:
    """The candidate ``llm:<name>`` for a written kernel ``fn`` against ``entry``'s signature
    (no ``config_changes``: the KERNEL phase adds the engine switch)."""
    fields = {**entry.candidate_fields(dtype, tuple(shown)), "id": f"llm:{name}", "implementation": fn, "notes": notes}
    return KernelCandidate(**fields, claimed_speedup=claimed_speedup, config_changes={})


def gate_written_kernel(cand: KernelCandidate, device: str, shown: Sequence[Mapping[str, int]], *,
                        min_speedup: float, rng: random.Random | None = None,
                        served: KernelCandidate | None = None) -> list[GateResult]:
    """Guards, then correctness (at the shown and unseen shapes), then the microbenchmark;
    stops at the first refusal. Returns every gate's result in order.

    ``served``: the kernel as a server runs it (``Framework.written_served``: vLLM's plugin ``forward``, compiled
    when the server compiles). Its correctness is checked after the entry's (a crash there, e.g. a kernel
    torch.compile can't trace, refuses it before a server starts), and the microbenchmark races it against the
    server's own op instead of the entry's baseline."""
    results = [reward_hacking_guards(cand, device, shown, rng)]
    if results[-1].passed:
        hidden = unseen_shapes(shown, rng or random.SystemRandom(), cand.shape_fit)
        wide = replace(cand, shapes=tuple(dict(s) for s in (*shown, *hidden)))
        results.append(correctness(wide, device))
        if results[-1].passed and served is not None:
            results[-1] = _served_too(results[-1], correctness(served, device), served)
    if results[-1].passed:
        results.append(microbenchmark(served or cand, device, min_speedup=min_speedup))
    return results


def _served_too(entry: GateResult, server: GateResult, served: KernelCandidate) -> GateResult:
    """One correctness result: the entry's checks, then those of the kernel as the server runs it."""
    details = {**entry.details, "served": {"op": served.op, **server.details}}
    if not server.passed:
        return GateResult("correctness", False, server.rule, f"as the server runs it ({served.op}): {server.why}",
                          details)
    return GateResult("correctness", True, None, f"{entry.why}; as the server runs it ({served.op}): {server.why}",
                      details)


class LLMKernelAuthor:
    """Asks the LLM for a kernel for one catalog entry and builds its candidate (see the module docstring)."""

    name = "llm-kernel-author"

    def __init__(self, client: LLMClient, directory: str | Path) -> None:
        self.client, self.dir = client, Path(directory)

    def prompt(self, entry: Any, dtype: str, shown: Sequence[Mapping[str, int]]) -> str:
        parts = [f"Op: {entry.name} (profile category {entry.target}): {entry.target_op}",
                 f"dtype: {dtype}; tolerance per output: {dict(entry.tolerance(dtype))}",
                 f"Some of the workload's shapes (make_inputs keys): {[dict(s) for s in shown]}"]
        for title, fn in (("make_inputs (the inputs and the preallocated out)", entry.make_inputs),
                          ("reference (float64 truth; your kernel takes the same parameters plus out=)", entry.reference),
                          ("baseline (what you must beat)", entry.baseline)):
            try:
                parts.append(f"{title}:\n{inspect.getsource(fn)}")
            except (OSError, TypeError):
                parts.append(f"{title}: {getattr(fn, '__doc__', '') or fn!r}")
        return "\n\n".join(parts)

    def write(self, entry: Any, dtype: str, shown: Sequence[Mapping[str, int]],
              tag: str | None = None) -> tuple[KernelCandidate, list[dict[str, Any]], dict[str, Any]]:
        """The candidate ``llm:<name>``, the calls it took, and what was written (``name``: ``<entry>-<tag>``,
        the tag by default the source's sha256; ``path``; ``claimed_speedup``; ``rationale``).
        :class:`LLMRefusal` when the LLM gave nothing usable or the source does not load."""
        answer, calls = self.client.ask("kernel_author", KERNEL_SYSTEM, self.prompt(entry, dtype, shown), KernelSource)
        name = f"{entry.name}-{tag}" if tag else kernel_name(entry.name, hashlib.sha256(answer.source.encode()).hexdigest())
        path = self.dir / "llm" / "kernels" / f"{name}.py"
        try:
            fn = load_kernel(answer.source, path)
        except LLMRefusal as exc:
            raise LLMRefusal(exc.rule, exc.why, calls) from None
        notes = f"written by {self.client.llm.model}: {answer.rationale[:300]}"
        written = {"name": name, "path": str(path), "claimed_speedup": answer.claimed_speedup,
                   "rationale": answer.rationale[:2000]}
        return written_candidate(entry, dtype, shown, fn, name, answer.claimed_speedup, notes), calls, written
