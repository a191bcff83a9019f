"""``inferloom verify SESSION_DIR``: re-derive a session's headline numbers from the raw ledger records
alone and compare them with what the ledger's summaries and ``session_breakdown.json`` say.

Independent by construction: this package imports nothing of inferloom but the ledger reader
(:func:`inferloom.session.ledger.read_entries`), the strict JSON reader (:mod:`inferloom.inputs`) and
the error base (:mod:`inferloom.errors`); ``tests/test_verify.py`` enforces it. Checked:

* every measurement: each pair's log-ratio, the last look's ratio, t and bootstrap intervals (see
  :mod:`inferloom.verify.stats` for the Monte-Carlo tolerance), its verdict by the rule, the stop rule,
  and each pair measured again instead of deciding (a server's JIT compile: :mod:`inferloom.verify.remeasured`);
* the stock median (both arms of ``measure_stock``) and the A/A noise block;
* each trial's verdict entry against its measurement (``measurement_seq``) and the keep rule: kept iff
  the protocol kept, quality passed and the lower bound clears ``(1 + min_gain)(1 + floor)``, the A/A floor
  re-derived here from the A/A's ratio and interval (:func:`_aa_floor`; a sequential measurement's
  ``settings.floor`` must be it). A measurement whose settings have no ``floor`` (written before issue 21's instance-effect fix) is held
  to the rule it was kept by: the lower bound clears ``|ratio_AA - 1|``;
* the CLOSE comparison (``final_compare``), the sweep points, the roofline entries (ceiling, fractions,
  headroom, the measured tok/s each used, Amdahl's inputs), and the time breakdown;
* the energy per output token of each metered measurement (:mod:`inferloom.verify.energy`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from inferloom.inputs import InputError, load_json
from inferloom.session.ledger import LEDGER_FILE, LedgerError, read_entries
from inferloom.verify import stats as S
from inferloom.verify.energy import check_energy
from inferloom.verify.measurements import check_measurement, decision_of, median_of
from inferloom.verify.record import Findings, VerifyError

__all__ = ["BREAKDOWN_FILE", "verify_session", "load_session"]

BREAKDOWN_FILE = "session_breakdown.json"
_SHAPE = (KeyError, TypeError, AttributeError, IndexError, ValueError, OverflowError, ZeroDivisionError)
_GROUPS = {"measure_stock": "A/A (stock)", "try_config": "trial measurements", "final_compare": "CLOSE compare",
           "sweep": "sweep points"}


def load_session(directory: str | Path) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The ledger's entries and the breakdown (None when the session has none yet); VerifyError otherwise."""
    d = Path(directory)
    if not (d / LEDGER_FILE).is_file():
        raise VerifyError(f"{d}: no {LEDGER_FILE}; not a session directory (pass the directory `optimize` wrote)")
    try:
        entries = read_entries(d)
    except LedgerError as exc:
        raise VerifyError(f"{d}: the ledger cannot be read ({exc})") from None
    if not entries:
        raise VerifyError(f"{d}: {LEDGER_FILE} is empty; nothing to verify")
    bpath = d / BREAKDOWN_FILE
    if not bpath.is_file():
        return entries, None
    try:
        b = load_json(bpath.read_bytes())
    except InputError as exc:
        raise VerifyError(f"{bpath}: {exc}; re-render it with `inferloom report {d}`") from None
    if not isinstance(b, dict):
        raise VerifyError(f"{bpath}: not a JSON object; re-render it with `inferloom report {d}`")
    return entries, b


def _aa_floor(dec: Mapping[str, Any] | None) -> float:
    """The A/A floor, written again from its contract (docs/protocol.md): with ``m = log ratio`` and ``h`` half
    the interval's log width, ``exp(|m| + h / 2) - 1`` when ``|m| > 3/4 h``, else 0; 0 without an A/A."""
    if not dec or not isinstance(dec.get("ratio"), (int, float)) or not dec["ratio"] > 0:
        return 0.0
    m = abs(math.log(float(dec["ratio"])))
    lo, hi = dec.get("ci_low"), dec.get("ci_high")
    h = max(0.0, (math.log(float(hi)) - math.log(float(lo))) / 2.0) if isinstance(lo, (int, float)) and \
        isinstance(hi, (int, float)) and lo > 0 and hi > 0 else 0.0
    return math.exp(m + h / 2.0) - 1.0 if m > 0.75 * h else 0.0


def _same(f: Findings, group: str, name: str, recorded: Any, want: Any, seq: int | None) -> None:
    if isinstance(want, float) or isinstance(recorded, float):
        ok = isinstance(recorded, (int, float)) and not isinstance(recorded, bool) and S.close(recorded, want)
    else:
        ok = recorded == want
    f.add(group, name, recorded, want, seq, ok)


def _verdicts(f: Findings, entries: list[dict[str, Any]], by_seq: dict[int, dict[str, Any]],
              aa: Mapping[str, Any] | None, bd: Mapping[str, Any] | None) -> None:
    kept_bd = {r.get("ledger_seq"): r for r in (bd or {}).get("action_path", []) or []}
    rej_bd = {r.get("ledger_seq"): r for r in (bd or {}).get("rejected", []) or []}
    for v in (e for e in entries if e["kind"] == "verdict"):
        seq, m = v["seq"], by_seq.get(v.get("measurement_seq"))  # type: ignore[arg-type]
        if m is None or m.get("kind") != "measurement":
            f.add("trial verdicts", "measurement_seq", v.get("measurement_seq"), "a measurement entry", seq, False)
            continue
        d, q = decision_of(m), m.get("quality") or {}
        for key in ("ratio", "ci_low", "ci_high"):
            _same(f, "trial verdicts", f"trial {v.get('trial')} {key}", v.get(key), d.get(key), seq)
        _same(f, "trial verdicts", f"trial {v.get('trial')} protocol_verdict", v.get("protocol_verdict"),
              m.get("verdict"), seq)
        qp = q.get("passed") if q.get("evaluated") else None
        _same(f, "trial verdicts", f"trial {v.get('trial')} quality_passed", v.get("quality_passed"), qp, seq)
        lo, st = d.get("ci_low"), (m.get("protocol") or {}).get("settings") or {}
        if "floor" in st:  # the rule since issue 21: min_gain and the A/A floor together
            floor = _aa_floor(aa)
            if st.get("design") == "sequential":
                _same(f, "keep rule", f"trial {v.get('trial')} settings.floor (the A/A's)", st.get("floor"), floor, seq)
            bar = (1.0 + float(st["min_gain"])) * (1.0 + floor)
            rule = f"ci_low > (1 + min_gain {float(st['min_gain']):.6g})(1 + A/A floor {floor:.6g}) = {bar:.6g}"
        else:  # written before: ci_low - 1 above max(min_gain, |ratio_AA - 1|) (the protocol's keep gives min_gain)
            bar = 1.0 + (abs(float(aa["ratio"]) - 1.0) if aa else 0.0)
            rule = f"ci_low - 1 > A/A floor {bar - 1.0:.6g}"
        clears = isinstance(lo, (int, float)) and lo > bar
        if v.get("kept"):
            allowed = m.get("verdict") == "keep" and qp is True and clears
            f.add("keep rule", f"trial {v.get('trial')} kept", True, f"protocol keep, quality passed, {rule}: {allowed}",
                  seq, allowed, "decision rule")
        else:
            want = {"revert": "revert", "inconclusive": "inconclusive", "failed": "failed"}.get(str(m.get("verdict")))
            if v.get("outcome") in ("revert", "inconclusive", "failed", "keep"):
                f.add("keep rule", f"trial {v.get('trial')} outcome", v.get("outcome"), want or m.get("verdict"),
                      seq, v.get("outcome") == want, "decision rule")
            elif v.get("outcome") == "reject-quality":
                f.add("keep rule", f"trial {v.get('trial')} outcome", v.get("outcome"), "protocol keep, quality failed",
                      seq, m.get("verdict") == "keep" and qp is False, "decision rule")
            elif v.get("outcome") == "below-noise-floor":
                f.add("keep rule", f"trial {v.get('trial')} outcome", v.get("outcome"), f"protocol keep, not {rule}",
                      seq, m.get("verdict") == "keep" and isinstance(lo, (int, float)) and not clears, "decision rule")
        row = (kept_bd if v.get("kept") else rej_bd).get(seq)
        if bd is not None:
            f.add("breakdown copies", f"trial {v.get('trial')} listed", row is not None, True, seq, row is not None)
            for key in ("ratio", "ci_low", "ci_high"):
                if row is not None:
                    _same(f, "breakdown copies", f"trial {v.get('trial')} {key}", row.get(key), d.get(key), seq)


def _roof(f: Findings, name: str, r: Mapping[str, Any], measured: float | None, seq: int) -> None:
    """One roofline dict: its ceiling from its own floors, the measured tok/s it used, fraction, headroom."""
    g = "ceiling fractions"
    if r.get("unit") == "images/s":  # an image workload's roofline (measure.diffusion_costs)
        floor = int(r["steps"]) * float(r["denoise_step"]["floor_s"]) + float(r["decode"]["floor_s"])
        _same(f, g, f"{name} floor_s", r.get("floor_s"), floor, seq)
        ceiling = int(r["batch"]) / float(r["floor_s"])
        _same(f, g, f"{name} ceiling_images_per_s", r.get("ceiling_images_per_s"), ceiling, seq)
        meas = r.get("measured_images_per_s")
        if meas is not None:
            if measured is not None:
                _same(f, g, f"{name} measured_images_per_s", meas, measured, seq)
            _same(f, g, f"{name} fraction", r.get("fraction"), float(meas) / ceiling, seq)
            _same(f, g, f"{name} headroom", r.get("headroom"), ceiling / float(meas), seq)
        return
    floor = float(r["prefill"]["floor_s"]) + int(r["decode_steps"]) * float(r["decode_step"]["floor_s"])
    _same(f, g, f"{name} floor_s", r.get("floor_s"), floor, seq)
    ceiling = int(r["batch"]) * int(r["output_len"]) / float(r["floor_s"])
    _same(f, g, f"{name} ceiling_tok_per_s", r.get("ceiling_tok_per_s"), ceiling, seq)
    dec_ceiling = int(r["batch"]) / float(r["decode_step"]["floor_s"])
    _same(f, g, f"{name} decode_only_ceiling_tok_per_s", r.get("decode_only_ceiling_tok_per_s"), dec_ceiling, seq)
    meas = r.get("measured_tok_per_s")
    if meas is None:
        return
    if measured is not None:
        _same(f, g, f"{name} measured_tok_per_s", meas, measured, seq)
    _same(f, g, f"{name} fraction", r.get("fraction"), float(meas) / ceiling, seq)
    _same(f, g, f"{name} decode_only_fraction", r.get("decode_only_fraction"), float(meas) / dec_ceiling, seq)
    _same(f, g, f"{name} headroom", r.get("headroom"), ceiling / float(meas), seq)


def _rooflines(f: Findings, entries: list[dict[str, Any]], by_seq: dict[int, dict[str, Any]],
               stock: dict[str, Any] | None, final: dict[str, Any] | None, bd: Mapping[str, Any] | None) -> None:
    kept_meas = {v.get("trial"): by_seq.get(v.get("measurement_seq"))  # type: ignore[arg-type]
                 for v in entries if v["kind"] == "verdict" and v.get("kept")}
    stock_head = None
    for e in (e for e in entries if e["kind"] == "roofline"):
        if isinstance(e.get("stock"), Mapping):
            _roof(f, "stock", e["stock"], median_of(stock, "value_a", "value_b") if stock else None, e["seq"])
            stock_head = e["stock"].get("headroom")
            if bd is not None:
                f.add("breakdown copies", "roofline stock", (bd.get("roofline") or {}).get("stock") == e["stock"],
                      True, e["seq"], (bd.get("roofline") or {}).get("stock") == e["stock"])
        if isinstance(e.get("kept"), Mapping) and isinstance(e["kept"].get("roofline"), Mapping):
            m = kept_meas.get(e["kept"].get("trial"))
            _roof(f, f"trial {e['kept'].get('trial')}", e["kept"]["roofline"],
                  median_of(m, "value_b") if m and m.get("protocol") else None, e["seq"])
        if isinstance(e.get("final"), Mapping):
            _roof(f, "final", e["final"], median_of(final, "value_b") if final else None, e["seq"])
        am = e.get("amdahl")
        if isinstance(am, Mapping) and final is not None:
            _same(f, "ceiling fractions", "amdahl measured_gain", am.get("measured_gain"), decision_of(final).get("ratio"),
                  e["seq"])
            if stock_head is not None:
                _same(f, "ceiling fractions", "amdahl max_possible_gain", am.get("max_possible_gain"), stock_head,
                      e["seq"])


def _time(f: Findings, entries: list[dict[str, Any]], bd: Mapping[str, Any]) -> None:
    meas = [e for e in entries if e["kind"] == "measurement"]
    tim = [e.get("timings") or {} for e in meas]
    bench = math.fsum(t.get("timed_runs_s", 0.0) for t in tim)
    comp = math.fsum(max(0.0, t.get(k) or 0.0) for t in tim
                     for k in ("compile_overhead_base_s", "compile_overhead_candidate_s"))
    warm = math.fsum(t.get("warmup_s", 0.0) for t in tim)
    quality = math.fsum((e.get("quality") or {}).get("seconds", 0.0) for e in meas)
    close = next((e for e in entries if e["kind"] == "close"), None)
    total = close["elapsed_s"] if close else entries[-1]["ts"] - entries[0]["ts"]
    starts = [e for e in entries if e["kind"] == "server_start"]
    startup = math.fsum(float(e.get("startup_s") or 0.0) for e in starts)
    want = {"total": total, "benchmark_runs": bench, "compilation": comp,
            "warmup_excluding_compilation": max(0.0, warm - comp), "quality_probes": quality,
            **({"server_startup": startup} if starts else {}),
            "harness": max(0.0, total - bench - warm - quality - startup)}
    extra = sorted(set(bd.get("time_s") or {}) - set(want))
    if extra:  # a category the ledger can't back (e.g. server_startup without a server start entry)
        f.add("time breakdown", "time_s categories", extra, [], close["seq"] if close else None, False)
    if starts:
        _same(f, "time breakdown", "servers.starts", (bd.get("servers") or {}).get("starts"), len(starts),
              starts[-1]["seq"])
    got = bd.get("time_s") or {}
    seq = close["seq"] if close else None
    for k, v in want.items():  # sums in another order: 1e-9 relative, 1e-9 s absolute
        ok = isinstance(got.get(k), (int, float)) and math.isclose(got[k], v, rel_tol=1e-9, abs_tol=1e-9)
        f.add("time breakdown", f"time_s.{k}", got.get(k), v, seq, ok)


def _checks(entries: list[dict[str, Any]], bd: Mapping[str, Any] | None) -> Findings:
    f = Findings()
    by_seq = {e["seq"]: e for e in entries}
    meas = [e for e in entries if e["kind"] == "measurement" and decision_of(e)]
    for m in meas:
        check_measurement(f, m, _GROUPS.get(str(m.get("action")), f"{m.get('action')} measurements"))
    stock = next((m for m in meas if m.get("action") == "measure_stock"), None)
    final = next((m for m in meas if m.get("action") == "final_compare"), None)
    if stock is not None and bd is not None:
        bs = bd.get("stock") or {}
        _same(f, "stock median", "stock.objective_median", bs.get("objective_median"),
              median_of(stock, "value_a", "value_b"), stock["seq"])
        f.add("A/A noise", "breakdown stock.noise", bs.get("noise") == stock.get("noise"), True, stock["seq"],
              bs.get("noise") == stock.get("noise"))
    if final is not None and bd is not None:
        bf, d = bd.get("final") or {}, decision_of(final)
        for key in ("ratio", "ci_low", "ci_high", "n_pairs"):
            _same(f, "CLOSE compare", f"final.{key}", bf.get(key), d.get(key), final["seq"])
        _same(f, "CLOSE compare", "final.objective_median", bf.get("objective_median"), median_of(final, "value_b"),
              final["seq"])
        _same(f, "CLOSE compare", "final.stock_median_same_run", bf.get("stock_median_same_run"),
              median_of(final, "value_a"), final["seq"])
    _verdicts(f, entries, by_seq, decision_of(stock) if stock else None, bd)
    if bd is not None:
        sweep_bd = {r.get("ledger_seq"): r for r in bd.get("sweep") or []}
        for m in (m for m in meas if m.get("action") == "sweep"):
            row = sweep_bd.get(m["seq"]) or {}
            for key in ("ratio", "ci_low", "ci_high"):
                _same(f, "breakdown copies", f"sweep {m.get('point')} {key}", row.get(key), decision_of(m).get(key),
                      m["seq"])
    _rooflines(f, entries, by_seq, stock, final, bd)
    if bd is not None:
        _time(f, entries, bd)
        check_energy(f, entries, bd)
    else:
        f.notes.append(f"no {BREAKDOWN_FILE}: only the ledger's own numbers were checked")
    return f


def verify_session(directory: str | Path) -> Findings:
    """Every check of the session in ``directory``; VerifyError (exit 2) when it can't be read."""
    entries, bd = load_session(directory)
    try:
        return _checks(entries, bd)
    except _SHAPE as exc:
        what = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        raise VerifyError(f"{directory}: a ledger entry or the breakdown has an unexpected shape ({what}); "
                          "restore the session directory from a backup") from None
