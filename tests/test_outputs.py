"""Output flags never write over a session's files or an existing file (unless
--force), refuse a directory that is missing, a file or unwritable (one line,
exit 2, nothing written); `report` never replaces a report with one from fewer
ledger entries; a KB write failure at CLOSE is a ledger entry and a report
line, and sessions without one render byte for byte as before. Real sessions
of the synthetic adapter, through the CLI."""

import json
import shutil
from pathlib import Path

import pytest

from inferloom.cli import main
from inferloom.report.breakdown import breakdown_from_ledger
from inferloom.report.html import render_html
from inferloom.report.markdown import render_report
from inferloom.session import ledger as L
from inferloom.session.state import Phase, load_state

SESSION = ["optimize", "--model", "llama-tiny", "--framework", "synthetic", "--device", "cpu", "--seed", "3",
           "--budget-minutes", "5", "--max-trials", "3", "--no-sweep", "--quiet"]
BENCH = ["bench", "--model", "llama-tiny", "--framework", "synthetic", "--device", "cpu", "--aa", "--quiet"]
RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
PUBLISHED = sorted(p.parent for p in RESULTS.rglob("state.json"))


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    """Two closed sessions (a and b) and a KB holding them."""
    root = tmp_path_factory.mktemp("outputs")
    for name in ("a", "b"):
        assert main([*SESSION, "--out", str(root / name), "--kb", str(root / "kb.sqlite")]) == 0
    return root


def _snapshot(root):
    return {str(p): p.read_bytes() for p in Path(root).rglob("*") if p.is_file()}


def _refused(capsys, args, *phrases):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for p in phrases:
        assert p in err, err
    return err


@pytest.mark.parametrize("target", ["state.json", "ledger.jsonl", "manifest.json", "report.md",
                                    "session_breakdown.json", "new-file.json"])
def test_no_output_flag_writes_into_a_session_directory(sessions, capsys, target):
    a, b = sessions / "a", sessions / "b"
    before = _snapshot(sessions)
    kb = str(sessions / "kb.sqlite")
    for args in ([*BENCH, "--out", str(a / target)], [*BENCH, "--out", str(a / target), "--force"],
                 ["report", str(b), "--html", "--out", str(a / target)],
                 ["report", str(b), "--html", "--out", str(a / target), "--force"],
                 ["kb", "--kb", kb, "export", str(a / target)], ["kb", "--kb", kb, "export", str(a / target), "--force"]):
        _refused(capsys, args, "inside the session directory", "nothing was written")
    # a session's own files are refused too (report.html in place is the one file it may rewrite)
    _refused(capsys, ["report", str(a), "--html", "--out", str(a / "state.json"), "--force"], "inside the session")
    _refused(capsys, ["report", str(b), "--html", "--out", str(a / "report.html")], "inside the session")
    _refused(capsys, ["export", str(b), "--out", str(a / "export")], "inside the session")
    _refused(capsys, [*SESSION, "--out", str(a / "nested")], "inside the session")
    _refused(capsys, ["export", str(a), "--out", str(a / "ledger.jsonl")], "is a file")
    assert _snapshot(sessions) == before


def test_an_existing_file_is_replaced_only_with_force(sessions, tmp_path, capsys):
    out = tmp_path / "r.json"
    out.write_text("keep me")
    _refused(capsys, [*BENCH, "--out", str(out)], "exists", "--force")
    _refused(capsys, ["kb", "--kb", str(sessions / "kb.sqlite"), "export", str(out)], "exists", "--force")
    _refused(capsys, ["report", str(sessions / "a"), "--html", "--out", str(out)], "exists", "--force")
    assert out.read_text() == "keep me"
    assert main([*BENCH, "--out", str(out), "--force"]) == 0
    assert json.loads(out.read_text())["kind"] == "aa"
    assert main(["kb", "--kb", str(sessions / "kb.sqlite"), "export", str(out), "--force"]) == 0
    assert len(json.loads(out.read_text())["recipes"]) >= 1


def test_an_output_directory_missing_a_file_or_unwritable_is_one_line(sessions, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    kb = str(sessions / "kb.sqlite")
    for path, phrase in ((tmp_path / "missing" / "x.json", "does not exist"), (afile / "x.json", "not a directory"),
                         (Path("/proc/inferloom-x.json"), "can't write"), (tmp_path, "is a directory")):
        _refused(capsys, [*BENCH, "--out", str(path)], phrase)
        _refused(capsys, ["kb", "--kb", kb, "export", str(path)], phrase)
        _refused(capsys, ["report", str(sessions / "a"), "--html", "--out", str(path)], phrase)
    _refused(capsys, [*SESSION, "--out", str(afile)], "is a file")
    _refused(capsys, [*SESSION, "--out", str(afile / "s")], "is a file")
    _refused(capsys, [*SESSION, "--out", "/proc/inferloom-s"], "can't write")
    _refused(capsys, ["export", str(sessions / "a"), "--out", str(afile)], "is a file")
    held = tmp_path / "held"
    held.mkdir()
    (held / "report.md").write_text("someone's report")
    _refused(capsys, [*SESSION, "--out", str(held)], "already holds report.md")
    assert not (tmp_path / "missing").exists() and afile.read_text() == "x"
    assert sorted(p.name for p in held.iterdir()) == ["report.md"]


def test_report_never_replaces_a_report_from_fewer_ledger_entries(sessions, tmp_path, capsys):
    d = tmp_path / "s"
    shutil.copytree(sessions / "a", d)
    report = (d / "report.md").read_bytes()
    assert main(["report", str(d), "--html"]) == 0  # the whole ledger: re-rendered, same report
    assert (d / "report.md").read_bytes() == report
    lines = (d / "ledger.jsonl").read_bytes().splitlines(keepends=True)
    for kept in (0, len(lines) // 2, len(lines) - 1):  # emptied, halved, one entry short
        (d / "ledger.jsonl").write_bytes(b"".join(lines[:kept]))
        snap = _snapshot(d)
        _refused(capsys, ["report", str(d), "--html"], f"holds {kept} entries", "nothing was written")
        assert _snapshot(d) == snap and (d / "report.md").read_bytes() == report
    # an old report without a breakdown still protects itself (its citations, ledger #N)
    (d / "session_breakdown.json").unlink()
    (d / "ledger.jsonl").write_bytes(b"".join(lines[:len(lines) // 2]))
    _refused(capsys, ["report", str(d)], "cites ledger #")
    assert (d / "report.md").read_bytes() == report


def test_a_kb_write_failure_at_close_is_a_ledger_entry_and_a_report_line(tmp_path, capsys):
    kb = tmp_path / "kb.sqlite"
    assert main([*SESSION, "--out", str(tmp_path / "first"), "--kb", str(kb)]) == 0  # a KB with its schema
    ro = f"sqlite:///file:{kb}?mode=ro&uri=true"  # readable, so PRELUDE's lookup works; writing fails
    d = tmp_path / "s"
    assert main([*SESSION, "--out", str(d), "--kb", ro]) == 0
    assert load_state(d).phase == Phase.DONE
    entries = L.read_entries(d)
    assert any(e["kind"] == "kb_lookup" for e in entries)  # the read worked
    fail = [e for e in entries if e["kind"] == L.ERROR and e.get("failure") == "kb_write"]
    assert len(fail) == 1 and "readonly" in fail[0]["error"] and fail[0]["todo"]
    assert fail[0]["seq"] > next(e["seq"] for e in entries if e["kind"] == L.CLOSE)
    seq = fail[0]["seq"]
    md = (d / "report.md").read_text()
    line = next(x for x in md.splitlines() if "Not filed in the knowledge base" in x)
    assert "readonly" in line and f"ledger #{seq}" in line
    assert json.loads((d / "session_breakdown.json").read_text())["kb_write_failed"]["ledger_seq"] == seq
    assert main(["report", str(d), "--html"]) == 0 and (d / "report.md").read_text() == md  # re-rendered: the same
    page = (d / "report.html").read_text()
    assert "not filed" in page and "readonly" in page and f"#{seq}" in page


@pytest.mark.parametrize("src", PUBLISHED, ids=[str(p.relative_to(RESULTS)) for p in PUBLISHED])
def test_sessions_without_a_kb_failure_render_as_before(src, tmp_path, capsys):
    d = tmp_path / "s"
    shutil.copytree(src, d)
    b = breakdown_from_ledger(L.read_entries(d))
    assert "kb_write_failed" not in b
    if (src / "report.html").is_file():  # rendered by the renderer before this change: byte for byte the same,
        assert main(["report", str(d), "--html"]) == 0  # but for the Deploy section added since (from its files)
        page = (d / "report.html").read_text()
        i = page.index('<section id="deploy">')
        page = page[:i] + page[page.index("</section>", i) + len("</section>\n"):]
        page = page.replace('<a href="#deploy">Deploy</a>', "")
        assert page.encode() == (src / "report.html").read_bytes()
    # the failure adds exactly its line to each page, nothing else changes
    failed = {**b, "kb_write_failed": {"error": "E-9", "todo": "T-9", "ledger_seq": 1}}
    md, md2 = render_report(b).splitlines(), render_report(failed).splitlines()
    extra = [x for x in md2 if x not in md]
    assert len(md2) == len(md) + 1 and len(extra) == 1 and "E-9" in extra[0] and [x for x in md2 if x != extra[0]] == md
    html, html2 = render_html(b), render_html(failed)
    assert "E-9" not in html and "E-9" in html2 and html2.replace(html2[html2.index("<dt>Knowledge base"):
                                                                      html2.index("</dd>", html2.index("E-9")) + 5], "") == html
