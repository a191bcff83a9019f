"""``serving.engine_patches``: the directory of engine diffs, validated before anything runs (one line,
exit 2): a missing directory, a non-patch file, a patch wholly outside the vllm package, a framework other
than vllm; a good directory resolves relative to the spec file."""

from __future__ import annotations

import pytest

from inferloom import cli
from inferloom.spec import SpecError, load_spec

GOOD = ("Title: a log line\nHypothesis: vllm/v1/engine/core.py logs once more\n\n"
        "--- a/vllm/v1/engine/core.py\n+++ b/vllm/v1/engine/core.py\n@@ -1,1 +1,2 @@\n x = 1\n+y = 2\n")


def _spec(tmp_path, patches, framework="vllm"):
    f = tmp_path / "spec.yaml"
    f.write_text(f"framework: {framework}\nmodel: llama-tiny\nserving:\n  engine_patches: {patches}\n")
    return f


def _dir(tmp_path, files):
    d = tmp_path / "engine-patches"
    d.mkdir()
    for name, text in files.items():
        (d / name).write_text(text)
    return d


def test_a_directory_of_patches_and_sidecars_resolves_next_to_the_spec(tmp_path):
    d = _dir(tmp_path, {"01-log.patch": GOOD, "01-log.json": "{}", "README.md": "x",
                        "02-pr.diff": GOOD + "--- a/tests/t.py\n+++ b/tests/t.py\n@@ -1 +1 @@\n-a\n+b\n"})
    spec = load_spec(str(_spec(tmp_path, "engine-patches")))
    assert spec.serving.engine_patches == str(d)  # relative to the spec file's folder, made absolute
    assert load_spec(None, {"framework": "vllm"}).serving.engine_patches is None


@pytest.mark.parametrize("files, says", [
    (None, "no such directory"),
    ({}, "holds no .patch or .diff file"),
    ({"a.patch": GOOD, "notes.txt": "x"}, "notes.txt: not a patch"),
    ({"a.patch": GOOD, "b.json": "{}"}, "b.json: not a patch"),  # a sidecar of no patch
    ({"a.patch": "just words\n"}, "no file section"),
    ({"a.patch": GOOD.replace("vllm/v1/engine/core.py", "csrc/ops.cu")}, "touches no file of the vllm package"),
])
def test_a_bad_directory_is_one_line_at_validation(tmp_path, files, says):
    if files is not None:
        _dir(tmp_path, files)
    with pytest.raises(SpecError, match=says) as e:
        load_spec(str(_spec(tmp_path, "engine-patches")))
    assert "serving.engine_patches" in str(e.value) and "\n" not in str(e.value)


def test_only_a_vllm_workload_takes_engine_patches(tmp_path):
    _dir(tmp_path, {"a.patch": GOOD})
    with pytest.raises(SpecError, match="needs framework: vllm"):
        load_spec(str(_spec(tmp_path, "engine-patches", framework="sglang")))


def test_validate_exits_2_with_one_line(tmp_path, capsys):
    _dir(tmp_path, {"a.patch": GOOD, "stray.py": "x"})
    assert cli.main(["validate", str(_spec(tmp_path, "engine-patches"))]) == 2
    err = capsys.readouterr().err.strip()
    assert "stray.py: not a patch" in err and len(err.splitlines()) == 1
