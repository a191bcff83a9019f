"""Spec validation: unknown keys and bad values are one-line errors naming the key."""

import pytest

from inferloom.spec import REQUESTS_PER_CONCURRENCY, SpecError, Traffic, load_spec, spec_hash


def write(tmp_path, text):
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    return p


def test_defaults_and_overrides(tmp_path):
    spec = load_spec(write(tmp_path, "model: llama-tiny\ntraffic:\n  concurrency: 4\n"), {"traffic.output_len": "16"})
    assert spec.traffic.concurrency == 4
    assert spec.traffic.output_len == 16
    assert spec.requests_per_run == 16  # default 4 x concurrency
    assert spec.framework == "transformers"


def test_cli_only_spec_without_file():
    spec = load_spec(None, {"model": "llama-tiny", "device": "cpu", "traffic.concurrency": "2"})
    assert spec.device == "cpu" and spec.traffic.concurrency == 2


@pytest.mark.parametrize(
    "text, key, expected",
    [
        ("model: llama-tiny\nbogus: 1\n", "bogus", "unknown key"),
        ("model: llama-tiny\ntraffic:\n  concurency: 4\n", "traffic.concurency", "unknown key"),
        ("model: llama-tiny\ntraffic:\n  concurrency: 0\n", "traffic.concurrency", "greater than or equal to 1"),
        ("model: llama-tiny\ntraffic:\n  concurrency: lots\n", "traffic.concurrency", "valid integer"),
        ("model: llama-tiny\ndevice: tpu\n", "device", "'cpu', 'cuda' or 'auto'"),
        ("model: no-such-model\n", "model", "expected a preset"),
        ("model: llama-tiny\ntraffic:\n  prompts: x.txt\n", "traffic.prompts", "jsonl"),
        ("model: llama-tiny\ntraffic:\n  prompts: missing.jsonl\n", "traffic.prompts", "not found"),
        ("model: llama-tiny\nprotocol:\n  confidence: 1.5\n", "protocol.confidence", "less than 1"),
        ("model: llama-tiny\nprotocol:\n  min_pairs: 8\n  max_pairs: 6\n", "protocol", "max_pairs >= min_pairs"),
    ],
)
def test_bad_values_are_one_line_errors(tmp_path, text, key, expected):
    with pytest.raises(SpecError) as ei:
        load_spec(write(tmp_path, text))
    msg = str(ei.value)
    assert "\n" not in msg
    assert f"'{key}'" in msg
    assert expected in msg


def test_unknown_key_lists_allowed_keys(tmp_path):
    with pytest.raises(SpecError, match="expected one of: concurrency, input_len"):
        load_spec(write(tmp_path, "traffic:\n  concurency: 4\n"))


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(SpecError, match="not found"):
        load_spec(tmp_path / "nope.yaml")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(write(tmp_path, "model: [unclosed\n"))
    with pytest.raises(SpecError, match="mapping"):
        load_spec(write(tmp_path, "- a\n- b\n"))


def test_model_directory_needs_config(tmp_path):
    (tmp_path / "m").mkdir()
    with pytest.raises(SpecError, match="config.json"):
        load_spec(None, {"model": str(tmp_path / "m")})
    (tmp_path / "m" / "config.json").write_text("{}")
    assert load_spec(None, {"model": str(tmp_path / "m")}).model == str((tmp_path / "m").resolve())


def test_hash_is_stable_and_sensitive():
    a = load_spec(None, {"model": "llama-tiny"})
    b = load_spec(None, {"model": "llama-tiny"})
    c = load_spec(None, {"model": "llama-tiny", "seed": "1"})
    assert spec_hash(a) == spec_hash(b) != spec_hash(c)


def test_requests_per_run_is_one_rule_per_framework():
    """One rule: vLLM runs use 5 x concurrency (every vLLM result in docs was
    measured so), the in-process adapters 4 x; num_prompts overrides both; the
    spec's description is written from the same table."""
    base = {"model": "llama-tiny", "traffic.concurrency": "3"}
    assert REQUESTS_PER_CONCURRENCY["vllm"] == 5
    assert load_spec(None, {**base, "framework": "vllm"}).requests_per_run == 15
    for fw in ("transformers", "synthetic"):
        assert REQUESTS_PER_CONCURRENCY[fw] == 4
        assert load_spec(None, {**base, "framework": fw}).requests_per_run == 12
        assert load_spec(None, {**base, "framework": fw, "traffic.num_prompts": "7"}).requests_per_run == 7
    assert load_spec(None, {**base, "framework": "vllm", "traffic.num_prompts": "7"}).requests_per_run == 7
    desc = Traffic.model_fields["num_prompts"].description
    assert "transformers 4 x concurrency" in desc and "vllm 5 x concurrency" in desc
