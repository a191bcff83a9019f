"""Calibrate the measurement protocol on synthetic sources with a known truth.

For each noise model and true ratio, simulate many protocol runs and count the
verdicts: the false-keep rate (a keep at a true ratio of 1.00, or just under
the minimum gain), the power (keeps at a real gain) and the mean pairs used.
The sequential design (the default) is run through the same pure function the
protocol uses (:func:`inferloom.measure.protocol.sequential_decision`); the
legacy Bonferroni/bootstrap design (``--legacy``, slower) through
:func:`inferloom.measure.protocol.decide`. Each simulated session also gets
an A/A (stock against itself, ``max_pairs`` pairs, same noise model): its sd
is the budget's prior and its floor, and the session keep rule
(:func:`inferloom.measure.keep_rule.session_keep`: protocol keep and the
interval's lower end above ``(1 + min_gain)(1 + floor)``, ``floor`` from
:func:`inferloom.measure.keep_rule.aa_floor`) is applied in the ``session keep``
column. Two other rules are shown beside it for the choice (docs/protocol.md): ``point
floor``, the same rule with the plain ``exp(|log ratio_AA|) - 1`` as the floor,
and ``before``, the rule before issue 21's instance-effect fix (the protocol
without a floor, then ``ci_low - 1 > max(min_gain, |ratio_AA - 1|)``).
Noise models (per-run log-throughput):

* ``gauss1/3/5``: Gaussian, sd 1/3/5% per run;
* ``t3``: Student t with 3 d.f., scale 5% (heavy tails);
* ``drift``: 3% Gaussian plus a drift shared by both arms, -25% over the run;
* ``order``: 3% Gaussian plus a 4% advantage for whichever run goes second;
* ``stalls``: 2% Gaussian plus 10% of runs stalling (40% slower);
* ``instance1/3``: 1% / 3% Gaussian plus an instance effect: one arm's
  instance is 3-6% slower (uniform, drawn per session) for its whole life: in
  the A/A a random one of the two stock instances, in the trial the baseline's
  (the direction that favours the candidate: the worst case);
* ``loaded``: a twice-loaded machine: 20% Gaussian plus 10% of runs stalling
  to half speed (per-pair sd about 0.41, as a 2x loaded CPU measured);
* ``loaded_t3``: Student t with 3 d.f., scale 15% (heavy tails on a loaded machine);
* ``gpu_stalls``: 0.7% Gaussian plus 5% of runs 22% slower (one H100, OLMoE on vLLM, 2026-12-05: 2 of
  ~40 timed runs were 19-25% slow; docs/benchmarks.md section 26).

The harm stop (``protocol.harm_ratio``; before the first look, every pair grossly slower: revert) is in
the session's protocol as ``run_paired`` has it (:func:`inferloom.measure.protocol.first_harm_stop` on the
pairs before the first look, then :func:`sequential_decision`): ``harm stop`` is its rate, ``keep lost``
the keeps it took away (the session would have kept without it: its whole cost in power), ``pairs, no
harm`` the mean pairs without it. ``--harm-only`` measures the harm stop alone on many more sessions
(it needs no look; a session can harm-stop only if its first two pairs are below the harm ratio, so only
those are asked), with the A/A on ``--aa-pairs`` pairs or none (``--aa-pairs 0``: the fallback sd).

    PYTHONPATH=src .venv/bin/python benchmarks/protocol_calibration.py --trials 2000
    PYTHONPATH=src .venv/bin/python benchmarks/protocol_calibration.py --harm-only --trials 200000 --aa-pairs 7
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import replace
from typing import Any

import numpy as np

from inferloom.measure.keep_rule import aa_floor, session_keep
from inferloom.measure.protocol import ProtocolSettings, decide, first_harm_stop, planned_looks, sequential_decision

MODELS: dict[str, dict[str, Any]] = {
    "gauss1": {"noise": 0.01}, "gauss3": {"noise": 0.03}, "gauss5": {"noise": 0.05},
    "t3": {"noise": 0.05, "t3": True}, "drift": {"noise": 0.03, "drift": -0.25},
    "order": {"noise": 0.03, "order": 0.04}, "stalls": {"noise": 0.02, "stall_p": 0.10, "stall": 0.40},
    "instance1": {"noise": 0.01, "instance": (0.03, 0.06)}, "instance3": {"noise": 0.03, "instance": (0.03, 0.06)},
    "loaded": {"noise": 0.20, "stall_p": 0.10, "stall": 1.0}, "loaded_t3": {"noise": 0.15, "t3": True},
    "gpu_stalls": {"noise": 0.007, "stall_p": 0.05, "stall": 0.22},
}
LABELS = {"gauss1": "1% Gaussian", "gauss3": "3% Gaussian", "gauss5": "5% Gaussian", "t3": "5% scale, t 3 d.f.",
          "drift": "3% + shared drift -25%", "order": "3% + 4% order effect", "stalls": "2% + 10% stalls (40% slower)",
          "instance1": "1% + instance effect 3-6%", "instance3": "3% + instance effect 3-6%",
          "loaded": "2x loaded: 20% + 10% half-speed stalls", "loaded_t3": "2x loaded: t 3 d.f., scale 15%",
          "gpu_stalls": "0.7% + 5% of runs 22% slower (the H100 OLMoE runs)"}


def simulate(model: dict[str, Any], ratio: float, trials: int, pairs: int, rng: np.random.Generator,
             *, aa: bool = False, inst: np.ndarray | None = None) -> np.ndarray:
    """Paired log-ratios ``log(B/A)``, shape (trials, pairs), pair ``i`` in order AB (even i) or BA (odd i)."""
    idx = np.arange(pairs)
    pos_a = np.where(idx % 2 == 0, 2 * idx, 2 * idx + 1)  # run index of A within the whole protocol run
    pos_b = np.where(idx % 2 == 0, 2 * idx + 1, 2 * idx)

    def noise() -> np.ndarray:
        if model.get("t3"):
            return model["noise"] * rng.standard_t(3, size=(trials, pairs))
        return model["noise"] * rng.standard_normal((trials, pairs))

    ya, yb = noise(), noise() + math.log(ratio)
    if "drift" in model:
        drift = np.log1p(model["drift"] * np.arange(2 * pairs) / (2 * pairs - 1))
        ya, yb = ya + drift[pos_a], yb + drift[pos_b]
    if "order" in model:
        second = math.log1p(model["order"])
        ya, yb = ya + np.where(pos_a % 2 == 1, second, 0.0), yb + np.where(pos_b % 2 == 1, second, 0.0)
    if "stall_p" in model:
        slow = -math.log1p(model["stall"])
        ya = ya + np.where(rng.random((trials, pairs)) < model["stall_p"], slow, 0.0)
        yb = yb + np.where(rng.random((trials, pairs)) < model["stall_p"], slow, 0.0)
    if inst is not None:
        slow = np.log1p(-inst)[:, None]
        if aa:  # a random one of the two stock instances
            which = rng.random(trials) < 0.5
            ya, yb = ya + np.where(which[:, None], slow, 0.0), yb + np.where(which[:, None], 0.0, slow)
        else:  # the baseline's instance: the candidate looks faster
            ya = ya + slow
    return yb - ya


def run_cell(model: dict[str, Any], ratio: float, trials: int, settings: ProtocolSettings, seed: int,
             legacy: bool = False, variants: tuple[str, ...] = ("session_keep", "point_keep", "old_keep")
             ) -> dict[str, float]:
    """Verdict rates of one cell. ``keep``: the protocol's own keep without a floor (a bench without a
    session); ``session_keep`` and revert / inconclusive / pairs: the session's protocol (``aa_floor`` in its
    keep threshold) and keep rule; ``point_keep``, ``old_keep``: the alternatives."""
    rng = np.random.default_rng(seed)
    inst = rng.uniform(*model["instance"], size=trials) if "instance" in model else None
    d = simulate(model, ratio, trials, settings.max_pairs, rng, inst=inst)
    d_aa = simulate(model, 1.0, trials, settings.max_pairs, rng, aa=True, inst=inst)
    looks = planned_looks(settings)
    counts = {"keep": 0, "revert": 0, "inconclusive": 0, "session_keep": 0, "point_keep": 0, "old_keep": 0,
              "harm": 0, "keep_lost": 0}
    pairs = pairs_no_harm = 0
    for i in range(trials):
        aa = sequential_decision(d_aa[i], settings, every_pair=True)  # the A/A's final look, as a session has it
        noise = {"ratio": math.exp(aa.mean), "ci_low": math.exp(aa.lo), "ci_high": math.exp(aa.hi)}
        floors = {"session_keep": aa_floor(noise), "point_keep": math.expm1(abs(aa.mean))}
        if legacy:
            for n in looks:
                dec = decide(d[i, :n], settings, final=n == settings.max_pairs, n_looks=len(looks))
                if dec.verdict != "continue":
                    break
            counts[dec.verdict] += 1
            pairs += dec.n_pairs
            counts["old_keep"] += dec.verdict == "keep" and dec.ci_low - 1.0 > abs(math.exp(aa.mean) - 1.0)
            for key, floor in floors.items():
                counts[key] += session_keep(protocol_verdict=dec.verdict, quality_passed=True, ci_low=dec.ci_low,
                                            min_gain=settings.min_gain, floor=floor)
            continue
        st = replace(settings, prior_sd=float(np.std(d_aa[i], ddof=1)), prior_df=settings.max_pairs - 1)
        for key, floor in floors.items():  # the session's protocol: the floor is in its keep threshold
            if key in variants:
                sf = replace(st, floor=floor)
                lk = sequential_decision(d[i], sf)
                kept = session_keep(protocol_verdict=lk.verdict, quality_passed=True, ci_low=math.exp(lk.lo),
                                    min_gain=settings.min_gain, floor=floor)
                harm = first_harm_stop(d[i, :settings.min_pairs - 1], sf) if key == "session_keep" else None
                counts[key] += kept and harm is None
                if key == "session_keep":  # its keep is session_keep (the same rule); the rest of its verdicts
                    pairs_no_harm += lk.n_pairs
                    if harm is not None:  # run_paired ends at the harm stop: a revert
                        counts["harm"] += 1
                        counts["keep_lost"] += kept
                        counts["revert"] += 1
                        pairs += harm.n_pairs
                    else:
                        counts[lk.verdict] += lk.verdict != "keep"
                        pairs += lk.n_pairs
        if "old_keep" in variants:  # the rule before: the protocol without a floor, then max(min_gain, |r - 1|)
            lk = sequential_decision(d[i], st)
            counts["old_keep"] += lk.verdict == "keep" and math.exp(lk.lo) - 1.0 > abs(math.exp(aa.mean) - 1.0)
            counts["keep"] += lk.verdict == "keep"
    return {k: v / trials for k, v in counts.items()} | {"pairs": pairs / trials, "pairs_no_harm": pairs_no_harm / trials}


def harm_cell(model: dict[str, Any], ratio: float, trials: int, settings: ProtocolSettings, seed: int,
              aa_pairs: int) -> dict[str, float]:
    """The harm stop alone (``--harm-only``): its rate and the mean pairs to it, on ``trials`` sessions whose A/A
    ran ``aa_pairs`` pairs (0: no A/A). A stop needs every pair below the harm ratio, so a session whose first
    two pairs are not is not asked (exact, and what makes 10^5-10^6 sessions take seconds)."""
    rng = np.random.default_rng(seed)
    inst = rng.uniform(*model["instance"], size=trials) if "instance" in model else None
    k_max = settings.min_pairs - 1
    d = simulate(model, ratio, trials, k_max, rng, inst=inst)
    sd = np.std(simulate(model, 1.0, trials, aa_pairs, rng, aa=True, inst=inst), axis=1, ddof=1) if aa_pairs >= 2 \
        else None
    maybe = np.flatnonzero(np.all(d[:, :2] < math.log(settings.harm_ratio), axis=1))
    stops, pairs = 0, 0
    for i in maybe:
        st = settings if sd is None else replace(settings, prior_sd=float(sd[i]), prior_df=aa_pairs - 1)
        h = first_harm_stop(d[i], st)
        if h is not None:
            stops += 1
            pairs += h.n_pairs
    return {"harm": stops / trials, "stops": stops, "asked": len(maybe),
            "pairs_to_stop": pairs / stops if stops else float("nan"),
            "mean_pairs_before_look": (pairs + (trials - stops) * settings.min_pairs) / trials}


def harm_main(args: Any, settings: ProtocolSettings) -> None:
    print(f"harm stop alone: {args.trials} sessions per cell, A/A on {args.aa_pairs or 'no'} pairs, harm_ratio "
          f"{settings.harm_ratio}, min_pairs {settings.min_pairs}; a zero count's 95% upper bound is 3/{args.trials}\n")
    print("| noise model | true ratio | harm stop | stops / sessions | mean pairs to a stop | mean pairs to the first look or the stop |")
    print("| --- | --- | --- | --- | --- | --- |")
    for mi, name in enumerate(args.models.split(",")):
        ratios = args.ratios if args.ratios != "auto" else "1.00,1.05,0.50,0.30,0.10,0.03"
        for ri, r in enumerate(float(x) for x in ratios.split(",")):
            t0 = time.perf_counter()
            c = harm_cell(MODELS[name], r, args.trials, settings, seed=7_000 + 1_000 * mi + ri, aa_pairs=args.aa_pairs)
            print(f"| {LABELS[name]} | {r:.3f} | {c['harm']:.4%} | {c['stops']} / {args.trials} | "
                  f"{c['pairs_to_stop']:.2f} | {c['mean_pairs_before_look']:.2f} |  <!-- {time.perf_counter() - t0:.0f}s -->",
                  flush=True)


def mc_error(p: float, n: int) -> float:
    """Binomial standard error of a rate ``p`` over ``n`` trials (at least that of one event)."""
    return math.sqrt(max(p, 1.0 / n) * (1 - max(p, 1.0 / n)) / n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=2000, help="simulated protocol runs per cell")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--ratios", default="auto", help="comma-separated true ratios B/A; auto: 1.00, 1.009 (just "
                    "under the +1%% minimum gain), 1.05, and for 3%% Gaussian also 1.03 and 1.10")
    ap.add_argument("--legacy", action="store_true", help="the legacy design (Bonferroni looks, bootstrap + t)")
    ap.add_argument("--resamples", type=int, default=999, help="bootstrap resamples (legacy only)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a protocol setting")
    ap.add_argument("--variants", default="session_keep,point_keep,old_keep",
                    help="the keep rules to run (fewer: faster; `keep`, `before` come with old_keep, `point floor` with point_keep)")
    ap.add_argument("--harm-only", action="store_true", help="the harm stop alone, on many sessions (no looks)")
    ap.add_argument("--aa-pairs", type=int, default=30, help="--harm-only: the A/A's pairs (0: no A/A)")
    args = ap.parse_args()
    over: dict[str, Any] = {}
    for kv in args.set:
        k, v = kv.split("=", 1)
        over[k] = type(getattr(ProtocolSettings(), k))(v) if not isinstance(getattr(ProtocolSettings(), k), bool) \
            else v.lower() in ("1", "true", "yes")
    if args.legacy:
        over = {"design": "bonferroni", "confidence": 0.95, "min_pairs": 5, "max_pairs": 15, "pair_step": 2,
                "bootstrap_resamples": args.resamples, **over}
    settings = ProtocolSettings(**over)
    print(f"settings: {settings.to_dict()}")
    if args.harm_only:
        harm_main(args, settings)
        return
    print(f"{args.trials} trials per cell; Monte-Carlo standard error of a rate p: sqrt(p(1-p)/{args.trials}) "
          f"(0.22 points at 1%)\n")
    print("| noise model | true ratio | keep | session keep | point floor | before | revert | inconclusive | mean pairs "
          "| harm stop | keep lost | pairs, no harm |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    t_all = time.perf_counter()
    for mi, name in enumerate(args.models.split(",")):
        ratios = args.ratios if args.ratios != "auto" else \
            ("1.00,1.009,1.03,1.05,1.10" if name == "gauss3" else "1.00,1.009,1.05")
        for ri, r in enumerate(float(x) for x in ratios.split(",")):
            t0 = time.perf_counter()
            c = run_cell(MODELS[name], r, args.trials, settings, seed=1_000 * mi + ri, legacy=args.legacy,
                         variants=tuple(args.variants.split(",")))
            ran = set(args.variants.split(",")) | ({"old_keep", "point_keep"} if args.legacy else set())
            col = {k: f"{c[k]:.2%}" if (k if k != "keep" else "old_keep") in ran else "-"
                   for k in ("keep", "session_keep", "point_keep", "old_keep")}
            print(f"| {LABELS[name]} | {r:.3f} | {col['keep']} | {col['session_keep']} | {col['point_keep']} | "
                  f"{col['old_keep']} | {c['revert']:.1%} | "
                  f"{c['inconclusive']:.1%} | {c['pairs']:.1f} | {c['harm']:.2%} | {c['keep_lost']:.2%} | "
                  f"{c['pairs_no_harm']:.1f} |  <!-- {time.perf_counter() - t0:.0f}s -->",
                  flush=True)
    print(f"\ntotal {time.perf_counter() - t_all:.0f}s")


if __name__ == "__main__":
    main()
