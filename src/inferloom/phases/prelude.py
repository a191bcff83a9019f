"""PRELUDE: the stock baseline with its A/A noise floor (stock against a
second instance of itself), then a warm replay from the knowledge base, then
a profile of one (untimed) stock run and the roofline; then FRAMEWORK (or
ENABLEMENT when stock fails). One of these per tick.

Warm replay: the best recipe found by the relaxed lookup above the confidence
threshold is measured against stock (paired, quality-checked, as any trial)
and adopted as the starting stack only if it reproduces at least
``replay_fraction`` of its recorded gain (in log space); otherwise the recipe
is marked ``drift`` in the KB and the session starts from stock. Past failures
become priors that rank proposals down (``kb_failures``), never bans.
"""

from __future__ import annotations

import datetime as _dt
import math
from typing import Any

from inferloom.frameworks import SERVER_PROFILE_SKIPPED, framework
from inferloom.measure.slo_bound import slo_binding
from inferloom.kb import KBError, RecipeStore, WorkloadKey
from inferloom.measure.profile import profile_config
from inferloom.measure.ceilings import _cpu_name, measure_ceilings
from inferloom.phases.common import jsonable as _jsonable
from inferloom.measure.metrics import median_objective
from inferloom.measure.quality_floor import floor_from_quality
from inferloom.phases.common import seed_base as _seed_base
from inferloom.phases.common import step_key as _key
from inferloom.measure.compare import compare, reference_sets, stock_references
from inferloom.phases.context import SessionContext
from inferloom.phases import server_profile as SP
from inferloom.phases.backend_choice import kernel_backend
from inferloom.phases.roofline import PROFILE, ROOFLINE, kept_roofline, roofline_for, roofline_skip
from inferloom.phases.trial import execute_trial, run_trial
from inferloom.session import ledger as L
from inferloom.session.state import PendingAction, Phase, SessionState
from inferloom.session.state_models import (
    Ceilings,
    ProfileSummary,
    RooflineStock,
    StockFailure,
    StockObjective,
    Trial,
    WarmReplay,
)
from inferloom.phases.audit import record_audit
from inferloom.spec import objective_label
from inferloom.errors import InferloomError
from inferloom.workloads.base import AAQuality, ConfigError, EngineTables, ServerReuse, config_key, resolve_config

__all__ = ["prelude_step", "replay_step", "profile_step", "KB_LOOKUP", "SERVER_PROFILE_SKIPPED"]

KB_LOOKUP = "kb_lookup"


def prelude_step(ctx: SessionContext, st: SessionState) -> None:
    """One PRELUDE tick: stock, then the warm replay, then the profile, then FRAMEWORK."""
    so = st.extra.stock_objective
    if so is None:
        record_audit(ctx, st, "PRELUDE")
        _measure_stock(ctx, st)
    elif st.extra.warm_replay is None:
        replay_step(ctx, st)
    elif st.extra.profile is None:
        profile_step(ctx, st)
    else:
        st.cycle = 1
        st.extra.cycle_started_at = ctx.clock()
        ctx.enter_phase(st, Phase.FRAMEWORK, f"stock {so.median:,.1f} {objective_label(ctx.spec)}; A/A floor "
                      f"{abs((st.noise_floor or {}).get('ratio', 1.0) - 1) * 100:.2f}%; starting stack "
                      + ("from the knowledge base" if st.stack != st.stock_config else "stock"))


def _measure_stock(ctx: SessionContext, st: SessionState) -> None:
    key = _key("measure_stock", st.session_id, st.extra.enablement_round or 0)
    st.pending_action = PendingAction(action="measure_stock", key=key)
    ctx.save(st)
    ctx.progress("PRELUDE: stock baseline and A/A noise floor (stock against itself)")
    # an adapter whose outputs vary between identical instances (AAQuality): its A/A also measures the
    # quality contract, and that disagreement is every later candidate's floor (measure.quality_floor)
    aa_sets = tuple(ctx.adapter.aa_quality_sets) if isinstance(ctx.adapter, AAQuality) else ()
    aa_quality = bool(aa_sets)
    res, seq = ctx.measured(key, L.MEASUREMENT, lambda: {
        "action": "measure_stock", **compare(
            ctx.adapter, ctx.spec, st.stock_config, st.stock_config, settings=ctx.settings,
            seed_base=_seed_base(ctx.spec.seed, 0), refs=ctx.refs if aa_quality else None, progress=ctx.progress,
            stop_early=False, labels=("stock", "stock-2"), quality_sets=aa_sets,
            stock_is_base=aa_quality).as_dict()})
    st.pending_action = None
    if res["verdict"] == "failed":
        st.extra.stock_failure = StockFailure(error=res.get("error"), kind=res.get("error_kind", "error"), seq=seq)
        ctx.enter_phase(st, Phase.ENABLEMENT, f"stock failed: {res.get('error')}")
        return
    stock = median_objective(res, "value_a", "value_b")
    st.noise_floor = {**res["noise"], "ledger_seq": seq}
    floor = floor_from_quality(res.get("quality"))
    if floor:  # the server's own A/A disagreement per prompt set: the quality floor
        st.noise_floor["quality"] = floor
        ctx.progress("PRELUDE: A/A quality floor (stock-2 against stock): " + "; ".join(
            f"{n} top-1 {v.get('top1_agreement', float('nan')):.4f}, KL {v.get('mean_kl', float('nan')):.4g}, "
            f"greedy {v.get('greedy_agreement', float('nan')):.4f}" for n, v in floor.items()))
    batched = {q.get("set_name"): ((q.get("details") or {}).get("batched") or {}).get("values")
               for q in (res.get("quality") or {}).get("sets") or []}
    if any(batched.values()):  # all prompts in one request (measure/batched_quality.py): the server's batch noise
        ctx.progress("PRELUDE: batch-composition noise (stock-2, all prompts in one request, against stock): " + "; ".join(
            f"{n} top-1 {v['top1_agreement']:.4f}, KL {v['mean_kl']:.4g}, greedy {v['greedy_agreement']:.4f}"
            for n, v in batched.items() if v))
    st.extra.stock_objective = StockObjective(median=stock, n_runs=2 * len(res["protocol"]["pairs"]), ledger_seq=seq)
    if config_key(st.stock_config) not in st.measured_config_keys:
        st.measured_config_keys.append(config_key(st.stock_config))
    ctx.progress(f"PRELUDE: stock {stock:,.1f} {objective_label(ctx.spec)}; A/A ratio {res['noise']['ratio']:.4f} "
               f"[{res['noise']['ci_low']:.4f}, {res['noise']['ci_high']:.4f}]")
    bound = slo_binding(res["protocol"]["pairs"]) if getattr(ctx.spec, "objective", None) == "goodput" else None
    if bound and bound.get("note"):  # every request met the SLOs: goodput can't tell candidates apart
        ctx.progress(f"PRELUDE: warning: {bound['note']}")
    if isinstance(ctx.adapter, ServerReuse):  # stock's PRELUDE server is alive: it is the quality reference
        try:
            stock_references(ctx.adapter, ctx.spec, st.stock_config, reference_sets(ctx.adapter, ()), ctx.refs,
                             ctx.progress)
        except Exception as exc:  # noqa: BLE001 - the first trial captures them (and fails, saying why)
            ctx.progress(f"PRELUDE: stock's quality references not captured yet: {type(exc).__name__}: {exc}")


def replay_step(ctx: SessionContext, st: SessionState) -> None:
    """The warm replay: look the workload up in the knowledge base and measure the best recipe against stock."""
    if st.pending_action is not None and st.pending_action.action == "warm_replay":
        p = dict(st.pending_action.params)
        _replay_tables(ctx, p.get("engine_tables"))  # a resumed replay hands the recipe's tables over again
        _finish_replay(ctx, st, p, execute_trial(ctx, st, p, st.pending_action.key, agent="kb-replay",
                                               min_ratio=p.get("min_ratio")))
        return
    if not ctx.kb_url:
        st.extra.warm_replay = WarmReplay(skipped="no knowledge base (--no-kb)")
        return
    try:
        with RecipeStore(ctx.kb_url) as store:
            key = WorkloadKey.from_spec(ctx.spec)
            res = store.lookup(key, min_confidence=ctx.options.replay_min_confidence)
    except KBError as exc:
        st.extra.warm_replay = WarmReplay(skipped=f"knowledge base unavailable: {exc}")
        ctx.progress(f"PRELUDE: warm replay skipped: {exc}")
        return
    seq = ctx.ledger.append(KB_LOOKUP, {"workload_key": key.to_dict(), "result": _jsonable(res.to_dict())},
                          key=_key("kb_lookup", st.session_id))
    st.extra.kb_failures = [p["changes"] for p in res.priors if isinstance(p.get("changes"), dict)]
    chosen = res.chosen
    winner = (chosen.winner or {}) if chosen is not None else {}
    if not winner:
        st.extra.warm_replay = WarmReplay(skipped="no recipe above the confidence threshold", lookup_seq=seq)
        ctx.progress("PRELUDE: warm replay: no recipe for this workload yet")
        return
    # an engine patch (phase PATCH) is a file's name, its content this session's: its gates run in FRAMEWORK
    names = {k.name for k in ctx.knobs if k.phase != "PATCH"}
    changes = {k: v for k, v in (winner.get("changes") or {}).items() if k in names}
    try:
        cfg = resolve_config(ctx.knobs, {**st.stock_config, **changes}, st.pinned)
    except ConfigError as exc:
        st.extra.warm_replay = WarmReplay(skipped=f"recipe does not apply here: {exc}", lookup_seq=seq)
        return
    if cfg == st.stock_config:
        st.extra.warm_replay = WarmReplay(skipped="recipe equals stock here", lookup_seq=seq)
        return
    recorded = float(winner["ratio"])
    min_ratio = math.exp(ctx.options.replay_fraction * math.log(recorded)) if recorded > 1 else None
    proposal = {"action": "try_config", "changes": {k: v for k, v in cfg.items() if st.stock_config[k] != v},
                "config": cfg, "predicted_gain": recorded - 1, "source": "kb-replay",
                "rationale": f"recipe #{chosen.id} (confidence {res.confidence:.2f}) recorded x{recorded:.3f}",
                "recipe_id": chosen.id, "recipe_key": chosen.key.to_dict(), "winner_session": winner.get("session_id"),
                "min_ratio": min_ratio, "lookup_seq": seq}
    tables = (winner.get("evidence") or {}).get("engine_tables")
    if tables:
        if not isinstance(ctx.adapter, EngineTables):
            st.extra.warm_replay = WarmReplay(skipped="the recipe's engine tables can't be given to this engine",
                                              lookup_seq=seq)
            return
        try:
            _replay_tables(ctx, tables)
        except InferloomError as exc:
            st.extra.warm_replay = WarmReplay(skipped=f"the recipe's engine tables are unusable: {exc}", lookup_seq=seq)
            return
        proposal["engine_tables"] = tables
    ctx.progress(f"PRELUDE: warm replay of recipe #{chosen.id}: {proposal['changes']} (recorded x{recorded:.3f})")
    k = _key("warm_replay", st.session_id)
    _finish_replay(ctx, st, proposal, run_trial(ctx, st, proposal, k, action="warm_replay", agent="kb-replay",
                                              min_ratio=min_ratio))


def _replay_tables(ctx: SessionContext, tables: Any) -> None:
    """The tables a recipe kept with its winner (``EngineTables``), written again by the adapter from them."""
    if tables and isinstance(ctx.adapter, EngineTables):
        ctx.adapter.replay_tables(tables)


def _finish_replay(ctx: SessionContext, st: SessionState, proposal: dict[str, Any], trial: Trial) -> None:
    st.extra.warm_replay = WarmReplay(recipe_id=proposal.get("recipe_id"), adopted=trial.kept, ratio=trial.ratio,
                                      recorded_gain=proposal.get("predicted_gain"), verdict_seq=trial.verdict_seq)
    if trial.kept:
        return
    try:
        with RecipeStore(ctx.kb_url) as store:
            store.mark_drift(WorkloadKey.from_dict(proposal["recipe_key"]),
                             f"session {st.session_id}: measured {trial.ratio} vs recorded "
                             f"x{1 + proposal['predicted_gain']:.3f} ({trial.verdict})",
                             session_id=st.session_id, expected_winner=proposal.get("winner_session"))
        ctx.progress("PRELUDE: the recipe did not reproduce: marked drift in the knowledge base; starting from stock")
    except KBError as exc:
        ctx.progress(f"PRELUDE: could not mark the recipe as drift: {exc}")


def profile_step(ctx: SessionContext, st: SessionState) -> None:
    """A profile of one untimed stock run, the device's ceilings, and where stock sits under them."""
    fw = framework(ctx.spec.framework)
    if fw.profile_skip is not None and not fw.server_profile:  # no operators, the user's own process
        st.extra.profile = ProfileSummary(skipped=fw.profile_skip)
    elif fw.profile_skip is not None:  # a server profiles itself only for its KERNEL phase (phases/server_profile.py)
        wanted, why = SP.decide(ctx, st, *kernel_backend(ctx, st))
        if not wanted:
            st.extra.profile = ProfileSummary(skipped=why)
            ctx.ledger.append(PROFILE, {"skipped": why, "server": True}, key=_key("profile", st.session_id))
            ctx.progress(f"PRELUDE: no profile of stock: {why}")
        else:
            found = SP.take(ctx, st, st.stock_config, _key("profile", st.session_id), "stock", why)
            p = found.get("profile") or {}
            st.extra.profile = ProfileSummary(ledger_seq=found["seq"], categories=_jsonable(p.get("categories")),
                                              error=p.get("error"))
            ctx.progress("PRELUDE: server profile of stock: " + (f"failed ({p['error']})" if p.get("error") else ", ".join(
                f"{c} {v['share'] * 100:.1f}%" for c, v in (p.get("categories") or {}).items() if v.get("share"))))
    else:
        ctx.progress("PRELUDE: profiling one untimed stock run (torch.profiler)")
        prof: dict[str, Any]
        try:
            prof = profile_config(ctx.adapter, st.stock_config)  # warm run first: no first-call costs in the profile
        except Exception as exc:  # noqa: BLE001 - a profiler failure is a note, not the session's end
            prof = {"error": f"{type(exc).__name__}: {exc}"}
        pseq = ctx.ledger.append(PROFILE, {"profile": _jsonable(prof)}, key=_key("profile", st.session_id))
        st.extra.profile = ProfileSummary(ledger_seq=pseq, categories=_jsonable((prof or {}).get("categories")),
                                          error=prof.get("error"))
    if not fw.roofline:  # no operators (synthetic), or the user's own process (custom): no ceilings
        return
    ceil = _ceilings(ctx, st)
    so = st.extra.stock_objective
    if so is None:
        raise RuntimeError("PRELUDE: the profile step needs the stock objective; state.json has none")
    stock = so.median
    try:
        roof = roofline_for(ctx, st, stock, st.stock_config) if ceil else None
        if ceil and roofline_skip(ctx.spec):
            ctx.progress(f"PRELUDE: no roofline: {roofline_skip(ctx.spec)}")
    except (ValueError, OSError) as exc:  # a model directory whose shape the cost model can't read
        ctx.progress(f"PRELUDE: no roofline: {exc}")
        roof = None
    rseq = ctx.ledger.append(ROOFLINE, {"ceilings": _jsonable(ceil), "stock": _jsonable(roof)}, key=_key("roofline", st.session_id))
    st.extra.roofline_stock = RooflineStock(ledger_seq=rseq, fraction=(roof or {}).get("fraction"),
                                            headroom=(roof or {}).get("headroom"),
                                            ceiling_tok_per_s=(roof or {}).get("ceiling_tok_per_s"))
    if roof:
        unit = roof.get("unit", "tok/s")  # images/s for an image workload
        ceil = f"{roof['ceiling_tok_per_s']:.4g}" if unit == "images/s" else f"{roof['ceiling_tok_per_s']:,.0f}"
        ctx.progress(f"PRELUDE: roofline: stock at {roof['fraction'] * 100:.1f}% of the {ceil} {unit} "
                   f"ceiling (headroom x{roof['headroom']:.2f})")
        for t in st.trials:  # a warm replay kept before the ceilings existed
            if t.kept and t.roofline is None:
                m = next((e for e in ctx.ledger.entries(L.MEASUREMENT) if e["seq"] == t.measurement_seq), None)
                if m is not None:
                    kept_roofline(ctx, st, m, _key("replay-roofline", st.session_id, t.trial), t)


def _ceilings(ctx: SessionContext, st: SessionState) -> dict[str, Any] | None:
    """Measured once per device and cached in the KB with their date."""
    dtype = "bfloat16" if st.device == "cuda" and ctx.spec.dtype != "float32" else ctx.spec.dtype
    store = None
    try:
        if ctx.kb_url:
            store = RecipeStore(ctx.kb_url)
            name = _device_name(st.device)
            cached = store.get_ceiling(name, dtype)
            if cached is not None:
                found = {"memory_bandwidth_bytes_per_s": cached.mem_bw_bytes_per_s,
                         "matmul_flops_per_s": cached.matmul_flops_per_s, "device_name": name,
                         "matmul_dtype": dtype, "cached": True,
                         "measured_at": _dt.datetime.fromtimestamp(cached.measured_at, _dt.timezone.utc)
                         .isoformat(timespec="seconds")}
                st.extra.ceilings = Ceilings.model_validate(found)
                return found
        ctx.progress("PRELUDE: measuring this device's ceilings (memory bandwidth, matmul rate)")
        ceil = measure_ceilings(st.device, dtype)
        kept = {k: ceil[k] for k in ("memory_bandwidth_bytes_per_s", "matmul_flops_per_s", "device_name",
                                     "matmul_dtype", "measured_at")}
        st.extra.ceilings = Ceilings.model_validate(kept)
        if store is not None:
            store.put_ceiling(ceil["device_name"], mem_bw_bytes_per_s=ceil["memory_bandwidth_bytes_per_s"],
                              matmul_flops_per_s=ceil["matmul_flops_per_s"], dtype=dtype)
        return kept
    except Exception as exc:  # noqa: BLE001 - no roofline is a note, not a failure
        ctx.progress(f"PRELUDE: no ceilings: {exc}")
        return None
    finally:
        if store is not None:
            store.close()


def _device_name(device: str) -> str:
    if device == "cuda":
        import torch  # heavy: only when the device is a GPU

        return torch.cuda.get_device_name(0)
    return _cpu_name()
