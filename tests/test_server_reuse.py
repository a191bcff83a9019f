"""Server reuse: the handle pool's bookkeeping, and a whole session whose
configurations behave like servers (the synthetic adapter behind a
HandlePool): one start per configuration while it lives, at most one start
per trial after PRELUDE, the A/A on two distinct instances, every start in
the ledger and in the time breakdown, nothing left alive at the end. The real
vLLM server's session is in test_vllm_real.py."""

import json

import pytest

from inferloom.agents.rules import RuleCritic, RuleOrchestrator, RuleRobustness
from inferloom.phases.runner import start
from inferloom.session import ledger as L
from inferloom.spec import load_spec
from inferloom.verify.session import verify_session
from inferloom.workloads.base import Knob, ServerReuse, config_key, resolve_config
from inferloom.workloads.handle_pool import HandlePool
from inferloom.workloads.synthetic import SyntheticAdapter


class Proc:
    def __init__(self, name):
        self.name, self.alive, self.stopped = name, True, False


def pool(max_live=2, keep=True):
    stopped = []

    def stop(h):
        h.stopped, h.alive = True, False
        stopped.append(h.name)

    p = HandlePool(stop, lambda h: h.alive, lambda h: h.name, max_live=max_live, keep=keep)
    n = iter(range(1, 100))
    return p, stopped, lambda key: (lambda reason: (Proc(f"{key}{next(n)}"), {"why": reason}))


def test_a_released_handle_is_lent_again_and_an_aa_gets_two_instances():
    p, stopped, start_of = pool()
    a, a2 = p.acquire("stock", start_of("stock")), p.acquire("stock", start_of("stock"))
    assert a is not a2  # lent out: never lent twice at once
    p.release(a), p.release(a2)
    assert p.acquire("stock", start_of("stock")) is a and p.reuses == 1  # the earliest instance
    c = p.acquire("cand", start_of("cand"))  # the pair is full: the A/A's second instance goes, not stock's first
    assert stopped == [a2.name] and p.live() == [a, c]
    starts = p.take_starts()
    assert [s["handle"] for s in starts] == ["stock1", "stock2", "cand3"] and starts[2]["evicted"] == ["stock2"]
    assert all(s["reason"] == "new" and s["startup_s"] >= 0 for s in starts) and p.take_starts() == []


def test_eviction_is_least_recently_used_and_never_a_lent_handle():
    p, stopped, start_of = pool()
    a = p.acquire("a", start_of("a"))
    b = p.acquire("b", start_of("b"))
    p.release(b), p.release(a)  # b idle longer
    p.acquire("a", start_of("a"))
    p.acquire("c", start_of("c"))
    assert stopped == ["b2"]
    c2 = p.acquire("d", start_of("d"))  # a and c lent: over the bound rather than stop a lent one
    assert len(p.live()) == 3 and c2.name == "d4" and stopped == ["b2"]
    assert sorted(p.stop_idle()) == [] and len(p.live()) == 3
    p.close()
    assert p.live() == [] and sorted(stopped) == ["a1", "b2", "c3", "d4"]


def test_the_configurations_the_next_comparison_wants_are_stopped_last():
    p, stopped, start_of = pool()
    stack, cand = p.acquire("stack", start_of("stack")), p.acquire("cand", start_of("cand"))
    p.release(cand), p.release(stack)  # the stack is the least recently used now
    p.want(["stock", "stack"])  # CLOSE: stock against the stack; the rejected candidate goes
    p.acquire("stock", start_of("stock"))
    assert stopped == ["cand2"] and p.acquire("stack", start_of("stack")) is stack


def test_a_dead_server_is_restarted_and_the_start_says_why():
    p, stopped, start_of = pool()
    a = p.acquire("stock", start_of("stock"))
    p.release(a)
    a.alive = False  # died while idle
    b = p.acquire("stock", start_of("stock"))
    assert b is not a and a.stopped
    assert p.take_starts()[-1]["reason"] == "restart: server stock1 of this configuration had died"
    b.alive = False  # died while lent (a crash mid-run): dropped at release, restarted next time
    p.release(b)
    assert p.live() == [] and p.acquire("stock", start_of("stock")).name == "stock3"
    assert p.take_starts()[-1]["reason"].startswith("restart: server stock2")


def test_without_keep_a_release_stops_at_once_and_a_failed_start_is_recorded():
    p, stopped, start_of = pool(keep=False)
    a = p.acquire("x", start_of("x"))
    p.release(a)
    assert stopped == ["x1"] and p.live() == []

    def boom(_reason):
        raise RuntimeError("no memory")

    with pytest.raises(RuntimeError):
        p.acquire("y", boom)
    last = p.take_starts()[-1]
    assert last["failed"] and "no memory" in last["error"] and last["config"] == "y"


# ------------------------------------------------------------------ a session

class PooledSynthetic(SyntheticAdapter):
    """The synthetic adapter whose configurations behave like servers: each
    start is counted and a released one stays alive in a HandlePool."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.pool = HandlePool(lambda h: SyntheticAdapter.release(self, h), lambda h: not h.released,
                               lambda h: f"h{h.id}")

    def prepare(self, config):
        cfg = resolve_config(self._knobs, config)
        return self.pool.acquire(config_key(cfg), lambda reason: (SyntheticAdapter.prepare(self, cfg),
                                                                  {"compile_cache": {"warm": None}}))

    def release(self, handle):
        self.pool.release(handle)

    def close(self):
        self.pool.close()

    def reuse_servers(self, on=True, max_live=2):
        self.pool.keep, self.pool.max_live = on, max_live

    def expect_servers(self, configs):
        self.pool.want(config_key(resolve_config(self._knobs, c)) for c in configs)

    def take_server_starts(self):
        return self.pool.take_starts()

    def stop_idle(self):
        return self.pool.stop_idle()


SPEC = load_spec(None, {"model": "llama-tiny", "framework": "synthetic", "device": "cpu",
                        "protocol.bootstrap_resamples": 999, "quality.eval_prompts": 4, "quality.heldout_prompts": 4,
                        "quality.prompt_len": 8, "quality.continuation_len": 8})


def test_a_session_starts_each_configuration_once_while_it_lives(tmp_path):
    knobs = [Knob("fast_path", "bool", False, "synthetic +20%"), Knob("useless", "bool", False, "synthetic 0%")]
    ad = PooledSynthetic(effects={"fast_path": {True: 1.20}, "useless": {True: 1.0}}, numerics={}, knobs=knobs,
                         noise_sd=0.05)
    assert isinstance(ad, ServerReuse)
    d = tmp_path / "s"
    st = start(d, SPEC, budget_minutes=10, max_trials=4, adapter=ad, sweep=False, kb_url=None,
               agents={"orchestrator": RuleOrchestrator(seed=0), "critic_factory": RuleCritic,
                       "robustness": RuleRobustness()})
    assert st.trials and any(t.kept for t in st.trials) and st.stack != st.stock_config
    entries = L.read_entries(d)
    # the starts before each measurement, in ledger order
    per: list[tuple[str, list]] = []
    pending: list = []
    for e in entries:
        if e["kind"] == L.SERVER_START:
            pending.append(e)
        elif e["kind"] == L.MEASUREMENT:
            per.append((e["action"], pending))
            pending = []
    assert pending == []  # every start came before a measurement that used it
    stock_starts = per[0][1]
    assert per[0][0] == "measure_stock" and len(stock_starts) == 2  # the A/A: two distinct instances of stock
    assert stock_starts[0]["config"] == stock_starts[1]["config"] and stock_starts[0]["handle"] != stock_starts[1]["handle"]
    trials = [s for action, s in per if action == "try_config"]
    assert len(trials) == len(st.trials) and all(len(s) <= 1 for s in trials), [len(s) for s in trials]
    final = [s for action, s in per if action == "final_compare"]
    assert len(final) == 1 and len(final[0]) <= 1  # stock again, if the pair had let it go
    # stock's quality references came from its PRELUDE server: no start outside a measurement
    n_starts = sum(len(s) for _, s in per)
    assert n_starts <= 2 + len(st.trials) + 1
    b = json.loads((d / "session_breakdown.json").read_text())
    assert b["servers"]["starts"] == n_starts and b["servers"]["restarts"] == 0
    assert b["time_s"]["server_startup"] == pytest.approx(sum(e["startup_s"] for _, s in per for e in s))
    assert "server startup" in (d / "report.md").read_text()
    f = verify_session(d)
    assert not f.mismatches, f.mismatches
    assert ad.pool.live() == []  # the session released everything it kept
