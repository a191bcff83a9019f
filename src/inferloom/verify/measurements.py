"""Re-derive one measurement entry's numbers from its pairs' raw values (``value_a`` / ``value_b``):
the log-ratios, the last look's point estimate, interval and verdict, the stop rule, and (for the A/A)
the noise block. A result names its design in ``settings.design``; one without (written before the
sequential design) is ``bonferroni``. Statistics: :mod:`inferloom.verify.stats` (bonferroni: t and
bootstrap intervals), :mod:`inferloom.verify.sequential` (sequential: trimmed-t, budget, boundaries). The
decision is re-derived from ``pairs`` alone; the pairs measured again (``remeasured``: a server's JIT compile)
are checked against their rule (:mod:`inferloom.verify.remeasured`)."""

from __future__ import annotations

import math
import statistics
from typing import Any, Mapping

from inferloom.verify import sequential as Q
from inferloom.verify import stats as S
from inferloom.verify.record import Findings
from inferloom.verify.remeasured import check_remeasured

__all__ = ["check_measurement", "decision_of", "median_of"]


def decision_of(m: Mapping[str, Any]) -> dict[str, Any]:
    """The last look's decision of a measurement entry (empty when it has none)."""
    return dict((m.get("protocol") or {}).get("decision") or {})


def median_of(m: Mapping[str, Any], *arms: str) -> float:
    """Median of the raw values of the given arms (``value_a``, ``value_b``) over the measurement's pairs."""
    return statistics.median(float(p[arm]) for p in m["protocol"]["pairs"] for arm in arms)


def _log(x: Any) -> float:
    return math.log(float(x)) if isinstance(x, (int, float)) and x > 0 else -math.inf


def _endpoint(f: Findings, group: str, name: str, recorded: Any, exact: float, band: tuple[float, float],
              seq: int) -> None:
    """A bootstrap-derived endpoint: bit-for-bit with the recorded seed, else inside its Monte-Carlo band."""
    if S.close(recorded, math.exp(exact)):
        f.add(group, name, recorded, math.exp(exact), seq, True, "exact (recorded seed)")
        return
    lo, hi = band
    ok = isinstance(recorded, (int, float)) and lo - 1e-12 <= _log(recorded) <= hi + 1e-12
    f.add(group, name, recorded, f"[{math.exp(lo):.9g}, {math.exp(hi):.9g}]", seq, ok,
          f"Monte-Carlo band ({S.MC_SEEDS} seeds, {S.MC_LEVEL:.2%})")


def _interval(f: Findings, group: str, seq: int, st: Mapping[str, Any], dec: Mapping[str, Any],
              a: list[float], b: list[float], n_looks: int, final: bool) -> S.Recomputed:
    r = S.recompute(a, b, confidence=float(st["confidence"]), n_looks=n_looks, min_gain=float(st["min_gain"]),
                    resamples=int(st["bootstrap_resamples"]), seed=int(st["bootstrap_seed"]),
                    t_guard=bool(st.get("t_guard", True)), final=final)
    for key, val in (("mean_log", r.mean_log), ("sd_log", r.sd_log), ("ratio", r.ratio),
                     ("confidence_per_look", r.level)):
        f.add(group, f"decision.{key}", dec.get(key), val, seq, S.close(dec.get(key), val))
    f.add(group, "decision.n_looks", dec.get("n_looks"), n_looks, seq, dec.get("n_looks") == n_looks)
    if r.t_lo is not None:
        for key, val in (("t_ci_low", r.t_lo), ("t_ci_high", r.t_hi)):
            f.add(group, f"decision.{key}", dec.get(key), math.exp(val), seq, S.close(dec.get(key), math.exp(val)))
    blo_band, bhi_band = S.mc_band(a, b, r.level, int(st["bootstrap_resamples"]), int(st["bootstrap_seed"]))
    _endpoint(f, group, "decision.boot_ci_low", dec.get("boot_ci_low"), r.boot_lo, blo_band, seq)
    _endpoint(f, group, "decision.boot_ci_high", dec.get("boot_ci_high"), r.boot_hi, bhi_band, seq)
    lo_band, hi_band = blo_band, bhi_band
    if r.t_lo is not None and r.t_hi is not None:  # the union with the t interval
        lo_band = (min(blo_band[0], r.t_lo), min(blo_band[1], r.t_lo))
        hi_band = (max(bhi_band[0], r.t_hi), max(bhi_band[1], r.t_hi))
    _endpoint(f, group, "decision.ci_low", dec.get("ci_low"), r.lo, lo_band, seq)
    _endpoint(f, group, "decision.ci_high", dec.get("ci_high"), r.hi, hi_band, seq)
    return r


def _stop_rule(f: Findings, seq: int, st: Mapping[str, Any], proto: Mapping[str, Any], looks_at: list[int],
               stop_early: bool) -> None:
    """Each recorded look's verdict follows from its own recorded interval; the run stopped at the first
    decisive look (the A/A runs every pair)."""
    looks = list(proto.get("looks") or [])
    for i, lk in enumerate(looks):
        want = S.rule(_log(lk.get("ci_low")), _log(lk.get("ci_high")), float(st["min_gain"]),
                      bool(lk.get("final")))
        f.add("verdict rule", f"look {i + 1} verdict (n={lk.get('n_pairs')})", lk.get("verdict"), want, seq,
              lk.get("verdict") == want, "rule on recorded interval")
        if stop_early and i < len(looks) - 1:
            f.add("verdict rule", f"look {i + 1} did not stop the run", lk.get("verdict"), "continue", seq,
                  lk.get("verdict") == "continue", "stop rule")
    got = [lk.get("n_pairs") for lk in looks]
    f.add("verdict rule", "looks at the planned pair counts", got, looks_at[:len(got)], seq, got == looks_at[:len(got)])


def check_measurement(f: Findings, m: Mapping[str, Any], group: str) -> None:
    """Every number of one measurement entry that has a protocol result with a decision."""
    seq = int(m["seq"])
    proto = m.get("protocol") or {}
    dec = decision_of(m)
    st = proto["settings"]
    pairs = list(proto.get("pairs") or [])  # the counted pairs: a pair measured again is in none of the looks
    check_remeasured(f, proto, seq)  # written before the rule (no ``remeasured``): nothing checked, as before
    if proto.get("verdict") == "failed" and isinstance(dec.get("n_pairs"), int):
        pairs = pairs[:dec["n_pairs"]]  # a run failed after the last look: that look saw only these pairs
    for i, p in enumerate(pairs):
        va, vb = float(p["value_a"]), float(p["value_b"])
        if not (va > 0 and vb > 0 and math.isfinite(va) and math.isfinite(vb)):
            f.add("pairs", f"pair {i} values positive", (va, vb), "positive finite", seq, False)
            return
        want = math.log(vb) - math.log(va)
        f.add("pairs", f"pair {i} log_ratio", p.get("log_ratio"), want, seq,
              S.close(p.get("log_ratio"), want, 1e-9) or math.isclose(p.get("log_ratio"), want, abs_tol=1e-12))
    looks_at = S.planned_looks(int(st["min_pairs"]), int(st["max_pairs"]), int(st["pair_step"]))
    f.add(group, "decision.n_pairs", dec.get("n_pairs"), len(pairs), seq, dec.get("n_pairs") == len(pairs))
    if len(pairs) < 2 or dec.get("n_pairs") != len(pairs):
        return
    final = bool(dec.get("final")) if proto.get("verdict") == "failed" else len(pairs) == int(st["max_pairs"])
    if st.get("design", "bonferroni") != "sequential":  # sequential: the budget decides; checked per look
        f.add(group, "decision.final", dec.get("final"), final, seq, dec.get("final") == final)
    a = [float(p["value_a"]) for p in pairs]
    b = [float(p["value_b"]) for p in pairs]
    if st.get("design", "bonferroni") == "sequential":
        _sequential(f, group, seq, st, proto, m, [math.log(y) - math.log(x) for x, y in zip(a, b)], looks_at)
        return
    _interval(f, group, seq, st, dec, a, b, len(looks_at), final)
    want = S.rule(_log(dec.get("ci_low")), _log(dec.get("ci_high")), float(st["min_gain"]), final)
    f.add("verdict rule", "decision.verdict", dec.get("verdict"), want, seq, dec.get("verdict") == want,
          "rule on recorded interval")
    if proto.get("verdict") != "failed":
        f.add("verdict rule", "protocol.verdict", proto.get("verdict"), dec.get("verdict"), seq,
              proto.get("verdict") == dec.get("verdict") == m.get("verdict"))
    _stop_rule(f, seq, st, proto, looks_at, stop_early=m.get("action") != "measure_stock")
    if m.get("action") == "measure_stock" and isinstance(m.get("noise"), Mapping):
        check_noise(f, m["noise"], dec, [math.log(y) - math.log(x) for x, y in zip(a, b)], seq)


def _near(recorded: Any, want: float, tol: float) -> bool:
    return isinstance(recorded, (int, float)) and not isinstance(recorded, bool) and abs(_log(recorded) - want) <= tol


def _sequential(f: Findings, group: str, seq: int, st: Mapping[str, Any], proto: Mapping[str, Any],
                m: Mapping[str, Any], d: list[float], looks_at: list[int]) -> None:
    """Every recorded look of a sequential-design result, recomputed from the pairs (the A/A: every look,
    budget ``max_pairs``); the rule on each recorded interval; the stop at the first decisive look."""
    aa = m.get("action") == "measure_stock"
    looks = list(proto.get("looks") or [])
    harm = None if aa else Q.recompute_harm(d, st)
    recorded_harm = [lk.get("n_pairs") for lk in looks if lk.get("stop") == "harm"]
    if float(st.get("harm_ratio") or 0.0) > 0.0 and not aa:
        f.add("verdict rule", "harm stop before the first look", recorded_harm, [harm.n_pairs] if harm else [], seq,
              recorded_harm == ([harm.n_pairs] if harm else []), "harm stop rule")
    if harm is not None:
        _harm(f, group, seq, proto, m, looks, harm, len(d))
        return
    want = Q.recompute_looks(d, st, [n for n in looks_at if n <= len(d)], every_pair=aa)
    f.add("verdict rule", "looks at the planned pair counts", [lk.get("n_pairs") for lk in looks],
          [r.n_pairs for r in want][:len(looks)], seq, [lk.get("n_pairs") for lk in looks] == [r.n_pairs for r in want][:len(looks)])
    g = Q.keep_log_threshold(st)
    for i, (lk, r) in enumerate(zip(looks, want)):
        name = f"look {i + 1} (n={r.n_pairs})"
        for key, val in (("mean_log", r.mean), ("se_log", r.se), ("sigma_budget", r.sigma), ("info_fraction", r.t),
                         ("alpha_spent", r.alpha_spent), ("beta_spent", r.beta_spent)):
            f.add(group, f"{name} {key}", lk.get(key), val, seq, S.close(lk.get(key), val))
        for key, val in (("df", r.df), ("budget", r.budget), ("final", r.final)):
            f.add(group, f"{name} {key}", lk.get(key), val, seq, lk.get(key) == val)
        f.add(group, f"{name} crit_keep_z", lk.get("crit_keep_z"), r.c_z, seq,
              isinstance(lk.get("crit_keep_z"), (int, float)) and abs(lk["crit_keep_z"] - r.c_z) <= Q.Z_TOL,
              f"boundary by another quadrature, within {Q.Z_TOL:g}")
        tol = 2.0 * Q.Z_TOL * r.se + 1e-12
        for key, val in (("ci_low", r.lo), ("ci_high", r.hi)):
            f.add(group, f"{name} {key}", lk.get(key), math.exp(val), seq, _near(lk.get(key), val, tol),
                  "carries the boundary's tolerance")
        fh, fg = lk.get("futility_high"), lk.get("futility_gain")
        rule = ("keep" if _log(lk.get("ci_low")) > g else "revert" if _log(lk.get("ci_high")) < g
                or (fh is not None and fg is not None and _log(fh) < _log(fg))
                else "inconclusive" if lk.get("final") else "continue")
        f.add("verdict rule", f"{name} verdict", lk.get("verdict"), rule, seq, lk.get("verdict") == rule,
              "rule on recorded interval and futility bound")
        f.add("verdict rule", f"{name} verdict recomputed", lk.get("verdict"), r.verdict, seq, lk.get("verdict") == r.verdict)
        if not aa and i < len(looks) - 1:
            f.add("verdict rule", f"{name} did not stop the run", lk.get("verdict"), "continue", seq,
                  lk.get("verdict") == "continue", "stop rule")
    dec = decision_of(m)
    if proto.get("verdict") != "failed":
        f.add("verdict rule", "protocol.verdict", proto.get("verdict"), dec.get("verdict"), seq,
              proto.get("verdict") == dec.get("verdict") == m.get("verdict"))
    if aa and isinstance(m.get("noise"), Mapping) and want:
        check_noise(f, m["noise"], dec, d[:want[-1].n_pairs], seq, mean=want[-1].mean)


def _harm(f: Findings, group: str, seq: int, proto: Mapping[str, Any], m: Mapping[str, Any],
          looks: list[Mapping[str, Any]], r: Q.HarmRecomputed, n_pairs: int) -> None:
    """A harm stop: the only look, on the last pair, a revert; its numbers recomputed."""
    lk = looks[-1] if looks else {}
    f.add("verdict rule", "the harm stop is the only look, on the last pair", [x.get("n_pairs") for x in looks],
          [r.n_pairs], seq, [x.get("n_pairs") for x in looks] == [r.n_pairs] == [n_pairs], "stop rule")
    name = f"harm stop (n={r.n_pairs})"
    for key, val in (("mean_log", r.mean), ("sd_log", r.sd_log), ("harm_sd", r.sd)):
        f.add(group, f"{name} {key}", lk.get(key), val, seq, S.close(lk.get(key), val))
    f.add(group, f"{name} harm_bound", lk.get("harm_bound"), math.exp(r.bound), seq,
          S.close(lk.get("harm_bound"), math.exp(r.bound)))
    for key, val in (("verdict", "revert"), ("stop", "harm")):
        f.add("verdict rule", f"{name} {key}", lk.get(key), val, seq, lk.get(key) == val, "harm stop rule")
    if proto.get("verdict") != "failed":
        f.add("verdict rule", "protocol.verdict", proto.get("verdict"), "revert", seq,
              proto.get("verdict") == "revert" == m.get("verdict"))


def check_noise(f: Findings, noise: Mapping[str, Any], dec: Mapping[str, Any], d: list[float], seq: int,
                mean: float | None = None) -> None:
    """The A/A noise block: sd of the log-ratios, the interval's half width, the ratio and interval
    (``mean``: the design's effect estimate, the trimmed mean for the sequential design)."""
    plain = math.fsum(d) / len(d)
    mean = plain if mean is None else mean
    sd = math.sqrt(math.fsum((x - plain) ** 2 for x in d) / (len(d) - 1))
    half = (_log(dec.get("ci_high")) - _log(dec.get("ci_low"))) / 2.0
    want = {"n_pairs": len(d), "sd_log_ratio": sd, "sd_run_est": sd / math.sqrt(2.0), "ratio": math.exp(mean),
            "ci_half_width_log": half, "ci_half_width_pct": math.expm1(half) * 100.0,
            "ci_low": dec.get("ci_low"), "ci_high": dec.get("ci_high"),
            "contains_one": _log(dec.get("ci_low")) <= 0.0 <= _log(dec.get("ci_high"))}
    for key, val in want.items():
        got = noise.get(key)
        ok = got == val if isinstance(val, (bool, int)) and not isinstance(val, float) else S.close(got, val)
        f.add("A/A noise", f"noise.{key}", got, val, seq, ok)
