"""The enablement ladder with classified failures (no server needed)."""

import json

import pytest

from inferloom.agents.rules import RuleCritic, RuleOrchestrator, RuleRobustness
from inferloom.session import ledger as L
from inferloom.phases.enablement import RUNGS
from inferloom.phases.runner import start
from inferloom.spec import load_spec
from inferloom.workloads.base import AdapterError, Knob
from inferloom.verify import verify_session
from inferloom.workloads.synthetic import SyntheticAdapter

SPEC = load_spec(None, {"model": "llama-tiny", "framework": "synthetic", "device": "cpu",
                        "protocol.bootstrap_resamples": 999, "quality.eval_prompts": 2, "quality.heldout_prompts": 2,
                        "quality.prompt_len": 8, "quality.continuation_len": 4})
KNOBS = [Knob("kv_space", "int", 8, "GiB of KV cache", low=1, high=8), Knob("fast_path", "bool", False, "+20%")]


def agents():
    return {"orchestrator": RuleOrchestrator(seed=0), "critic_factory": RuleCritic, "robustness": RuleRobustness()}


class Failing(SyntheticAdapter):
    def __init__(self, kind, works_when=None):
        super().__init__(effects={"fast_path": {True: 1.2}}, numerics={}, knobs=KNOBS, noise_sd=0.02)
        self.kind, self.works_when = kind, works_when or {}

    def prepare(self, config):
        if not self.works_when or any(config.get(k) != v for k, v in self.works_when.items()):
            raise AdapterError(f"server exited ({self.kind})", kind=self.kind)
        return super().prepare(config)

    def recovery_options(self, kind, stock):
        return [{"kv_space": 1}] if kind == "oom" else []


def test_oom_recovered_by_an_environment_change(tmp_path):
    st = start(tmp_path / "s", SPEC, budget_minutes=5, max_trials=1, adapter=Failing("oom", {"kv_space": 1}),
               agents=agents(), kb_url=None)
    assert st.stock_config["kv_space"] == 1 and st.extra.stock_objective.median > 0
    rungs = [e for e in L.read_entries(tmp_path / "s") if e["kind"] == L.ENABLEMENT_RUNG]
    assert rungs[0]["failure_kind"] == "oom" and rungs[1]["outcome"] == "runs"
    assert {r["rung"] for r in rungs} == {1, 2}


def test_model_config_error_stops_naming_the_rung_it_needs(tmp_path):
    st = start(tmp_path / "s", SPEC, budget_minutes=5, max_trials=1, adapter=Failing("model_config"),
               agents=agents(), kb_url=None)
    assert "model_config" in st.stop_reason and f"rung 3 ({RUNGS[2]})" in st.stop_reason
    rungs = [e for e in L.read_entries(tmp_path / "s") if e["kind"] == L.ENABLEMENT_RUNG]
    assert [r["rung"] for r in rungs] == [1, 2, 3, 4, 5, 6]
    assert "no flag or environment change" in rungs[1]["outcome"]


def test_missing_kernel_needs_an_alternate_environment(tmp_path):
    st = start(tmp_path / "s", SPEC, budget_minutes=5, max_trials=1, adapter=Failing("missing_kernel"),
               agents=agents(), kb_url=None)
    assert f"rung 4 ({RUNGS[3]})" in st.stop_reason


def test_vllm_recovery_options_per_failure_kind(tmp_path):
    from inferloom.workloads.base import resolve_config
    from inferloom.workloads.vllm_adapter import VLLMAdapter

    a = VLLMAdapter(load_spec(None, {"framework": "vllm", "device": "cpu",
                                     "serving.env": {"VLLM_CPU_KVCACHE_SPACE": "4"}}), tmp_path)
    stock = resolve_config(a.knob_space(), {})
    assert a.recovery_options("oom", stock)[0] == {"kv_cache_space_gib": 1}
    assert {"enforce_eager": True} in a.recovery_options("startup_timeout", stock)
    assert {"dtype": "float32"} in a.recovery_options("missing_kernel", stock)
    assert a.recovery_options("model_config", stock) == []


# ---------------------------------------------------------------- rungs 3-5 (SourceRungs), a fake server adapter
from inferloom.phases.enablement import REBUILD_ON_PAPER  # noqa: E402
from inferloom.workloads.base import SourceRungs  # noqa: E402
from inferloom.workloads.engine_ladder import ENV_KNOB, PATCH_KNOB  # noqa: E402

PATCHES = {"a-stale.patch": 3, "fix.patch": 3, "upstream-pr-1.patch": 5}
LADDER_KNOBS = KNOBS + [Knob(PATCH_KNOB, "choice", "none", "rung 3/5", choices=("none", *PATCHES), phase="ENABLEMENT"),
                        Knob(ENV_KNOB, "choice", "none", "rung 4", choices=("none", "vllm-9.9"), phase="ENABLEMENT")]


class FakeServer(SyntheticAdapter):
    """A server whose stock crashes at start; ``works``: the rung change that makes it start (or none);
    ``bad_quality``: a change whose server starts but whose quality probe raises."""

    def __init__(self, works=None, bad_quality=None):
        super().__init__(effects={"fast_path": {True: 1.2}}, numerics={}, knobs=LADDER_KNOBS, noise_sd=0.02,
                         fail_quality={k: {v: "garbage outputs"} for k, v in (bad_quality or {}).items()})
        self.works, self.bad_quality, self.starts = works or {}, bad_quality or {}, []

    def prepare(self, config):
        self.starts.append({k: config[k] for k in (PATCH_KNOB, ENV_KNOB)})
        if config[PATCH_KNOB] == "a-stale.patch":
            raise AdapterError("engine patch a-stale.patch: refused (does_not_apply): git apply refused it",
                               kind="patch_refused")
        if not any(config.get(k) == v for k, v in self.works.items()) and not (
                self.bad_quality and config[PATCH_KNOB] in self.bad_quality.values()):
            raise AdapterError("server exited with code 1 (crash)", kind="crash")
        return super().prepare(config)

    def source_rungs(self, rung):
        if rung == 4:
            return [{"name": "vllm-9.9", "change": {ENV_KNOB: "vllm-9.9"}, "what": "vllm-9.9 from the wheelhouse"}], ""
        c = [{"name": n, "change": {PATCH_KNOB: n}, "what": n} for n, r in PATCHES.items() if r == rung]
        return c, "" if c else "none"

    def rung_stack(self, config):
        return {"overlay": {"patch_file": config[PATCH_KNOB]}} if config[PATCH_KNOB] != "none" else \
            {"env": {"python": "/envs/vllm-9.9/bin/python"}} if config[ENV_KNOB] != "none" else {}


def _ladder(tmp_path, adapter, spec=SPEC):
    st = start(tmp_path / "s", spec, budget_minutes=5, max_trials=1, adapter=adapter, agents=agents(), kb_url=None)
    rungs = [e for e in L.read_entries(tmp_path / "s") if e["kind"] == L.ENABLEMENT_RUNG]
    return st, rungs


def test_the_fake_server_offers_the_source_rungs_hook():
    assert isinstance(FakeServer(), SourceRungs) and not isinstance(Failing("crash"), SourceRungs)


def test_rung_3_recovers_stock_and_the_session_runs_on_that_stack(tmp_path):
    a = FakeServer(works={PATCH_KNOB: "fix.patch"})
    st, rungs = _ladder(tmp_path, a)
    assert [(r["rung"], r.get("candidate")) for r in rungs] == [(1, None), (2, None), (3, "a-stale.patch"),
                                                                 (3, "fix.patch")]
    stale, fix = rungs[2], rungs[3]
    assert stale["start"] == "patch_refused" and "does_not_apply" in stale["outcome"] and "duration_s" in stale
    assert fix["start"] == "healthy" and fix["quality_probe"]["passed"] and fix["outcome"].startswith("runs")
    assert fix["stack"] == {"overlay": {"patch_file": "fix.patch"}} and fix["tried"] == "fix.patch"
    assert st.stock_config[PATCH_KNOB] == "fix.patch" and st.extra.enablement_changes == {PATCH_KNOB: "fix.patch"}
    assert st.extra.stock_objective.median > 0  # PRELUDE measured the recovered stock
    later = a.starts[a.starts.index({PATCH_KNOB: "fix.patch", ENV_KNOB: "none"}):]
    assert all(s[PATCH_KNOB] == "fix.patch" for s in later)  # every later server on the rung's stack
    assert all(t.config.get(PATCH_KNOB, "fix.patch") == "fix.patch" for t in st.trials)
    stock_seq = next(e["seq"] for e in L.read_entries(tmp_path / "s")
                     if e["kind"] == L.MEASUREMENT and e.get("action") == "measure_stock" and e.get("protocol"))
    bd = json.loads((tmp_path / "s" / "session_breakdown.json").read_text())
    assert bd["stock"]["ledger_seq"] == stock_seq  # the recovered stock's, not the failed measurement before it
    assert not verify_session(tmp_path / "s").mismatches
    report = (tmp_path / "s" / "report.md").read_text()
    assert "## Enablement: stock failed, the ladder" in report
    assert "- rung 3 (in-tree patch) `fix.patch`, start healthy" in report and "does_not_apply" in report


def test_the_rungs_climb_in_order_and_stop_at_the_first_that_works(tmp_path):
    st, rungs = _ladder(tmp_path, FakeServer(works={ENV_KNOB: "vllm-9.9"}))
    assert [r["rung"] for r in rungs] == [1, 2, 3, 3, 4]  # both patches first, the wheelhouse next; 5, 6 not reached
    assert rungs[-1]["stack"]["env"]["python"] == "/envs/vllm-9.9/bin/python"
    assert st.stock_config[ENV_KNOB] == "vllm-9.9" and st.stock_config[PATCH_KNOB] == "none"


def test_a_rung_whose_start_works_but_whose_quality_probe_fails_is_not_taken(tmp_path):
    a = FakeServer(works={PATCH_KNOB: "upstream-pr-1.patch"}, bad_quality={PATCH_KNOB: "fix.patch"})
    st, rungs = _ladder(tmp_path, a)
    fix = next(r for r in rungs if r.get("candidate") == "fix.patch")
    assert fix["start"] == "healthy" and not fix["quality_probe"]["passed"]
    assert "quality probe failed" in fix["outcome"] and "garbage outputs" in fix["outcome"]
    assert [r["rung"] for r in rungs] == [1, 2, 3, 3, 4, 5]
    assert st.stock_config[PATCH_KNOB] == "upstream-pr-1.patch"


def test_nothing_works_every_rung_recorded_and_rung_6_on_paper(tmp_path):
    st, rungs = _ladder(tmp_path, FakeServer())
    assert [r["rung"] for r in rungs] == [1, 2, 3, 3, 4, 5, 6]
    assert all("duration_s" in r and r["start"] for r in rungs[2:6])
    assert rungs[-1]["outcome"] == REBUILD_ON_PAPER and "not run" in REBUILD_ON_PAPER
    assert "rungs 1-5 did not recover it" in st.stop_reason and "docs/enablement.md" in st.stop_reason


def test_verify_remeasure_pins_the_recovered_stock_and_checks_the_patch_it_ran(tmp_path):
    """``verify --remeasure``'s stock is the recovered one (its enablement knobs pinned), not the stock that failed;
    the patch file the rung recorded must still be the file the session ran."""
    import hashlib

    from inferloom.evidence.remeasure import RemeasureError, final_stack

    patch = tmp_path / "fix.patch"
    patch.write_text("--- a/vllm/x.py\n+++ b/vllm/x.py\n@@ -1 +1 @@\n-a\n+b\n")
    a = FakeServer(works={PATCH_KNOB: "fix.patch"})
    a.rung_stack = lambda cfg: {"overlay": {"patch_file": str(patch),
                                            "patch_file_sha256": hashlib.sha256(patch.read_bytes()).hexdigest()}} \
        if cfg[PATCH_KNOB] != "none" else {}
    spec = SPEC.model_copy(update={"pinned": {"kv_space": 8}})  # the one trial left: fast_path (+20%), kept
    st, _ = _ladder(tmp_path, a, spec)
    assert st.stack["fast_path"] is True and st.stack[PATCH_KNOB] == "fix.patch"
    spec, changes, _ = final_stack(tmp_path / "s")
    assert spec.pinned[PATCH_KNOB] == "fix.patch" and PATCH_KNOB not in changes
    patch.write_text(patch.read_text() + "+c\n")
    with pytest.raises(RemeasureError, match="recovered stock can't be re-measured: .*fix.patch"):
        final_stack(tmp_path / "s")


class PairOfServers(SyntheticAdapter):
    """Servers on one device of 100 units: each takes 20 + its KV share (50, or 25 with the rung's halved share),
    and stays alive after release until stop_idle (a server pool's reuse). Stock's pair does not fit (70 + 70):
    its first server starts, the second runs out of memory, as OLMoE's did on the H200 (2026-12-05)."""

    def __init__(self):
        knobs = [*KNOBS, Knob("kv_share", "choice", "derived", "KV share", choices=("derived", "0.5"),
                              phase="ENABLEMENT")]
        super().__init__(effects={"fast_path": {True: 1.2}}, numerics={}, knobs=knobs, noise_sd=0.02)
        self.alive, self.lent, self.starts = [], set(), []

    def _size(self, config):
        return 20 + (25 if config.get("kv_share") == "0.5" else 50)

    def prepare(self, config):
        idle = [h for h in self.alive if id(h) not in self.lent and h.config == dict(config)]
        if idle:
            self.lent.add(id(idle[0]))
            return idle[0]
        used = sum(self._size(h.config) for h in self.alive)
        self.starts.append((dict(config), used))
        if used + self._size(config) > 100:
            raise AdapterError(f"server exited with code 1 (oom: CUDA out of memory, {100 - used} units free)",
                               kind="oom")
        h = super().prepare(config)
        self.alive.append(h)
        self.lent.add(id(h))
        return h

    def release(self, handle):
        self.lent.discard(id(handle))

    def reuse_servers(self, on=True, max_live=2):
        pass

    def expect_servers(self, configs):
        pass

    def take_server_starts(self):
        return []

    def stop_idle(self):
        idle = [h for h in self.alive if id(h) not in self.lent]
        self.alive = [h for h in self.alive if id(h) in self.lent]
        return [str(id(h)) for h in idle]

    def recovery_options(self, kind, stock):
        return [{"kv_space": 1}, {"kv_share": "0.5"}] if kind == "oom" else []


def test_an_out_of_memory_pair_is_recovered_by_a_rung_whose_pair_fits(tmp_path):
    """The failed stock's surviving server is stopped before the ladder, and each rung-2 smoke starts two
    servers side by side: `kv_space=1` starts alone (70 units) but not as a pair, so it is not taken; the halved
    KV share (45 + 45) is, and the session then measures stock's A/A on it (the rung's two servers, reused)."""
    a = PairOfServers()
    st = start(tmp_path / "s", SPEC, budget_minutes=5, max_trials=1, adapter=a, agents=agents(), kb_url=None)
    rungs = [e for e in L.read_entries(tmp_path / "s") if e["kind"] == L.ENABLEMENT_RUNG]
    assert [(r["rung"], r.get("change")) for r in rungs] == [(1, None), (2, {"kv_space": 1}), (2, {"kv_share": "0.5"})]
    assert rungs[1]["outcome"].startswith("still fails") and "oom" in rungs[1]["outcome"] and rungs[2]["outcome"] == "runs"
    assert st.stock_config["kv_share"] == "0.5" and st.extra.stock_objective.median > 0
    # every ladder start began on a device holding nothing but that rung's own first server
    assert [used for _, used in a.starts[2:6]] == [0, 70, 0, 45], a.starts
    # PRELUDE's A/A got the rung's two servers back: no start of the recovered stock after the ladder's
    assert all(cfg != st.stock_config for cfg, _ in a.starts[6:]), a.starts


class PairOfPatchedServers(PairOfServers):
    """As :class:`PairOfServers`, with no flag that helps and two rung-3 patches: ``big.patch`` leaves a server of
    60 units (it starts alone, not beside a second), ``slim.patch`` one of 45 (a pair fits)."""

    SIZES = {"none": 70, "big.patch": 60, "slim.patch": 45}

    def __init__(self):
        super().__init__()
        self._knobs = [*self._knobs, Knob(PATCH_KNOB, "choice", "none", "rung 3",
                                          choices=tuple(self.SIZES), phase="ENABLEMENT")]

    def _size(self, config):
        return self.SIZES[config.get(PATCH_KNOB, "none")]

    def recovery_options(self, kind, stock):
        return []

    def source_rungs(self, rung):
        if rung != 3:
            return [], "none"
        return [{"name": n, "change": {PATCH_KNOB: n}, "what": n} for n in ("big.patch", "slim.patch")], ""

    def rung_stack(self, config):
        return {"overlay": {"patch_file": config[PATCH_KNOB]}}


def test_an_out_of_memory_pair_is_recovered_by_a_source_rung_whose_pair_fits(tmp_path):
    """Rungs 3-5 smoke an out-of-memory stock's candidates as pairs too: `big.patch` starts alone but its second
    server runs out of memory beside the first, so it is not taken (its first server stopped before the next
    candidate); `slim.patch`'s pair fits and becomes stock."""
    a = PairOfPatchedServers()
    assert isinstance(a, SourceRungs)
    st = start(tmp_path / "s", SPEC, budget_minutes=5, max_trials=1, adapter=a, agents=agents(), kb_url=None)
    rungs = [e for e in L.read_entries(tmp_path / "s") if e["kind"] == L.ENABLEMENT_RUNG]
    assert [(r["rung"], r.get("candidate")) for r in rungs] == [(1, None), (2, None), (3, "big.patch"),
                                                                 (3, "slim.patch")]
    big, slim = rungs[2], rungs[3]
    assert big["pair"] and big["start"] == "oom" and big["outcome"].startswith("still fails")
    assert slim["pair"] and slim["outcome"] == "runs; quality probe passed"
    assert st.stock_config[PATCH_KNOB] == "slim.patch" and st.extra.stock_objective.median > 0
    # after stock's pair: big's first server on an empty device, its second beside it (60 used), slim's two
    assert [(cfg[PATCH_KNOB], used) for cfg, used in a.starts[2:6]] == [
        ("big.patch", 0), ("big.patch", 60), ("slim.patch", 0), ("slim.patch", 45)], a.starts
    report = (tmp_path / "s" / "report.md").read_text()
    assert "- rung 3 (in-tree patch) `slim.patch`, start healthy, two servers side by side" in report
