"""``inferloom engines``: the engine as a choice (issue 32). Two closed sessions of one workload, each on its own
serving engine (vllm, sglang, transformers), from one machine and day: side by side as each measured itself, then
their final stacks paired against each other through the protocol, and which engine to deploy.

* :mod:`~inferloom.engine_choice.sessions`: a closed session read from its files; the refusal rules (one workload,
  one machine and day, closed).
* :mod:`~inferloom.engine_choice.measure`: the cross-engine pairs (two adapters, one paired loop) and the quality
  agreement of the two engines' outputs; every pair's raw records in ``engines_pairs.jsonl``.
* :mod:`~inferloom.engine_choice.decide`: the decision in both directions and the recommendation (pure).
* :mod:`~inferloom.engine_choice.report`: ``engines.md`` and ``engines.json``.
* :mod:`~inferloom.engine_choice.choose`: the job the command runs.

See docs/engines.md.
"""

from inferloom.engine_choice.choose import choose_engine, read_comparable
from inferloom.engine_choice.decide import engine_decision, recommendation
from inferloom.engine_choice.sessions import EngineChoiceError, EngineSession, check_comparable, read_session

__all__ = ["choose_engine", "read_comparable", "engine_decision", "recommendation", "EngineChoiceError",
           "EngineSession", "check_comparable", "read_session"]
