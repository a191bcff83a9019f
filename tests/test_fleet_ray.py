"""`inferloom fleet` for real: synthetic sessions as Ray tasks into a throwaway PostgreSQL KB,
with the faults: a worker killed mid-session, PostgreSQL restarted mid-fleet, a session that fails.

One embedded Ray instance for the module (its start is ~10 s), with few CPUs (CI has 2 cores).
"""

import json
import os
import signal
import threading
import time

import pytest
import ray

from inferloom.fleet import load_fleet
from inferloom.fleet.driver import run_fleet
from inferloom.kb import RecipeStore
from inferloom.phases.runner import start
from inferloom.session import ledger as L
from inferloom.session.state import load_state
from inferloom.spec import WorkloadSpec
from inferloom.workloads.synthetic import SyntheticAdapter

SYN = "{model: llama-tiny, framework: synthetic, device: cpu, seed: %d}"


@ray.remote(num_cpus=1)
def _warm_worker():
    import inferloom.fleet.worker  # noqa: F401  (the session machinery, imported once per worker process)

    time.sleep(1.0)  # hold the slot: the four land on four workers
    return os.getpid()


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    # four workers with inferloom imported, so that "ran at the same time" measures the sessions, not
    # how long a cold worker takes to import on two busy cores
    assert len(set(ray.get([_warm_worker.remote() for _ in range(4)]))) == 4
    yield
    ray.shutdown()


def _fleet(tmp_path, body, delay="0.02"):
    p = tmp_path / "fleet.yaml"
    p.write_text(f"defaults: {{budget_minutes: 5, max_trials: 3, env: {{INFERLOOM_SYNTHETIC_DELAY_S: '{delay}'}}}}\n"
                 + body)
    return p


def _check_session(d):
    """The session closed once, its ledger has no gap and no repeated step."""
    st = load_state(d)
    entries = L.read_entries(d)
    assert st.phase.value == "DONE"
    assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1))
    keys = [e["key"] for e in entries if "key" in e]
    assert len(keys) == len(set(keys)), "a step was written twice"
    assert len([e for e in entries if e["kind"] == L.CLOSE]) == 1
    return st


def _in_background(fn, *a, **kw):
    box = {}
    t = threading.Thread(target=lambda: box.update(result=fn(*a, **kw)), daemon=True)
    t.start()
    return t, box


def _wait_for(cond, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def test_a_leader_then_four_concurrent_sessions_warm_start_from_it_and_a_rerun_skips_them(tmp_path, pg_url):
    shapes = [4, 8, 16, 32, 64]
    body = "matrix:\n  workloads:\n" + "".join(
        f"    - {{name: c{c}, set: {{model: llama-tiny, framework: synthetic, device: cpu, traffic.concurrency: {c}}}}}\n"
        for c in shapes)
    plan = load_fleet(_fleet(tmp_path, body, delay="0.05"), out=tmp_path / "out", kb=pg_url)
    lines = []
    res = run_fleet(plan, progress=lines.append, poll_s=0.5)
    assert res.ok, [s.line() for s in res.statuses]
    leader, *followers = plan.sessions
    assert all(f.after == leader.name for f in followers)
    ids = {s.name: _check_session(plan.session_dir(s)).session_id for s in plan.sessions}
    # the four followers ran at the same time: each started before any of them finished
    starts = [json.loads((plan.out / "logs" / f"{f.name}.worker.json").read_text())["started_at"] for f in followers]
    ends = [(plan.out / "logs" / f"{f.name}.result.json").stat().st_mtime for f in followers]
    assert max(starts) < min(ends), (starts, ends)
    lead_end = (plan.out / "logs" / f"{leader.name}.result.json").stat().st_mtime
    assert lead_end <= min(starts)  # ... after their leader had closed
    with RecipeStore(pg_url) as store:
        recipes = store.list_recipes()
    assert len(recipes) == 1  # one workload key: one recipe, every session recorded on it exactly once
    assert sorted(recipes[0].session_ids) == sorted(ids.values())
    assert recipes[0].winner["session_id"] in ids.values()
    for f in followers:  # warm start: each follower replayed the leader's recipe in PRELUDE
        wr = load_state(plan.session_dir(f)).extra.warm_replay
        assert wr.recipe_id == recipes[0].id and wr.adopted is not None, wr
    assert any(load_state(plan.session_dir(f)).extra.warm_replay.adopted for f in followers)
    summary = json.loads((plan.out / "fleet_summary.json").read_text())
    assert summary["counts"]["done"] == 5 and summary["kb_learned"][0]["fleet_sessions"] == 5
    html = (plan.out / "fleet_report.html").read_text()
    assert "What the KB learned" in html and f'href="sessions/{leader.name}/report.html"' in html
    assert (plan.session_dir(leader) / "report.html").is_file()
    assert any("after c4-cpu-5m3t" in x for x in lines)
    # again: everything closed, nothing runs, nothing is written twice
    sizes = {s.name: len(L.read_entries(plan.session_dir(s))) for s in plan.sessions}
    res2 = run_fleet(plan, poll_s=0.5)
    assert res2.ok and sorted(res2.skipped) == sorted(sizes)
    assert sizes == {s.name: len(L.read_entries(plan.session_dir(s))) for s in plan.sessions}


def test_a_killed_worker_is_resumed_and_a_failed_session_does_not_stop_the_others(tmp_path, pg_url):
    body = ("order: all-at-once\nsessions:\n"
            f"  - {{name: victim, workload: {{set: {SYN % 1}}}}}\n"
            f"  - {{name: other, workload: {{set: {SYN % 2}}}}}\n"
            f"  - {{name: broken, workload: {{set: {SYN % 3}}}, env: {{INFERLOOM_SYNTHETIC_DELAY_S: oops}}}}\n")
    plan = load_fleet(_fleet(tmp_path, body, delay="0.05"), out=tmp_path / "out", kb=pg_url)
    t, box = _in_background(run_fleet, plan, poll_s=0.5)
    victim = plan.session_dir("victim")
    worker = plan.out / "logs" / "victim.worker.json"

    def mid_session():
        try:
            return load_state(victim).used.trials >= 1 and worker.is_file()
        except Exception:
            return False

    _wait_for(mid_session, 120, "the victim session's first trial")
    pid = json.loads(worker.read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    t.join(300)
    res = box["result"]
    by = {s.name: s for s in res.statuses}
    assert by["victim"].status == "done" and by["other"].status == "done"
    assert by["broken"].status == "failed" and "INFERLOOM_SYNTHETIC_DELAY_S" in by["broken"].error or \
        "oops" in by["broken"].error, by["broken"].error
    assert not res.ok
    assert json.loads(worker.read_text())["attempt"] == 2  # Ray ran the task again ...
    assert "resuming" in (plan.out / "logs" / "victim.log").read_text()  # ... and it resumed the directory
    st = _check_session(victim)
    with RecipeStore(pg_url) as store:
        ids = [sid for r in store.list_recipes() for sid in r.session_ids]
    assert ids.count(st.session_id) == 1 and ids.count(load_state(plan.session_dir("other")).session_id) == 1


def test_postgresql_restarted_mid_fleet_delays_the_writes_and_loses_none(tmp_path, pg_cluster, pg_url):
    body = ("order: all-at-once\nsessions:\n"
            f"  - {{name: a, workload: {{set: {SYN % 1}}}}}\n"
            f"  - {{name: b, workload: {{set: {SYN % 2}}}}}\n")
    plan = load_fleet(_fleet(tmp_path, body, delay="0.03"), out=tmp_path / "out", kb=pg_url)
    t, box = _in_background(run_fleet, plan, poll_s=0.5)
    _wait_for(lambda: (plan.session_dir("a") / "state.json").exists(), 120, "session a to start")
    pg_cluster.stop("fast")
    try:
        logs = [plan.out / "logs" / f"{n}.log" for n in ("a", "b")]
        _wait_for(lambda: any(p.is_file() and "unreachable" in p.read_text() for p in logs), 120,
                  "a KB call to meet the stopped server and retry")
    finally:
        pg_cluster.start()
    t.join(300)
    res = box["result"]
    assert res.ok, [s.line() for s in res.statuses]
    ids = [_check_session(plan.session_dir(n)).session_id for n in ("a", "b")]
    with RecipeStore(pg_url) as store:
        recorded = [sid for r in store.list_recipes() for sid in r.session_ids]
    assert sorted(recorded) == sorted(ids)  # both filed, once each
    for n in ("a", "b"):  # no session gave up on the KB
        assert not [e for e in L.read_entries(plan.session_dir(n)) if e["kind"] == L.ERROR
                    and "knowledge base" in str(e.get("what"))]


TINY = ("{model: llama-tiny, framework: transformers, device: cpu, traffic.concurrency: 2, "
        "traffic.output_len: 8, traffic.num_prompts: 2, protocol.min_pairs: 3, protocol.max_pairs: 3, "
        "protocol.warmup_runs: 1, quality.eval_prompts: 2, quality.heldout_prompts: 2, quality.prompt_len: 8, "
        "quality.continuation_len: 8, traffic.input_len: %d}")


@pytest.mark.slow
def test_two_real_llama_tiny_sessions_share_the_postgresql_kb(tmp_path, pg_url):
    """The real engine through Ray into PostgreSQL. Budgets this small close after PRELUDE (no trial, so no
    winner to replay); the second session still starts warm from the first: it finds the first's recipe in
    its KB lookup and takes the device ceilings the first measured from the KB instead of measuring them."""
    p = tmp_path / "fleet.yaml"
    p.write_text("defaults: {budget_minutes: 0.3, max_trials: 1, cycles: 1, sweep: false}\nmatrix:\n  workloads:\n"
                 f"    - {{name: first, set: {TINY % 16}}}\n    - {{name: second, set: {TINY % 24}}}\n")
    plan = load_fleet(p, out=tmp_path / "out", kb=pg_url)
    first, second = plan.sessions
    assert second.after == first.name
    res = run_fleet(plan, poll_s=1.0)
    assert res.ok, [s.line() for s in res.statuses]
    st1, st2 = (_check_session(plan.session_dir(s)) for s in (first, second))
    with RecipeStore(pg_url) as store:
        recipes = store.list_recipes()
    assert len(recipes) == 1 and sorted(recipes[0].session_ids) == sorted([st1.session_id, st2.session_id])
    lookup = next(e for e in L.read_entries(plan.session_dir(second)) if e["kind"] == "kb_lookup")
    tier0 = lookup["result"]["tiers"][0]  # the exact key: the first session's recipe was there
    assert tier0["matched_id"] == recipes[0].id or "recipe exists" in tier0["note"], tier0
    assert st1.extra.ceilings.cached is not True and st2.extra.ceilings.cached is True
    if recipes[0].winner:  # the first one kept something after all: the second replayed it
        assert st2.extra.warm_replay.recipe_id == recipes[0].id


class _Killed(BaseException):
    """Stands in for a kill: nothing in the session catches it."""


def test_a_rerun_resumes_a_session_an_earlier_run_left_unfinished(tmp_path, pg_url):
    class DiesInFramework(SyntheticAdapter):
        runs = 0

        def run(self, handle, seed):
            DiesInFramework.runs += 1
            if DiesInFramework.runs == 40:
                raise _Killed()
            return super().run(handle, seed)

    plan = load_fleet(_fleet(tmp_path, f"sessions:\n  - {{name: cut, workload: {{set: {SYN % 5}}}}}\n", delay="0"),
                      out=tmp_path / "out", kb=pg_url)
    s = plan.sessions[0]
    d = plan.session_dir(s)
    with pytest.raises(_Killed):  # an earlier fleet run whose worker died and whose retries ran out
        start(d, WorkloadSpec.model_validate(s.spec), budget_minutes=s.budget_minutes, max_trials=s.max_trials,
              adapter=DiesInFramework(), kb_url=pg_url)
    before = load_state(d)
    assert before.phase.value != "DONE"
    res = run_fleet(plan, poll_s=0.5)
    assert res.ok and res.skipped == []
    st = _check_session(d)
    assert st.session_id == before.session_id  # the same session, continued
    assert "resuming" in (plan.out / "logs" / "cut.log").read_text()
    with RecipeStore(pg_url) as store:
        assert [sid for r in store.list_recipes() for sid in r.session_ids] == [st.session_id]
