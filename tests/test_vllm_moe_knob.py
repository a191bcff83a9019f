"""The knob ``moe_configs`` (vllm_moe_knob) through the vLLM adapter: refused with a reason off CUDA and for
dense models; ``tuned`` builds the config folder from the tuning pass (run by a stand-in server python:
the real Triton kernel can't run on this CPU machine, see _moe_fake_python) and starts the server with
``VLLM_TUNED_CONFIG_FOLDER``; the server's log must say its MoE layers read it; the KB keeps the tables'
content with the winner and a later session's replay writes the folder again from them, without tuning."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _moe_fake_python import write_fake_python

from inferloom.kb import RecipeStore, WorkloadKey
from inferloom.kb.recipe import winner_from_breakdown
from inferloom.report.breakdown import engine_tables
from inferloom.spec import load_spec
from inferloom.workloads.base import AdapterError, EngineTables
from inferloom.workloads.deploy import vllm_deploy
from inferloom.workloads.server_flags import ServerFlags
from inferloom.workloads.vllm_adapter import VLLMAdapter
from inferloom.workloads.vllm_launch import check_launchable, launch_command
from inferloom.workloads.vllm_moe_configs import CPU_NOTE
from inferloom.workloads.vllm_moe_knob import MOE_KNOB, moe_refusal
from test_vllm_overlays import _FakeServer  # the started server's stand-in, shared

NAME = "E=64,N=1024,device_name=NVIDIA_H200.json"


@pytest.fixture
def fake(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERLOOM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FAKE_MOE_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("FAKE_GPU", "NVIDIA H200 NVL")
    return write_fake_python(tmp_path)


def adapter(tmp_path, python, model="olmoe-1b-7b", device="cuda", **limits):
    spec = load_spec(None, {"framework": "vllm", "model": model, "device": device, "serving.python": python,
                            "traffic.concurrency": 2, "traffic.input_len": 8})
    a = VLLMAdapter(spec, log_dir=tmp_path / "servers")
    if a.moe().request is not None:  # a small search: the fake times nothing, but the records stay short (5
        a.moe().request.update(max_configs=5, **limits)  # configs reach num_warps 8, which the fake makes faster
    return a


def stock(a: VLLMAdapter) -> dict:
    return {k.name: k.default for k in a.static_knobs()}


def kept(a: VLLMAdapter) -> tuple[set[str], dict[str, str]]:
    knobs, dropped, _ = a.filter(a.static_knobs(), ServerFlags(None, "unavailable", "vllm 0.32.0"))
    return {k.name for k in knobs}, dropped


def test_the_knob_is_refused_off_cuda_and_dropped_with_a_reason_for_dense_models(fake, tmp_path):
    assert moe_refusal(None, "cpu") == f"{MOE_KNOB}: {CPU_NOTE}"
    assert "no MoE layers" in moe_refusal({"intermediate_size": 8192, "hidden_size": 4096}, "cuda")
    assert moe_refusal({"num_experts": 64, "intermediate_size": 1024}, "cuda") is None
    names, dropped = kept(adapter(tmp_path, fake))
    assert MOE_KNOB in names and MOE_KNOB not in dropped  # an MoE model on CUDA
    dense = adapter(tmp_path / "d", fake, model="llama-tiny-trained")
    names, dropped = kept(dense)
    assert MOE_KNOB not in names and "no MoE layers" in dropped[MOE_KNOB]
    cpu = adapter(tmp_path / "c", fake, device="cpu")  # off CUDA: refused at launch, like every CUDA-only knob
    with pytest.raises(AdapterError, match="moe_configs.*applies only to cuda"):
        check_launchable({**stock(cpu), MOE_KNOB: "tuned"}, cpu.static_knobs(), "cpu", {})


def test_tuned_starts_the_server_with_the_folder_and_its_log_must_say_it_was_read(fake, tmp_path):
    a = adapter(tmp_path, fake)
    assert isinstance(a, EngineTables)
    cfg = {**stock(a), MOE_KNOB: "tuned"}
    assert a.overlays_of({**cfg, MOE_KNOB: "stock"}) == ()
    (ov,) = a.overlays_of(cfg)
    assert a.overlays_of(cfg) == (ov,) and int((tmp_path / "runs").read_text()) == 1  # tuned once
    table = json.loads((ov.path / NAME).read_text())  # the H200 NVL gets vLLM's H200 file name
    assert ov.info["tables"] == {NAME: table} and ov.info["record"]["source"] == "tuned"
    assert set(ov.info["record"]["per_batch"]) == set(table) == {str(m) for m in a.moe().request["batch_sizes"]}
    argv, env, origin = launch_command(a.spec, a.model_dir(), cfg, 8000, None, 0, a.overlays_of(cfg))
    assert env["VLLM_TUNED_CONFIG_FOLDER"] == str(ov.path.absolute())
    assert argv[argv.index("--load-format") + 1] == "dummy"  # the config-only preset: the server's own weights
    assert origin["overlays"][0]["tables"] == {NAME: table}  # in the server_start ledger entry
    dep = vllm_deploy(a.spec, cfg, {"adapter": {"server_distribution": "vllm 0.32.0"}},
                      [{"kind": "server_start", "overlays": origin["overlays"]}])
    assert f"VLLM_TUNED_CONFIG_FOLDER={ov.path.absolute()}" in dep["code"]  # the deployed server reads them too
    assert any("tuned fused-MoE config folder" in n for n in dep["notes"])
    assert "VLLM_TUNED" not in vllm_deploy(a.spec, stock(a), {}, [{"kind": "server_start",
                                                                   "overlays": origin["overlays"]}])["code"]
    log = tmp_path / "server.log"
    log.write_text(f"INFO Using configuration from {ov.path.absolute()}/{NAME} for MoE layer.\n")
    first = a.moe().start_record(cfg, log)
    assert first["moe_config_source"]["source"] == "tuned"
    assert set(first["moe_tuning"]["results"]) == set(table)  # the whole search, recorded once
    assert "moe_tuning" not in a.moe().start_record(cfg, log) and a.moe().start_record(stock(a), log) == {}
    log.write_text("WARNING Using default MoE config. Performance might be sub-optimal!\n")
    with pytest.raises(Exception, match="read default configs"):
        a.moe().start_record(cfg, log)


def test_a_failed_tuning_pass_fails_the_candidate_not_the_session(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MOE_FAIL", "1")
    a = adapter(tmp_path, fake)
    with pytest.raises(AdapterError, match="moe_configs=tuned: fused-MoE tuning pass: exit 1") as e:
        a.overlays_of({**stock(a), MOE_KNOB: "tuned"})
    assert e.value.kind == "engine_overlay"


def test_a_pass_that_finds_nothing_clearly_faster_offers_nothing(fake, tmp_path, monkeypatch):
    """Noise among the configs (every one 1% faster than stock): no folder is built and no server starts;
    the candidate fails with why, once per session and from the cache after (no second pass)."""
    monkeypatch.setenv("FAKE_MOE_NOISE", "1")
    a = adapter(tmp_path, fake)
    for source in ("tuned", "cache"):
        with pytest.raises(AdapterError, match=rf"moe_configs=tuned: the tuning pass \({source}\) found no config "
                                               r"clearly faster .* on NVIDIA H200 NVL: nothing to offer") as e:
            a.overlays_of({**stock(a), MOE_KNOB: "tuned"})
        assert e.value.kind == "engine_overlay"
        cached = re.search(r"every config's times are in (\S+\.json)", str(e.value)).group(1)
        assert json.loads(Path(cached).read_text())["improved"] == []  # the message names the real file
        assert ("moe-tune-result.json" in str(e.value)) == (source == "tuned")
        assert f"(delete {Path(cached).name} to tune again)" in str(e.value)
    assert (tmp_path / "runs").read_text() == "1" and not list((tmp_path / "servers").rglob("E=64,N=1024*.json"))


def test_the_kb_keeps_the_tables_and_a_later_session_writes_them_again(fake, tmp_path):
    a = adapter(tmp_path / "s1", fake)
    final = {**stock(a), MOE_KNOB: "tuned"}
    (ov,) = a.overlays_of(final)
    _, _, origin = launch_command(a.spec, a.model_dir(), final, 8000, None, 0, a.overlays_of(final))
    entries = [{"kind": "server_start", "seq": 5, "overlays": origin["overlays"]}]
    assert engine_tables(entries, stock(a)) == {}  # a stock final stack carries none
    tables = engine_tables(entries, final)
    assert tables == {MOE_KNOB: {NAME: json.loads((ov.path / NAME).read_text())}}
    b = {"final_config": final, "stock_config": stock(a), "final_engine_tables": tables,
         "final": {"ledger_seq": 9, "protocol_verdict": "keep", "quality_passed": True, "ratio": 1.2,
                   "ci_low": 1.1, "ci_high": 1.3, "n_pairs": 5}}
    key = WorkloadKey(model="olmoe", hardware="NVIDIA H200", framework="vllm", model_type="olmoe",
                      architecture="OlmoeForCausalLM", framework_version="0.32.0", precision="bfloat16")
    with RecipeStore(f"sqlite:///{tmp_path / 'kb.sqlite'}") as store:
        assert winner_from_breakdown(b, "s1", 0.0)[0]["evidence"]["engine_tables"] == tables
        store.record_session(key, b, "s1")
        kept_tables = store.show(key).winner["evidence"]["engine_tables"]
    assert kept_tables == tables  # the content, not a path: s1's folder may be gone
    later = adapter(tmp_path / "s2", fake)
    later.replay_tables(kept_tables)
    (again,) = later.overlays_of(final)
    assert int((tmp_path / "runs").read_text()) == 1  # no second pass
    assert again.digest == ov.digest and again.path != ov.path and again.info["record"]["source"] == "kb-replay"
    with pytest.raises(Exception, match="BLOCK_SIZE_N"):
        later.replay_tables({MOE_KNOB: {NAME: {"1": {**json.loads((ov.path / NAME).read_text())["1"],
                                                     "BLOCK_SIZE_N": 48}}}})


def test_remeasure_runs_the_sessions_tables_not_a_new_tuning(tmp_path, monkeypatch):
    """verify --remeasure's fresh process hands the final stack's recorded tables to the adapter before it
    measures (stand-ins for the ledger, adapter and bench: the rest of remeasure has its own tests)."""
    from inferloom.evidence import remeasure as R

    tables = {MOE_KNOB: {NAME: {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 64,
                                      "GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}}}}

    class Adapter:
        got, closed = None, False

        def replay_tables(self, t):
            self.got = t

        def close(self):
            self.closed = True

    made = Adapter()
    monkeypatch.setattr(R.L, "read_entries", lambda d: [])
    monkeypatch.setattr(R, "breakdown_from_ledger", lambda e: {"final_engine_tables": tables})
    monkeypatch.setattr(R._engines, "make_adapter", lambda spec: made)
    monkeypatch.setattr(R, "run_bench", lambda spec, changes, adapter, progress: {"tables": adapter.got})
    assert R._bench_final(tmp_path, None, {MOE_KNOB: "tuned"}) == {"tables": tables} and made.closed


@pytest.mark.parametrize("ours", [True, False])
def test_a_tuned_server_whose_moe_layers_read_another_config_is_stopped_and_refused(fake, tmp_path, monkeypatch, ours):
    from inferloom.workloads import server_adapter as SA
    from inferloom.workloads.vllm_servers import VLLMHandle

    a = adapter(tmp_path, fake)
    cfg = {**stock(a), MOE_KNOB: "tuned"}
    (ov,) = a.overlays_of(cfg)
    logf = tmp_path / "server.log"
    logf.write_text(f"INFO Using configuration from {ov.path.absolute()}/{NAME} for MoE layer.\n" if ours else
                    "WARNING Using default MoE config. Performance might be sub-optimal! Config file not found\n")
    servers = []

    def fake_start(hid, c, cid, launch, port, log_path, *x, **k):
        servers.append(_FakeServer(logf))
        return VLLMHandle(hid, c, cid, servers[-1], 1.0, notes={"log": str(logf)}), {"server_startup_s": 1.0}

    monkeypatch.setattr(SA, "start_server", fake_start)
    monkeypatch.setattr(a, "launch_argv", lambda c, port: ([], {}, {}))
    if ours:
        _, record = a._start(cfg, "new")
        assert record["moe_config_source"]["source"] == "tuned" and "moe_tuning" in record
    else:
        with pytest.raises(AdapterError, match="read default configs") as ei:
            a._start(cfg, "new")
        assert ei.value.kind == "engine_overlay" and servers[0].stopped
