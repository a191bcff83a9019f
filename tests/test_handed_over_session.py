"""A session someone handed over (issue 30): nothing of it runs before the user has seen what would run and said
``--trust-session``; a session whose numbers don't verify runs nothing; a written kernel's source must be a plain
file under the session's ``llm/kernels/``; the re-measure process gets no secret-named variable."""

import hashlib
import json
import shutil

import pytest

from inferloom.agents.llm_record import EXCHANGES
from inferloom.cli import main
from inferloom.kernels import written
from inferloom.redact import without_secrets
from inferloom.verify.sums import unpack
from llm_scripted_server import ScriptedLLM
from test_llm_session import proposal, run, spec
from test_remeasure import synthetic


session = synthetic  # the closed synthetic session test_remeasure re-measures (one fixture, not a copy)


def test_remeasure_without_trust_says_what_would_run_and_runs_nothing(capsys, session):
    rc = main(["verify", str(session), "--remeasure", "--max-pairs", "4", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "re-measuring it runs the following on this machine" in out and "framework synthetic" in out
    assert "not re-measured: add --trust-session" in out
    assert "remeasure (fresh process" not in out


def test_rebuild_without_trust_names_the_pins_and_builds_nothing(capsys, session, tmp_path):
    venv = tmp_path / "v"
    rc = main(["verify", str(session), "--rebuild", "--venv", str(venv), "--quiet"])
    out = capsys.readouterr().out
    assert rc == 1 and "pinned package(s)" in out and "--trust-session" in out
    assert not venv.exists()


def test_a_session_with_a_mismatch_is_not_remeasured_even_when_trusted(capsys, session, tmp_path):
    d = tmp_path / "s"
    shutil.copytree(session, d)
    lines = (d / "ledger.jsonl").read_text().splitlines()
    for i, line in enumerate(lines):
        e = json.loads(line)
        if e.get("action") == "final_compare":
            e["protocol"]["decision"]["ratio"] *= 2
            lines[i] = json.dumps(e)
    (d / "ledger.jsonl").write_text("\n".join(lines) + "\n")
    rc = main(["verify", str(d), "--remeasure", "--trust-session", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 1 and "MISMATCH" in out and "not re-measured" in out
    assert "remeasure (fresh process" not in out


@pytest.mark.parametrize("argv", [["--max-pairs", "2", "--remeasure"], ["--trust-session"]])
def test_bad_verify_options_are_one_line_usage_errors(capsys, session, argv):
    try:
        rc = main(["verify", str(session), *argv])
    except SystemExit as exc:  # argparse's range check
        rc = exc.code
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and ("from 3 to 200" in err or "only with --remeasure" in err), err


def _book(tmp_path, path_field):
    d = tmp_path / "sess"
    k = d / "llm" / "kernels"
    k.mkdir(parents=True)
    evil = tmp_path / "elsewhere.py"
    evil.write_text("open(__file__ + '.ran', 'w').write('imported')\ndef kernel(*a):\n    return a\n")
    sha = hashlib.sha256(evil.read_bytes()).hexdigest()
    value = f"silu_mul-{sha[:10]}"
    target = path_field(evil, k)
    (k / written.PASSED).write_text(json.dumps({value: {"entry": "silu_mul", "path": target, "sha256": sha}}))
    return d, value, evil


@pytest.mark.parametrize("how", ["absolute", "dotdot", "subdir"])
def test_a_written_kernel_outside_the_session_folder_is_refused(tmp_path, how):
    def field(evil, k):
        return {"absolute": str(evil), "dotdot": "../../../elsewhere.py", "subdir": "x/elsewhere.py"}[how]
    d, value, evil = _book(tmp_path, field)
    with pytest.raises(written.WrittenKernelError, match="not a plain file name under llm/kernels/"):
        written.restore_checked(d, [value])
    with pytest.raises(written.WrittenKernelError):
        written.restore(d)
    assert not (tmp_path / "elsewhere.py.ran").exists()


def test_a_written_kernel_linked_out_of_the_session_folder_is_refused(tmp_path):
    def field(evil, k):
        (k / "linked.py").symlink_to(evil)
        return "linked.py"
    d, value, _ = _book(tmp_path, field)
    with pytest.raises(written.WrittenKernelError, match="leads outside"):
        written.restore_checked(d, [value])


def test_the_remeasure_environment_has_no_secrets():
    env = without_secrets({"PATH": "/bin", "OPENAI_API_KEY": "sk-x", "HF_TOKEN": "hf", "PGPASSWORD": "p",
                           "HOME": "/root"})
    assert env == {"PATH": "/bin", "HOME": "/root"}


def test_an_export_whose_sums_fail_is_not_remeasured(capsys, session, tmp_path):
    archive = tmp_path / "s.tar.gz"
    assert main(["export", str(session), "--out", str(archive)]) == 0
    out = unpack(archive, tmp_path / "u")
    report = next(p for p in out.rglob("*.md"))
    report.write_text(report.read_text() + "\nedited after the export\n")
    capsys.readouterr()
    rc = main(["verify", str(out), "--remeasure", "--trust-session", "--quiet"])
    text = capsys.readouterr().out
    assert rc == 1 and "MISMATCH SHA256SUMS" in text and "not re-measured" in text
    assert "remeasure (fresh process" not in text


def test_a_replay_with_written_code_runs_only_with_trust(tmp_path, capsys, monkeypatch):
    """``optimize --llm-replay DIR``: replies of a code-writing role (kernel_author: Python imported here) are
    listed and nothing runs, exit 1, unless ``--trust-session``; proposals only need no trust."""
    monkeypatch.setenv("TEST_LLM_KEY", "sk-test-not-a-real-key")
    d = tmp_path / "theirs"
    with ScriptedLLM() as s:
        s.script("ConfigProposal", proposal({"fast_path": True}), proposal({}, "end_phase"))
        run(d, spec(s.url, roles="orchestrator"))
    argv = ["optimize", "--framework", "synthetic", "--device", "cpu", "--llm-replay", str(d), "--quiet", "--no-kb",
            "--max-trials", "1", "--budget-minutes", "1", "--no-sweep"]
    assert main([*argv, "--out", str(tmp_path / "plain")]) == 0  # proposals only: no code, no trust needed
    with open(d / EXCHANGES, "a") as fh:  # the author's recorded kernel: code this process would import
        fh.write(json.dumps({"n": 99, "role": "kernel_author", "reply": {"source": "import os\n"}}) + "\n")
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "new")]) == 1
    out = capsys.readouterr().out
    assert "1 kernel_author reply: Python kernels this process imports" in out and "--trust-session" in out, out
    assert not (tmp_path / "new").exists()
    assert main([*argv, "--out", str(tmp_path / "trusted"), "--trust-session"]) == 0
    assert (tmp_path / "trusted" / "state.json").is_file()
    assert main(["optimize", "--framework", "synthetic", "--device", "cpu", "--trust-session", "--quiet",
                 "--out", str(tmp_path / "x")]) == 2
    assert "only with --llm-replay" in capsys.readouterr().err and not (tmp_path / "x").exists()
