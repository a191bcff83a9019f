"""A session someone handed over (issue 30): nothing of it runs before the user has seen what would run and said
``--trust-session``; a session whose numbers don't verify runs nothing; a written kernel's source must be a plain
file under the session's ``llm/kernels/``; the re-measure process gets no secret-named variable."""

import hashlib
import json
import shutil

import pytest

from inferloom.cli import main
from inferloom.kernels import written
from inferloom.redact import without_secrets
from inferloom.verify.sums import unpack
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
