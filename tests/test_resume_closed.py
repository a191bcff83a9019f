"""`inferloom resume` on a closed session: nothing to run, so no adapter is built.
The published H200 sessions (device cuda) resume, and report, on a CPU-only machine."""

import shutil
from pathlib import Path

import pytest

from inferloom.cli import main
from inferloom.session.state import Phase, load_state

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
SESSIONS = sorted(p.parent for p in RESULTS.rglob("state.json"))


@pytest.mark.parametrize("src", SESSIONS, ids=[str(p.relative_to(RESULTS)) for p in SESSIONS])
def test_resume_of_a_closed_session_builds_nothing_and_changes_nothing(src, tmp_path, capsys):
    d = tmp_path / "s"
    shutil.copytree(src, d)
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    assert load_state(d).phase == Phase.DONE
    assert main(["resume", str(d)]) == 0
    assert "already closed" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()} == before
    assert main(["report", str(d)]) == 0
