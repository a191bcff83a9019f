"""The session breakdown (``session_breakdown.json``): a pure function of the
ledger. Every number in it cites the ledger entry it comes from
(``ledger_seq``), so ``report.md``, ``report.html`` and the knowledge base's
record of a session are all re-derived from the ledger alone."""

from __future__ import annotations

from typing import Any, Mapping

from inferloom.report.platform import platform_breakdown, run_extras
from inferloom.report.server_jit import jit_runs
from inferloom.session import ledger as L
from inferloom.measure.metrics import median_objective
from inferloom.report.llm_usage import llm_breakdown

__all__ = ["BREAKDOWN_SCHEMA_VERSION", "TIME_CATEGORIES", "breakdown_from_ledger", "patch_breakdown",
           "server_starts", "stock_never_ran", "engine_tables"]

BREAKDOWN_SCHEMA_VERSION = 1
#: "where the time went", in report order (``server_startup`` only when the ledger has server starts)
TIME_CATEGORIES = ("total", "benchmark_runs", "compilation", "warmup_excluding_compilation", "quality_probes",
                   "server_startup", "harness")


def _decision(m: dict[str, Any]) -> dict[str, Any]:
    return (m.get("protocol") or {}).get("decision") or {}


def _tolerance(m: dict[str, Any] | None) -> str | None:
    """The tolerance a measurement's quality verdict was judged against
    (``exact tolerance`` or ``numerics tolerance (why)``), None when quality wasn't evaluated."""
    t = ((m or {}).get("quality") or {}).get("tolerance")
    if not isinstance(t, dict):
        return None
    return f"{t.get('name')} tolerance" + (f" ({t['why']})" if t.get("name") != "exact" and t.get("why") else "")


def _tolerance_key(m: dict[str, Any] | None) -> dict[str, str]:
    """``{"quality_tolerance": ...}`` when the measurement recorded one, else
    nothing (sessions from before tolerances render byte-identically)."""
    t = _tolerance(m)
    return {} if t is None else {"quality_tolerance": t}


def breakdown_from_ledger(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Everything in the breakdown comes from ledger entries; each number cites its seq."""
    meas = [e for e in entries if e["kind"] == L.MEASUREMENT]
    verdicts = [e for e in entries if e["kind"] == L.VERDICT]
    proposals = {e.get("trial"): e for e in entries if e["kind"] == L.PROPOSAL}
    refusals = [e for e in entries if e["kind"] == L.REFUSAL]
    close = next((e for e in entries if e["kind"] == L.CLOSE), None)
    # the stock that ran (after ENABLEMENT, a failed stock measurement comes first: no protocol, verdict failed)
    stock = next((m for m in meas if m.get("action") == "measure_stock" and m.get("protocol")
                  and m.get("verdict") != "failed"), None)
    final = next((m for m in meas if m.get("action") == "final_compare"), None)
    out: dict[str, Any] = {"schema_version": BREAKDOWN_SCHEMA_VERSION}
    by_seq = {m["seq"]: m for m in meas}
    if stock and stock.get("protocol"):
        out["stock"] = {"objective_median": median_objective(stock, "value_a", "value_b"),
                        "noise": stock.get("noise"), "ledger_seq": stock["seq"]}
    if final and final.get("protocol"):
        d = _decision(final)
        q = final.get("quality") or {}
        out["final"] = {"objective_median": median_objective(final, "value_b"),
                        "stock_median_same_run": median_objective(final, "value_a"),
                        "ratio": d.get("ratio"), "ci_low": d.get("ci_low"), "ci_high": d.get("ci_high"),
                        "n_pairs": d.get("n_pairs"), "protocol_verdict": final.get("verdict"),
                        "quality_passed": q.get("passed") if q.get("evaluated") else None,
                        "quality_failed": q.get("failed", []), "ledger_seq": final["seq"],
                        **_tolerance_key(final)}
    else:
        out["final"] = {"ratio": 1.0, "note": "nothing was kept: the final stack is stock"}
    out["action_path"] = [{"trial": v["trial"], "cycle": v["cycle"], "changes": v["changes"], "ratio": v.get("ratio"),
                           "ci_low": v.get("ci_low"), "ci_high": v.get("ci_high"), "lesson": v.get("lesson"),
                           "quality_passed": v.get("quality_passed"), "ledger_seq": v["seq"],
                           **_tolerance_key(by_seq.get(v.get("measurement_seq")))}
                          for v in verdicts if v.get("kept")]
    out["rejected"] = [{"trial": v["trial"], "changes": v["changes"], "outcome": v["outcome"], "ratio": v.get("ratio"),
                        "ci_low": v.get("ci_low"), "ci_high": v.get("ci_high"), "lesson": v.get("lesson"),
                        "ledger_seq": v["seq"], **_budget_cut(by_seq.get(v.get("measurement_seq")))}
                       for v in verdicts if not v.get("kept")]
    out["refusals"] = [{"rule": r["rule"], "why": r["why"], "agent": r.get("agent"), "ledger_seq": r["seq"]} for r in refusals]
    out["unscored_keep_count"] = sum(1 for v in verdicts if v.get("kept") and v.get("quality_passed") is None)
    out["predicted_vs_measured"] = [{"trial": v["trial"], "changes": v["changes"],
                                     "predicted_gain": (proposals.get(v["trial"]) or {}).get("predicted_gain"),
                                     "measured_ratio": v.get("ratio"), "ledger_seq": v["seq"]} for v in verdicts]
    bench = sum((m.get("timings") or {}).get("timed_runs_s", 0.0) for m in meas)
    comp = sum(max(0.0, (m.get("timings") or {}).get(k) or 0.0) for m in meas
               for k in ("compile_overhead_base_s", "compile_overhead_candidate_s"))
    warm = sum((m.get("timings") or {}).get("warmup_s", 0.0) for m in meas)
    quality = sum((m.get("quality") or {}).get("seconds", 0.0) for m in meas)
    total = close["elapsed_s"] if close else (entries[-1]["ts"] - entries[0]["ts"] if entries else 0.0)
    servers = server_starts(entries)
    startup = servers["startup_s"] if servers else 0.0
    out["time_s"] = {"total": total, "benchmark_runs": bench, "compilation": comp,
                     "warmup_excluding_compilation": max(0.0, warm - comp), "quality_probes": quality,
                     **({"server_startup": startup} if servers else {}),
                     "harness": max(0.0, total - bench - warm - quality - startup)}
    if servers:  # only then: a session without servers keeps exactly its keys
        out["servers"] = servers
    out["stop_reason"] = close["stop_reason"] if close else None
    out["final_config"] = close["final_config"] if close else None
    out["stock_config"] = close["stock_config"] if close else None
    tables = engine_tables(entries, out["final_config"])
    if tables:  # only then: a session without them keeps exactly its keys
        out["final_engine_tables"] = tables
    out["close_ledger_seq"] = close["seq"] if close else None
    out["sweep"] = [{"point": m.get("point"), "cycle": m.get("cycle"), "ratio": _decision(m).get("ratio"),
                     "ci_low": _decision(m).get("ci_low"), "ci_high": _decision(m).get("ci_high"),
                     "ledger_seq": m["seq"]} for m in meas if m.get("action") == "sweep"]
    prof = next((e for e in entries if e["kind"] == "profile"), None)
    if prof:
        p = prof.get("profile") or {}
        out["profile"] = {"categories": p.get("categories"), "top_ops": (p.get("top_ops") or [])[:8],
                          "wall_s": p.get("wall_s"), "error": p.get("error"), "ledger_seq": prof["seq"]}
        if prof.get("skipped"):  # a server session that took no profile of its own, and why
            out["profile"]["skipped"] = prof["skipped"]
    roofs = [e for e in entries if e["kind"] == "roofline"]
    if roofs:
        stock_r = next((e for e in roofs if "stock" in e), {})
        final_r = next((e for e in roofs if "final" in e), {})
        out["roofline"] = {"ceilings": stock_r.get("ceilings"), "stock": stock_r.get("stock"),
                           "final": final_r.get("final"), "amdahl": final_r.get("amdahl"),
                           "kept": [{"trial": e["kept"]["trial"], "cycle": e["kept"].get("cycle"),
                                     "changes": e["kept"].get("changes"), "roofline": e["kept"]["roofline"],
                                     "ledger_seq": e["seq"]} for e in roofs if "kept" in e],
                           "ledger_seqs": [e["seq"] for e in roofs],
                           "stock_seq": stock_r.get("seq"), "final_seq": final_r.get("seq")}
    look = next((e for e in entries if e["kind"] == "kb_lookup"), None)
    if look:
        r = look.get("result") or {}
        out["warm_replay"] = {"chosen": (r.get("chosen") or {}).get("id") if isinstance(r.get("chosen"), dict) else r.get("chosen"),
                              "confidence": r.get("confidence"), "ledger_seq": look["seq"],
                              "replayed": [v["seq"] for v in verdicts if v.get("agent") == "kb-replay"]}
    out["phases"] = [{"from": e.get("from"), "to": e.get("to"), "why": e.get("why") or e.get("reason"),
                      "ledger_seq": e["seq"]} for e in entries if e["kind"] == L.PHASE]
    plat = platform_breakdown(entries)
    if plat is not None:  # only then: an older breakdown keeps exactly its keys
        out["platform"] = plat
    jit = jit_runs(entries)
    if jit:  # only then: an older breakdown keeps exactly its keys
        out["server_jit_runs"] = jit
    kb_fail = next((e for e in entries if e["kind"] == L.ERROR and e.get("failure") == "kb_write"), None)
    if kb_fail is not None:  # only then: an older breakdown keeps exactly its keys
        out["kb_write_failed"] = {"error": kb_fail.get("error"), "todo": kb_fail.get("todo"), "ledger_seq": kb_fail["seq"]}
    out.update(llm_breakdown(entries, (out.get("final") or {}).get("ratio")))  # only with LLM agents
    out.update(patch_breakdown(entries))  # source patches and the rollback drill (custom workloads)
    rungs = [e for e in entries if e["kind"] == L.ENABLEMENT_RUNG]
    if rungs:  # only then (stock failed): an older breakdown keeps exactly its keys
        out["enablement"] = [{k: e.get(k) for k in ("rung", "name", "candidate", "start", "duration_s", "outcome")}
                             | ({"pair": True} if e.get("pair") else {})  # a rung's smoke that started two servers
                             | {"ledger_seq": e["seq"]} for e in rungs]
    never = stock_never_ran(entries)
    if never is not None:  # only then: a session that measured stock has the breakdown it always had
        out["stock_never_ran"] = never
    return out


def engine_tables(entries: list[dict[str, Any]], final: dict[str, Any] | None) -> dict[str, Any]:
    """The tables the final stack's engine overlays carried (knob -> tables: vLLM's tuned fused-MoE configs),
    from the last server start that recorded each; {} when the final stack has none. The KB keeps them."""
    out: dict[str, Any] = {}
    for e in entries:
        if e["kind"] != L.SERVER_START or not final:
            continue
        for o in e.get("overlays") or ():
            knob = o.get("knob") if isinstance(o, dict) else None
            if isinstance(knob, dict) and isinstance(o.get("tables"), dict) and \
                    all(final.get(k) == v for k, v in knob.items()):
                out.update({k: o["tables"] for k in knob})
    return out


def server_starts(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The server starts (``server_start`` entries): how many, the restarts and
    failed ones, whether the compile cache was warm, the seconds they took
    (summed in ledger order), each one citing its entry; None without any."""
    starts = [e for e in entries if e["kind"] == L.SERVER_START]
    if not starts:
        return None
    warm = [((e.get("compile_cache") or {}).get("warm")) for e in starts]
    split: dict[str, float] = {}  # where the start-ups went, summed over the starts whose log said
    for e in starts:
        for k, v in ((e.get("startup_split") or {}).get("parts") or {}).items():
            split[k] = split.get(k, 0.0) + float(v)
    extra = {"split_s": split, "split_starts": sum(1 for e in starts if e.get("startup_split"))} if split else {}
    # what the first server that started (stock's, or the stack ENABLEMENT recovered it with) said it runs
    first = next((e for e in starts if not e.get("failed")), None)  # (workloads/server_says.py)
    if first and first.get("server_runs"):
        extra["stock_runs"] = {"values": {k: v.get("value") for k, v in first["server_runs"].items()},
                               "ledger_seq": first["seq"]}
    return {"starts": len(starts), "restarts": sum(1 for e in starts if str(e.get("reason", "")).startswith("restart")),
            "failed": sum(1 for e in starts if e.get("failed")), "startup_s": sum(float(e.get("startup_s") or 0.0)
                                                                               for e in starts),
            "compile_cache_warm": warm.count(True), "compile_cache_cold": warm.count(False),
            "list": [{"handle": e.get("handle"), "reason": e.get("reason"), "startup_s": e.get("startup_s"),
                      "compile_cache_warm": w, "failed": bool(e.get("failed")), "ledger_seq": e["seq"],
                      **({"split": e["startup_split"]["parts"]} if (e.get("startup_split") or {}).get("parts") else {})}
                     for e, w in zip(starts, warm)], **extra}


def _budget_cut(m: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{"error_kind": "budget"}`` for a trial whose server start the session's budget cut (not a verdict on
    its configuration: the KB does not learn it as a failure); nothing otherwise (older ledgers unchanged)."""
    return {"error_kind": "budget"} if (m or {}).get("error_kind") == "budget" else {}


def stock_never_ran(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
    """None when the ledger holds a stock measurement (``measure_stock`` with
    its paired runs); else why stock never ran: the failed stock measurement's
    error, the session's stop reason, and the ledger entry that says so."""
    stocks = [e for e in entries if e["kind"] == L.MEASUREMENT and e.get("action") == "measure_stock"]
    if any(m.get("protocol") and m.get("verdict") != "failed" for m in stocks):
        return None
    failed = stocks[-1] if stocks else None
    close = next((e for e in reversed(entries) if e["kind"] == L.CLOSE), None)
    error = f"{failed.get('error_kind') or 'error'}: {str(failed.get('error'))[:300]}" if failed else None
    stop = close.get("stop_reason") if close else None
    if stop:
        why = stop if not error or (failed and str(failed.get("error"))[:80] in stop) else f"{error}; then {stop}"
    elif error:
        why = f"the stock measurement failed ({error})"
    else:
        why = "the session stopped before PRELUDE measured stock (no stock measurement in the ledger)"
    seq = (close or failed or {}).get("seq")
    return {"why": why, "measurement_error": error, "stop_reason": stop,
            "measurement_seq": failed["seq"] if failed else None, "ledger_seq": seq}


def _unit(entries: list[dict[str, Any]]) -> str | None:
    for extra in run_extras(entries):
        obj = extra.get("objective")
        if isinstance(obj, dict):
            return str(obj.get("unit") or "")
    return None


def patch_breakdown(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The patch pipeline's part of the breakdown (custom workloads): source
    patches and the rollback drill; empty for other sessions."""
    patches = [e for e in entries if e["kind"] == "patch"]
    drill = next((e for e in reversed(entries) if e["kind"] == "rollback_drill"), None)
    boxes = [e for e in entries if e["kind"] == "sandbox"]
    if not patches and drill is None and not boxes:
        return {}
    out: dict[str, Any] = {"objective_unit": _unit(entries), "patches": [
        {k: e.get(k) for k in ("id", "title", "gate", "outcome", "rule", "why", "kept", "commit", "ratio", "ci_low",
                               "ci_high", "quality_failed", "measurement_seq")} | {"ledger_seq": e["seq"]}
        | ({"engine": True, "overlay": e.get("overlay")} if e.get("engine") else {})
        for e in patches]}
    if boxes:  # the weakest one the session ran under (a resume may run elsewhere)
        box = next((e for e in boxes if e.get("mode") == "none"), boxes[-1])
        out["sandbox"] = {k: box.get(k) for k in ("mode", "reason", "patches", "version", "isolation",
                                                  "specialist_network")} | {"ledger_seq": box["seq"]}
    if drill is not None:
        out["rollback_drill"] = {k: drill.get(k) for k in ("passed", "why", "reverted", "tree_identical", "ratio",
                                                           "ci_low", "ci_high", "n_pairs", "tolerance", "band",
                                                           "measurement_seq")} | {"ledger_seq": drill["seq"]}
        out["rollback_drill"] |= {"engine_patch": drill["engine_patch"]} if drill.get("engine_patch") else {}
    return out
