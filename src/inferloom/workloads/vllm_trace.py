"""``traffic.trace`` for a vLLM server: the trace read once (:mod:`inferloom.loadgen.trace`), and what each
timed run replays of it (:class:`TracePlan`).

* The trace is read and validated when the adapter is made (a bad one: one line, exit 2, nothing
  started or written): its requests' ``input + output`` against the model's context
  (``serving.max_model_len``, else ``max_position_embeddings`` of the model directory's config.json);
  texts (the inferloom shape's ``"text"``) are tokenized with the model directory's own tokenizer
  (:func:`inferloom.workloads.vllm_texts.server_tokenizer`), as ``traffic.prompts`` texts are.
* Requests per run: ``traffic.num_prompts``, else the whole trace. Run ``seed`` replays window
  ``seed mod W`` of the trace's ``W = len // n`` disjoint windows (``Trace.window``): both arms of a pair
  share a seed and so replay the same arrivals and lengths; consecutive pairs replay consecutive windows.
* Prompts: a text request sends its text's ids; any other request sends fresh random ids drawn from the
  run's seed at that request's input length (the same ids in both arms of a pair, new ones every run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from inferloom.loadgen.trace import Trace, load_trace, model_context
from inferloom.workloads.prompts import random_prompts

if TYPE_CHECKING:
    from inferloom.spec import WorkloadSpec

__all__ = ["TracePlan", "ServerTrace"]


@dataclass(frozen=True)
class TracePlan:
    """What one run replays: prompts, their output lengths and send offsets (s), the ``trace`` record."""

    prompts: list[list[int]]
    output_lens: list[int]
    arrivals: list[float]
    state: dict[str, Any]


class ServerTrace:
    """The trace of one vLLM adapter (``model_dir()``: the directory its servers load; ``vocab()``: its size)."""

    def __init__(self, spec: WorkloadSpec, model_dir: Callable[[], str], vocab: Callable[[], int],
                 tokenizer: Callable[[], Any]) -> None:
        self.spec = spec
        self._model_dir, self._vocab, self._tokenizer = model_dir, vocab, tokenizer
        self._trace: Trace | None = None

    @property
    def enabled(self) -> bool:
        return self.spec.traffic.trace is not None

    def trace(self) -> Trace:
        if self._trace is None:
            t = self.spec.traffic
            assert t.trace is not None

            def tokenize(text: str) -> list[int]:
                return [int(i) for i in self._tokenizer()(text)["input_ids"]]

            self._trace = load_trace(t.trace, time_scale=t.trace_speed, tokenize=tokenize,
                                     max_context=model_context(self._model_dir(), self.spec.serving.max_model_len))
            self._trace.window(0, self.requests_per_run())  # num_prompts beyond the trace: refused now
        return self._trace

    def requests_per_run(self) -> int:
        n = self.spec.traffic.num_prompts
        return int(n) if n is not None else len(self.trace())

    def longest(self) -> int:
        """The longest request's input + output tokens (0 without a trace): the server's context holds it."""
        return max((r.input_len + r.output_len for r in self.trace().requests), default=0) if self.enabled else 0

    def validate(self) -> None:
        if self.enabled:
            self.trace()

    def plan(self, seed: int) -> TracePlan:
        tr = self.trace()
        w = tr.window(seed, self.requests_per_run())
        longest = max(w.input_lens)
        ids = random_prompts(seed, len(w.requests), longest, self._vocab(), {0, 1, 2})
        prompts = [list(r.ids) if r.ids is not None else ids[k][:r.input_len] for k, r in enumerate(w.requests)]
        return TracePlan(prompts=prompts, output_lens=w.output_lens, arrivals=w.arrivals, state=tr.state(w))
