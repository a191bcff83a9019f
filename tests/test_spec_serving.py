"""``serving.env`` / ``serving.extra_args`` carry no secret and don't move the server (issue 30 items 6 and 8):
refused at validation with one line naming the key, through the real CLI."""

import string

import pytest
from hypothesis import given, settings, strategies as st

from inferloom.cli import main
from inferloom.spec import SpecError, WorkloadSpec, load_spec
from inferloom.spec.serving import check_extra_args, check_serving_env


def _spec_file(tmp_path, serving):
    p = tmp_path / "s.yaml"
    p.write_text("framework: vllm\nmodel: llama-tiny\ndevice: cpu\nserving: " + serving + "\n")
    return p


@pytest.mark.parametrize("serving, says", [
    ("{env: {HF_TOKEN: hf_abc}}", "HF_TOKEN: looks like a secret"),
    ("{env: {OPENAI_API_KEY: sk-x}}", "OPENAI_API_KEY: looks like a secret"),
    ("{env: {LD_PRELOAD: /tmp/x.so}}", "LD_PRELOAD: refused"),
    ("{env: {PYTHONPATH: /tmp/evil}}", "PYTHONPATH: refused"),
    ("{extra_args: ['--api-key', 'sk-123']}", "--api-key: carries a secret"),
    ("{extra_args: ['--hf-token=hf_x']}", "--hf-token: carries a secret"),
    ("{extra_args: ['--host', '0.0.0.0']}", "--host: inferloom sets it"),
    ("{extra_args: ['--port=1']}", "--port: inferloom sets it"),
    ("{extra_args: ['--model', '/elsewhere']}", "--model: inferloom sets it"),
    ("{extra_args: ['--trust-remote-code']}", "--trust-remote-code: refused"),
])
def test_a_refused_serving_field_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, serving, says):
    p = _spec_file(tmp_path, serving)
    with pytest.raises(SpecError, match=says):
        load_spec(p)
    rc = main(["validate", str(p)])
    err = capsys.readouterr().err
    assert rc == 2 and says in err and err.strip().count("\n") == 0, err
    assert "sk-123" not in err and "hf_abc" not in err
    assert sorted(x.name for x in tmp_path.iterdir()) == ["s.yaml"]


def test_settings_that_only_look_alike_are_accepted():
    s = WorkloadSpec.model_validate({"framework": "vllm", "serving": {
        "env": {"TOKENIZERS_PARALLELISM": "false", "VLLM_CPU_KVCACHE_SPACE": "4"},
        "extra_args": ["--max-num-batched-tokens", "64", "--enforce-eager", "--trust-request-chat-template"]}})
    assert s.serving.extra_args[0] == "--max-num-batched-tokens"


_NAME = st.text(string.ascii_uppercase + "_", min_size=1, max_size=20)


@settings(max_examples=300, deadline=None)
@given(_NAME, st.sampled_from(["KEY", "TOKEN", "SECRET", "PASSWORD", "AUTH", "CREDENTIAL"]), _NAME)
def test_any_secret_named_variable_is_refused(head, marker, tail):
    with pytest.raises(ValueError, match="looks like a secret"):
        check_serving_env({head + marker + tail: "v"})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(min_size=0, max_size=30), max_size=6))
def test_extra_args_either_pass_unchanged_or_name_the_refused_flag(args):
    try:
        assert check_extra_args(args) == args
    except ValueError as exc:
        flag = str(exc).split(":", 1)[0]
        assert any(a.lower().split("=", 1)[0] == flag for a in args)
    ok = [a for a in args if not a.startswith("--")]
    assert check_extra_args(ok) == ok  # plain values are never refused
