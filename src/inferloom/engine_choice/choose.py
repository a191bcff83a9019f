"""``inferloom engines``' job: read the sessions, refuse a pair that is not one workload on one machine and day
(nothing written), measure the two final stacks against each other, write engines.md / engines.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from inferloom.engine_choice.measure import measure_engines
from inferloom.engine_choice.report import build_result, write_report
from inferloom.engine_choice.sessions import (EngineSession, check_comparable, check_count, env_apart, here_identity,
                                              measured_apart, read_session)
from inferloom.workloads.registry import make_adapter

__all__ = ["read_comparable", "choose_engine"]


def read_comparable(directories: Sequence[str | Path]) -> list[EngineSession]:
    """The sessions, read and checked (:func:`~inferloom.engine_choice.sessions.check_comparable`)."""
    check_count(len(directories))  # said before any file is read
    sessions = [read_session(d) for d in directories]
    check_comparable(sessions)
    return sessions


def choose_engine(sessions: Sequence[EngineSession], out: Path, *, max_pairs: int | None = None,
                  progress: Callable[[str], None] = lambda _m: None,
                  make: Callable[[Any], Any] | None = None,
                  here: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Measure and write (``out`` is created); returns the result (``engines.json``'s content) with
    ``files``: the paths written. ``make(spec)`` builds each engine's adapter (default: the framework's own,
    :func:`inferloom.workloads.registry.make_adapter`); ``here`` is the machine the pairs run on (default: this
    one, :func:`~inferloom.engine_choice.sessions.here_identity`): another kind of device than the sessions' is
    refused before anything is written, another host or day is said in the report."""
    a, b = sessions
    where = dict(here if here is not None else here_identity())
    apart = measured_apart(a, where) + env_apart(a) + env_apart(b)
    out.mkdir(parents=True, exist_ok=True)
    if apart:
        progress(f"engines: measured apart from the sessions: {'; '.join(apart)}")
    for s in sessions:
        r = s.row()
        progress(f"{s.name}: stock {r['stock_median']:,.1f} (ledger #{r['stock_seq']}), final stack "
                 f"{r['final_changes'] or '(stock)'} x{r['final_ratio']:.3f} over stock; precision {r['precision']}")
    m = measure_engines(a, b, out, max_pairs=max_pairs, progress=progress, make=make or make_adapter)
    res = build_result(sessions, {**m, "measured_at": where, "measured_apart": apart})
    j, md = write_report(out, res)
    res["files"] = [str(md), str(j), str(out / m["pairs_file"])]
    progress(f"engines: {res['recommendation']['headline']}")
    return res
