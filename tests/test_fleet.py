"""`inferloom fleet`: the fleet file, its plan and order, session status (fast; no Ray here)."""

import fcntl
import json
import os
import subprocess
import sys

import pytest

from inferloom.fleet import FleetError, load_fleet
from inferloom.fleet.status import fleet_status
from inferloom.fleet.worker import run_session
from inferloom.phases.runner import start
from inferloom.spec import load_spec

SYN = {"model": "llama-tiny", "framework": "synthetic"}


def _write(tmp_path, text):
    p = tmp_path / "fleet.yaml"
    p.write_text(text)
    return p


def test_matrix_and_list_expand_in_order_with_leaders_first(tmp_path):
    (tmp_path / "tiny.yaml").write_text("model: llama-tiny\nframework: synthetic\ndevice: cpu\n")
    p = _write(tmp_path, """
out: fl
defaults: {budget_minutes: 2, max_trials: 3, cpus: 2, env: {A: "1"}}
matrix:
  workloads: [tiny.yaml, {name: bf, set: {model: llama-tiny, framework: synthetic, dtype: bfloat16}}]
  devices: [cpu]
  budgets: [{minutes: 1, trials: 1}, {trials: 2}]
sessions:
  - {workload: tiny.yaml, name: extra, env: {B: "2"}}
  - {workload: tiny.yaml, name: extra}
""")
    plan = load_fleet(p)
    names = [s.name for s in plan.sessions]
    assert names == ["tiny-cpu-1m1t", "tiny-cpu-2m2t", "bf-cpu-1m1t", "bf-cpu-2m2t", "extra", "extra-2"]
    assert plan.out == (tmp_path / "fl").absolute() and plan.session_dir("extra") == plan.out / "sessions" / "extra"
    by = {s.name: s for s in plan.sessions}
    # one leader per KB group (model, framework, dtype, device); the others wait for it
    assert [s.name for s in plan.leaders()] == ["tiny-cpu-1m1t", "bf-cpu-1m1t"]
    assert {s.name for s in plan.followers("tiny-cpu-1m1t")} == {"tiny-cpu-2m2t", "extra", "extra-2"}
    assert by["bf-cpu-2m2t"].after == "bf-cpu-1m1t" and by["bf-cpu-1m1t"].spec["dtype"] == "bfloat16"
    assert (by["tiny-cpu-1m1t"].budget_minutes, by["tiny-cpu-1m1t"].max_trials) == (1.0, 1)
    assert (by["tiny-cpu-2m2t"].budget_minutes, by["tiny-cpu-2m2t"].max_trials) == (2.0, 2)
    assert by["extra"].cpus == 2 and by["extra"].gpus == 0 and by["extra"].env == {"A": "1", "B": "2"}
    assert by["extra"].public()["env"] == ["A", "B"] and "spec" not in by["extra"].public()
    # all-at-once: nobody waits
    p2 = _write(tmp_path, p.read_text() + "order: all-at-once\n")
    assert all(s.after is None for s in load_fleet(p2).sessions)


def test_gpu_sessions_ask_ray_for_one_gpu(tmp_path):
    p = _write(tmp_path, "matrix: {workloads: [{set: {model: llama-tiny, framework: synthetic}}], devices: [cuda, cpu]}\n")
    gpu, cpu = load_fleet(p, out=tmp_path / "o", kb="sqlite:///x").sessions
    assert (gpu.device, gpu.gpus, gpu.cpus) == ("cuda", 1, 1.0) and (cpu.device, cpu.gpus) == ("cpu", 0)
    assert gpu.group != cpu.group  # a recipe is per hardware: each device is its own warm-start chain


@pytest.mark.parametrize("text, msg", [
    ("sessions: []\n", "no sessions"),
    ("matrix: {workloads: []}\n", "matrix.workloads: expected a non-empty list"),
    ("matrix: {workloads: [missing.yaml]}\n", "spec file"),
    ("matrix: {workloads: [{set: {model: nope}}]}\n", "matrix.workloads[0]: spec key 'model'"),
    ("matrix: {workloads: [{set: {model: llama-tiny}}], devices: [tpu]}\n", "expected cpu, cuda or auto"),
    ("matrix: {workloads: [{set: {model: llama-tiny}}], budgets: [{minutes: 0}]}\n", "minutes: got 0"),
    ("matrix: {workloads: [{set: {model: llama-tiny}}]}\nsurprise: 1\n", "unknown key(s) ['surprise']"),
    ("matrix: {workloads: [{set: {model: llama-tiny}}]}\norder: random\n", "order: got 'random'"),
    ("sessions: [{device: cpu}]\n", "sessions[0]: no workload"),
    ("defaults: {cycles: 0}\nsessions: [{workload: {set: {model: llama-tiny}}}]\n", "defaults.cycles"),
    ("- a\n- b\n", "expected a mapping"),
])
def test_bad_fleet_files_are_one_line_errors(tmp_path, text, msg):
    with pytest.raises(FleetError) as e:
        load_fleet(_write(tmp_path, text))
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_missing_fleet_file_via_the_cli_exits_2(tmp_path):
    p = subprocess.run([sys.executable, "-m", "inferloom.cli", "fleet", str(tmp_path / "none.yaml")],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "fleet file" in p.stderr and "not found" in p.stderr


def test_cli_plan_prints_the_order_and_runs_nothing(tmp_path):
    p = _write(tmp_path, "matrix: {workloads: [{name: s, set: {model: llama-tiny, framework: synthetic}}], "
                         "budgets: [{trials: 1}, {trials: 2}]}\n")
    r = subprocess.run([sys.executable, "-m", "inferloom.cli", "fleet", str(p), "--plan", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert [(s["name"], s["after"]) for s in got["sessions"]] == [("s-cpu-5m1t", None), ("s-cpu-5m2t", "s-cpu-5m1t")]
    assert not (tmp_path / "o").exists()


def test_status_reads_each_session_directory(tmp_path):
    p = _write(tmp_path, "matrix: {workloads: [{name: s, set: {model: llama-tiny, framework: synthetic}}], "
                         "budgets: [{trials: 1}, {trials: 2}]}\n")
    plan = load_fleet(p, out=tmp_path / "o")
    assert [s.status for s in fleet_status(plan)] == ["pending", "pending"]
    first = plan.sessions[0]
    start(plan.session_dir(first), load_spec(None, {**SYN, "device": "cpu"}), budget_minutes=1, max_trials=1,
          kb_url=None)
    done, pending = fleet_status(plan)
    assert done.status == "done" and done.phase == "DONE" and done.trials_used == 1 and done.breakdown
    assert "done:" in done.line() and pending.status == "pending"


def test_worker_runs_a_session_once_per_directory_and_a_failure_is_data(tmp_path):
    p = _write(tmp_path, "sessions:\n  - {name: s, workload: {set: {model: llama-tiny, framework: synthetic}}, "
                         "budget: {trials: 1}}\n  - {name: bad, workload: {set: {model: llama-tiny, framework: "
                         "synthetic}}, env: {INFERLOOM_SYNTHETIC_DELAY_S: oops}}\n")
    plan = load_fleet(p, out=tmp_path / "o")
    s, bad = (x.to_dict() for x in plan.sessions)
    logs = str(plan.out / "logs")
    kb = f"sqlite:///{tmp_path / 'kb.sqlite'}"
    (plan.out / "logs").mkdir(parents=True)
    with open(plan.out / "logs" / "s.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another worker holds the session
        busy = run_session(s, str(plan.session_dir("s")), kb, logs)
    assert busy["ok"] is False and "being run by another worker" in busy["error"]
    assert not (plan.session_dir("s") / "state.json").exists()
    first = run_session(s, str(plan.session_dir("s")), kb, logs)
    assert first["ok"] and first["attempt"] == 1 and first["stop_reason"]
    again = run_session(s, str(plan.session_dir("s")), kb, logs)  # closed: nothing more is run
    assert again["ok"] and again["session_id"] == first["session_id"] and again["attempt"] == 2
    assert "already closed" in (plan.out / "logs" / "s.log").read_text()
    failed = run_session(bad, str(plan.session_dir("bad")), kb, logs)
    assert failed["ok"] is False and "oops" in failed["error"] and failed["session_id"] is None
    assert [x.status for x in fleet_status(plan)] == ["done", "failed"]
    assert "INFERLOOM_SYNTHETIC_DELAY_S" not in os.environ  # the session's env does not leak into the worker


def test_session_names_stay_unique_when_a_suffixed_name_is_also_given(tmp_path):
    """`one`, `one`, `one-2`: three sessions, three directories (the second `one` became `one-2` and the
    given `one-2` must not share it: issue 30)."""
    (tmp_path / "tiny.yaml").write_text("model: llama-tiny\nframework: synthetic\ndevice: cpu\n")
    p = _write(tmp_path, """
sessions:
  - {workload: tiny.yaml, name: one}
  - {workload: tiny.yaml, name: one}
  - {workload: tiny.yaml, name: one-2}
""")
    plan = load_fleet(p)
    names = [s.name for s in plan.sessions]
    assert names == ["one", "one-2", "one-2-2"]
    assert len({plan.session_dir(s) for s in plan.sessions}) == 3
