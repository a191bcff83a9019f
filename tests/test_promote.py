"""``inferloom promote``: a person's approval recorded in the session and the KB (who, when, the bundle's
hash), marked in ``kb list`` / ``kb show``, preferred by lookups; refused for a session without a winner, an
unfinished or running one, or a bundle that no longer hashes to what was reviewed. Also the KB's schema
migration 1 -> 2."""

import json
import shutil

import pytest
from sqlalchemy import create_engine, text

from inferloom.cli import main
from inferloom.kb import RecipeStore, WorkloadKey
from inferloom.kb.db import SCHEMA_VERSION
from inferloom.phases.runner import start
from inferloom.session import ledger as L
from inferloom.verify import verify_session
from inferloom.verify.sums import bundle_hash
from inferloom.workloads.synthetic import SyntheticAdapter
from test_session import SPEC, TWO_KNOBS, agents, two_knob_adapter


@pytest.fixture(scope="module")
def won(tmp_path_factory):
    """A closed real session whose final stack was kept (filed as a winner in its own KB)."""
    root = tmp_path_factory.mktemp("promote")
    kb = root / "kb.sqlite"
    d = root / "s"
    st = start(d, SPEC, budget_minutes=10, max_trials=3, adapter=two_knob_adapter(), agents=agents(), sweep=False,
               kb_url=str(kb))
    assert st.stack["fast_path"] is True
    with RecipeStore(str(kb)) as s:
        assert s.list_recipes()[0].winner["session_id"] == st.session_id
    return d, kb


def _copy(won, tmp_path):
    d, kb = won
    shutil.copytree(d, tmp_path / "s")
    shutil.copy(kb, tmp_path / "kb.sqlite")
    return tmp_path / "s", str(tmp_path / "kb.sqlite")


def _run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_promote_records_who_when_and_the_bundle_hash_in_the_session_and_the_kb(capsys, won, tmp_path):
    d, kb = _copy(won, tmp_path)
    digest = bundle_hash(d)
    rc, out, err = _run(capsys, "promote", str(d), "--by", "Ada Lovelace", "--note", "TICKET-7", "--kb", kb,
                        "--bundle-hash", digest)
    assert rc == 0, err
    assert "promoted session" in out and "Ada Lovelace" in out and digest in out
    [p] = L.read_entries(d, "promotion")
    assert (p["by"], p["note"], p["bundle_hash"]) == ("Ada Lovelace", "TICKET-7", digest)
    assert p["at"] > 0 and p["ratio"] > 1
    # promoting does not change the bundle's hash, and the session still verifies
    assert bundle_hash(d) == digest
    assert not verify_session(d).mismatches
    with RecipeStore(kb) as s:
        [rec] = s.list_recipes()
        assert rec.winner["promotion"]["by"] == "Ada Lovelace"
        assert rec.winner["promotion"]["bundle_hash"] == digest
        assert any(e.get("kind") == "promotion" and e["by"] == "Ada Lovelace" for e in rec.sessions)
    rc, out, _ = _run(capsys, "kb", "--kb", kb, "list")
    assert rc == 0 and "[promoted by Ada Lovelace]" in out
    rc, out, _ = _run(capsys, "kb", "--kb", kb, "show", str(rec.id))
    assert json.loads(out)["winner"]["promotion"]["note"] == "TICKET-7"


def test_a_promoted_winner_is_preferred_by_lookups_and_kept_over_a_better_unpromoted_one(capsys, won, tmp_path):
    d, kb = _copy(won, tmp_path)
    assert _run(capsys, "promote", str(d), "--by", "Grace", "--kb", kb)[0] == 0
    with RecipeStore(kb) as s:
        [rec] = s.list_recipes()
        w = rec.winner
        # a better, unpromoted winner of the same key does not replace the promoted one
        better = {**json.loads(json.dumps(w)), "ratio": w["ratio"] * 2, "session_id": "later"}
        better.pop("promotion")
        b = {"final": {"ledger_seq": 9, "protocol_verdict": "keep", "quality_passed": True, "ratio": better["ratio"],
                       "ci_low": better["ratio"] * 0.9, "ci_high": better["ratio"] * 1.1, "n_pairs": 5},
             "final_config": w["config"], "stock_config": {k: False for k in w["config"]}}
        r = s.record_session(rec.key, b, "later")
        assert r.validated and not r.winner_entered and "promoted by Grace" in r.reason
        assert s.show(rec.id).winner["session_id"] == w["session_id"]
        # another hardware, higher ratio, not promoted; and a third with the promoted one's key but
        # hardware 'X': the relaxed lookup (tier hardware) prefers the promoted recipe over the higher ratio
        other = WorkloadKey.from_dict({**rec.key.to_dict(), "hardware": "other-gpu"})
        s.record_session(other, b, "elsewhere")
        probe = WorkloadKey.from_dict({**rec.key.to_dict(), "hardware": "third-gpu"})
        res = s.lookup(probe)
        assert res.chosen.id == rec.id, res.to_dict()["tiers"]
        assert "promoted by Grace" in " ".join(t.note for t in res.tiers)


@pytest.mark.parametrize("damage", ["unfinished", "no winner", "hash", "running", "empty by"])
def test_promote_refuses_clearly_and_writes_nothing(capsys, won, tmp_path, damage):
    d, kb = _copy(won, tmp_path)
    by = "Ada"
    extra = []
    holder = None
    if damage == "unfinished":
        st = json.loads((d / "state.json").read_text())
        st["phase"] = "FRAMEWORK"
        (d / "state.json").write_text(json.dumps(st))
        want = "is not closed (phase FRAMEWORK)"
    elif damage == "no winner":
        flat = SyntheticAdapter(effects={"fast_path": {True: 1.0}, "useless": {True: 1.0}}, numerics={},
                                knobs=TWO_KNOBS, noise_sd=0.05)
        shutil.rmtree(d)
        start(d, SPEC, budget_minutes=10, max_trials=2, adapter=flat, agents=agents(), sweep=False, kb_url=None)
        want = "has no winner to promote"
    elif damage == "hash":
        extra = ["--bundle-hash", "sha256:" + "0" * 64]
        want = "the session's manifest or ledger changed since"
    elif damage == "running":
        holder = L.Ledger(d)
        want = "still running"
    else:
        by = "  "
        want = "--by: expected the name"
    before = (d / "ledger.jsonl").read_bytes()
    try:
        rc, out, err = _run(capsys, "promote", str(d), "--by", by, "--kb", kb, *extra)
    finally:
        if holder is not None:
            holder.close()
    assert rc == 2, out + err
    assert want in err, err
    assert err.count("\n") == 1
    assert (d / "ledger.jsonl").read_bytes() == before
    with RecipeStore(kb) as s:
        assert all(not (r.winner or {}).get("promotion") for r in s.list_recipes())


def test_a_schema_1_kb_is_migrated_when_opened(tmp_path):
    path = tmp_path / "old.sqlite"
    with RecipeStore(str(path)) as s:  # today's schema, then taken back to version 1
        s.record_session(WorkloadKey.from_dict({"model": "m", "hardware": "h", "framework": "f", "model_type": "t",
                                                "architecture": "a", "framework_version": "1", "precision": "p"}),
                         {"stop_reason": "budget"}, "old-session")
    eng = create_engine(f"sqlite:///{path}")
    with eng.begin() as c:
        c.execute(text("ALTER TABLE recipes DROP COLUMN promotion"))
        c.execute(text("ALTER TABLE recipes DROP COLUMN promoted_at"))
        c.execute(text("UPDATE schema_version SET version = 1"))
    eng.dispose()
    with RecipeStore(str(path)) as s:
        [rec] = s.list_recipes()
        assert rec.session_ids == ["old-session"]
    eng = create_engine(f"sqlite:///{path}")
    with eng.connect() as c:
        assert c.execute(text("SELECT version FROM schema_version")).scalar() == SCHEMA_VERSION == 2
        cols = {r[1] for r in c.execute(text("PRAGMA table_info(recipes)"))}
        assert {"promoted_at", "promotion"} <= cols
    eng.dispose()
