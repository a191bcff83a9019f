"""`inferloom fleet --address` on a real multi-node Ray cluster: two Ray nodes (a head and a worker node, each
its own raylet with one CPU, started by Ray's own cluster utilities on this machine) and the fleet's driver as
a separate process that joins them, as on many machines. The sessions land on different nodes, the driver
leaves the cluster running, and without --address the fleet starts its own Ray even though this cluster's
address file is there (a `ray start` cluster on the machine is not joined by accident).

The cluster's temp dir (and so its address file) is private to the test (RAY_TMPDIR): other Ray users on the
machine neither see it nor are seen.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from inferloom.kb import RecipeStore  # noqa: E402
from inferloom.session import ledger as L  # noqa: E402

SYN = "{model: llama-tiny, framework: synthetic, device: cpu, seed: %d}"


@pytest.fixture()
def cluster(monkeypatch):
    tmp = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: Ray's socket paths must stay under 107 characters
    monkeypatch.setenv("RAY_TMPDIR", tmp)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        c.add_node(num_cpus=1)
        c.wait_for_nodes()
        yield c
    finally:
        c.shutdown()  # the processes these two nodes started, by their ids
        shutil.rmtree(tmp, ignore_errors=True)


def _fleet_cli(fleet, out, kb, *extra):
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run([sys.executable, "-m", "inferloom.cli", "fleet", str(fleet), "--out", str(out),
                           "--kb", kb, *extra], capture_output=True, text=True, timeout=240, env=env)


def _worker(out, name):
    return json.loads((out / "logs" / f"{name}.worker.json").read_text())


def test_the_driver_joins_a_two_node_cluster_and_sessions_land_on_both_nodes(tmp_path, cluster):
    nodes = {n.node_id for n in cluster.list_all_nodes()}
    assert len(nodes) == 2
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("order: all-at-once\n"
                     "defaults: {budget_minutes: 5, max_trials: 2, cycles: 1, sweep: false,"
                     " env: {INFERLOOM_SYNTHETIC_DELAY_S: '0.05'}}\n"
                     f"sessions:\n  - {{name: a, workload: {{set: {SYN % 1}}}}}\n"
                     f"  - {{name: b, workload: {{set: {SYN % 2}}}}}\n")
    kb = f"sqlite:///{tmp_path / 'kb.sqlite'}"
    out = tmp_path / "joined"
    r = _fleet_cli(fleet, out, kb, "--address", cluster.address)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"joining the cluster at {cluster.address}" in r.stderr and "2 node(s)" in r.stderr, r.stderr
    ran_on = {_worker(out, n)["ray_node_id"] for n in "ab"}
    # both at once, one CPU per node: each session on its own node of the cluster
    assert ran_on == nodes, (ran_on, nodes)
    for n in "ab":
        entries = L.read_entries(out / "sessions" / n)
        assert len([e for e in entries if e["kind"] == L.CLOSE]) == 1
    with RecipeStore(kb) as store:
        assert len(store.list_recipes()) == 1  # one workload key (synthetic llama-tiny on cpu): both filed into it
    assert cluster.remaining_processes_alive()  # the driver left, the cluster stays

    # no --address: an embedded Ray of its own, although this cluster's address file is in RAY_TMPDIR
    assert os.path.exists(os.path.join(os.environ["RAY_TMPDIR"], "ray", "ray_current_cluster"))
    own = tmp_path / "own"
    r = _fleet_cli(fleet, own, kb, "--num-cpus", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "starting an embedded local instance" in r.stderr and "joining" not in r.stderr, r.stderr
    assert not {_worker(own, n)["ray_node_id"] for n in "ab"} & nodes
