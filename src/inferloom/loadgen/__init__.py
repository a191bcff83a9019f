"""Streaming load generation against OpenAI-compatible servers, and its metrics."""

from inferloom.loadgen.metrics import SLO, RequestRecord, summarize

__all__ = ["SLO", "RequestRecord", "summarize"]
