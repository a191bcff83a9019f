"""The spec's ``traffic`` section: the load a timed run sends (closed-loop concurrency, fixed or text
prompts, chat messages rendered with the model's template, or a replayed trace) and the one rule of how many
requests a run sends per framework (:data:`REQUESTS_PER_CONCURRENCY`)."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from pydantic import Field, ValidationInfo, field_validator

from inferloom.spec.fields import _n, _Strict

__all__ = ["REQUESTS_PER_CONCURRENCY", "Traffic"]

#: Requests per timed run when ``traffic.num_prompts`` is unset, as a multiple of
#: ``traffic.concurrency``, per framework: ONE rule (:attr:`WorkloadSpec.requests_per_run`),
#: used by every adapter and by the spec's description. vLLM uses 5: every vLLM
#: result in docs/benchmarks.md and docs/loadgen.md was measured so; the
#: in-process adapters use 4 (a custom entrypoint sets its own load; an image
#: workload's run is ``diffusion.batch_size`` x ``diffusion.batches_per_run`` images).
REQUESTS_PER_CONCURRENCY: Mapping[str, int] = MappingProxyType(
    {"transformers": 4, "synthetic": 4, "custom": 4, "vllm": 5, "diffusers": 1, "sglang": 5})

class Traffic(_Strict):
    concurrency: int = _n(8, 1, 4096, "requests in flight (one batch)")
    input_len: int = _n(128, 1, 131072, "prompt tokens per request")
    output_len: int = _n(64, 1, 32768, "output tokens per request (EOS disabled)")
    num_prompts: int | None = _n(
        None, 1, 100_000, "requests per timed run (default, per framework: "
        + ", ".join(f"{fw} {k} x concurrency" for fw, k in REQUESTS_PER_CONCURRENCY.items()) + ")"
    )
    prompts: str = Field(
        "random",
        description="'random' (token ids drawn from a seed) or a JSONL file of {\"text\": ...}",
    )
    chat_template: bool = Field(
        False, description="traffic.prompts holds {\"messages\": [...]} lines, each rendered with the model's own "
        "chat template (generation prompt added) and sent whole (docs/loadgen.md, 'Chat prompts')")

    @field_validator("prompts")
    @classmethod
    def _prompts(cls, v: str) -> str:
        if v != "random" and not v.endswith(".jsonl"):
            raise ValueError("expected 'random' or a path to a .jsonl file")
        if v != "random" and not Path(v).is_file():
            raise ValueError(f"prompts file {v} not found; expected 'random' or an existing .jsonl file")
        return v

    @field_validator("chat_template")
    @classmethod
    def _chat(cls, v: bool, info: ValidationInfo) -> bool:
        if v and info.data.get("prompts") == "random":  # absent: prompts itself was refused
            raise ValueError("true needs traffic.prompts: a .jsonl file of {\"messages\": [...]} lines (random ids "
                             "are no chat)")
        return v

    trace: str | None = Field(None, description="framework vllm: a trace of requests (JSONL: Mooncake "
                              "{timestamp ms, input_length, output_length} or {arrival_s, input_len or text, "
                              "output_len}; or an Azure CSV) replayed at its recorded arrivals (docs/loadgen.md)")
    trace_speed: float = _n(1.0, 0, 1000.0, "trace replay speed: 2.0 replays the arrivals twice as fast", gt=True)
    trace_max_in_flight: int | None = _n(None, 1, 100_000, "trace: at most this many requests in flight "
                                         "(default: no cap, every request sent at its arrival)")

    @field_validator("trace")
    @classmethod
    def _trace_file(cls, v: str | None) -> str | None:
        if v is not None and not (v.endswith(".jsonl") or v.endswith(".csv")):
            raise ValueError("expected a path to a .jsonl (or Azure .csv) trace file")
        if v is not None and not Path(v).is_file():
            raise ValueError(f"trace file {v} not found; expected an existing .jsonl or .csv file")
        return v
