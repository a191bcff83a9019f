"""``inferloom export SESSION_DIR --out FILE.tar.gz``: one archive with manifest, ledger, reports, patches, final
configuration and SHA256SUMS; ``inferloom verify`` accepts the archive or its unpacked folder and checks the sums
(a changed file fails, naming it)."""

import hashlib
import io
import json
import subprocess
import tarfile

import pytest

from inferloom.cli import main
from inferloom.phases.runner import start
from inferloom.verify.sums import bundle_hash
from test_session import SPEC, agents, two_knob_adapter


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    root = tmp_path_factory.mktemp("archive")
    d = root / "s"
    start(d, SPEC, budget_minutes=10, max_trials=3, adapter=two_knob_adapter(), agents=agents(), sweep=False,
          kb_url=None)
    out = root / "bundle.tar.gz"
    assert main(["export", str(d), "--out", str(out)]) == 0
    return d, out


def _run(capsys, *argv):
    rc = main(list(argv))
    o = capsys.readouterr()
    return rc, o.out, o.err


def _unpack(out, into):
    with tarfile.open(out) as tar:
        tar.extractall(into, filter="data")
    [top] = list(into.iterdir())
    return top


def test_the_archive_holds_the_whole_bundle_with_correct_sums(archive, tmp_path):
    d, out = archive
    top = _unpack(out, tmp_path)
    names = {p.relative_to(top).as_posix() for p in top.rglob("*") if p.is_file()}
    assert {"manifest.json", "ledger.jsonl", "state.json", "report.md", "session_breakdown.json",
            "export/final_config.json", "export/README.md", "BUNDLE_HASH", "SHA256SUMS"} <= names
    final = json.loads((top / "export" / "final_config.json").read_text())
    assert final["final_config"]["fast_path"] is True
    assert (top / "ledger.jsonl").read_bytes() == (d / "ledger.jsonl").read_bytes()
    assert (top / "BUNDLE_HASH").read_text().strip() == bundle_hash(d)
    # the sums are in sha256sum's format: the standard tool agrees
    res = subprocess.run(["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=top, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    listed = {line.split("  ", 1)[1] for line in (top / "SHA256SUMS").read_text().splitlines()}
    assert listed == names - {"SHA256SUMS"}


def test_verify_accepts_the_archive_and_its_unpacked_folder(capsys, archive, tmp_path):
    _, out = archive
    rc, text, err = _run(capsys, "verify", str(out))
    assert rc == 0, text + err
    assert "SHA256SUMS" in text and "bundle hash" in text and "all consistent" in text
    top = _unpack(out, tmp_path)
    rc, text, err = _run(capsys, "verify", str(top))
    assert rc == 0, text + err
    assert "SHA256SUMS" in text


@pytest.mark.parametrize("change", ["report", "ledger", "extra", "missing"])
def test_a_changed_file_fails_naming_it(capsys, archive, tmp_path, change):
    _, out = archive
    top = _unpack(out, tmp_path)
    if change == "report":
        (top / "report.md").write_text((top / "report.md").read_text() + "\nFinal stack: x9.99 vs stock.\n")
        name = "report.md"
    elif change == "ledger":
        lines = (top / "ledger.jsonl").read_text().splitlines()
        lines[-1] = lines[-1].replace('"ts":', '"ts": ', 1)  # same JSON, other bytes
        (top / "ledger.jsonl").write_text("\n".join(lines) + "\n")
        name = "ledger.jsonl"
    elif change == "extra":
        (top / "export" / "sneaked.patch").write_text("x")
        name = "export/sneaked.patch"
    else:
        (top / "export" / "README.md").unlink()
        name = "export/README.md"
    rc, text, err = _run(capsys, "verify", str(top))
    assert rc == 1, text + err
    bad = [line for line in text.splitlines() if line.startswith("MISMATCH SHA256SUMS")]
    assert len(bad) == 1 and f": {name}:" in bad[0], text
    # the same change inside a re-packed archive fails the same way
    rep = tmp_path / "re.tar.gz"
    with tarfile.open(rep, "w:gz") as tar:
        tar.add(top, arcname=top.name)
    rc, text, _ = _run(capsys, "verify", str(rep))
    assert rc == 1 and f"MISMATCH SHA256SUMS: {name}:" in text


def test_export_refuses_an_existing_archive_and_verify_a_hostile_one(capsys, archive, tmp_path):
    d, out = archive
    rc, _, err = _run(capsys, "export", str(d), "--out", str(out))
    assert rc == 2 and "exists" in err
    evil = tmp_path / "evil.tar.gz"
    with tarfile.open(evil, "w:gz") as tar:
        data = b"x"
        info = tarfile.TarInfo("../outside")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    rc, _, err = _run(capsys, "verify", str(evil))
    assert rc == 2 and "not a plain file or folder inside the archive" in err
    assert not (tmp_path.parent / "outside").exists()
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(hashlib.sha256(b"x").digest())
    rc, _, err = _run(capsys, "verify", str(junk))
    assert rc == 2 and "not a readable .tar.gz" in err
