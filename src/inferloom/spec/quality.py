"""Optional parts of the spec's ``quality`` section: the task-accuracy gate
(``quality.task``) and the tolerance declared for numerics-changing
candidates (``quality.numerics``). Defaults are justified by the calibration
in docs/quality.md (``benchmarks/quality_damage.py``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from inferloom.models.trained import TASK_SETS, task_eval_file
from inferloom.spec.fields import _n, _Strict

__all__ = ["TaskGateSpec", "NumericsToleranceSpec"]


class TaskGateSpec(_Strict):
    """A declared eval with exact answers, scored for stock and candidate on
    the same items; the candidate fails when its accuracy may be more than
    ``max_drop`` below stock's (one-sided paired bound at ``confidence``)."""

    file: str = Field(..., description="JSONL of {\"prompt\", \"answer\", \"split\": \"eval\" | \"heldout\"}, "
                      "or a shipped set's name (llama-tiny-trained: that preset's tasks.jsonl; smollm2-135m-instruct: "
                      "few-shot items for that real model); the answer is the greedy text up to the first newline "
                      "(or the first end-of-sequence token)")
    max_drop: float = Field(0.02, ge=0.0, le=1.0, description="accuracy (a fraction) the candidate may lose "
                            "against stock, at the upper confidence bound")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="one-sided confidence of the bound")
    max_new_tokens: int = _n(12, 1, 512, "greedy tokens generated per item")

    @field_validator("file")
    @classmethod
    def _file(cls, v: str) -> str:
        if v in TASK_SETS:  # a shipped eval: a trained preset's own, or a real model's
            return str(task_eval_file(v))
        if not Path(v).is_file():
            raise ValueError(f"file {v} not found; expected a JSONL file of prompt/answer items")
        return v


class NumericsToleranceSpec(_Strict):
    """Thresholds for candidates that change one of ``knobs`` from stock
    (reduced precision, quantization): judged against these instead of the
    near-exact defaults, and always by the task gate when one is declared."""

    knobs: list[str] = Field(default_factory=lambda: ["dtype", "kv_cache_dtype", "quantization"],
                             description="knobs whose change from stock makes a candidate numerics-changing")
    min_top1_agreement: float = Field(0.9, ge=0.0, le=1.0)
    max_mean_kl: float = Field(0.1, ge=0.0)
    min_greedy_agreement: float = Field(0.5, ge=0.0, le=1.0)
