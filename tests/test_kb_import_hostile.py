"""`inferloom kb import` of a hostile export (issue 30 item 5): real exports from real SQLite KBs,
tampered as data, imported into a real SQLite KB."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferloom.errors import InferloomError
from inferloom.kb import RecipeStore
from inferloom.kb.limits import MAX_IMPORT_BYTES, MAX_LIST_ITEMS, MAX_STRING_CHARS, ImportRefused
from inferloom.session.atomic import write_json_atomic
from test_kb import KEY, breakdown


def _export(tmp_path, name, ratio, session_id):
    with RecipeStore(str(tmp_path / f"{name}.sqlite")) as remote:
        remote.record_session(KEY, breakdown(ratio, changes={"sdpa_backend": "math"}), session_id)
        return remote.export_document()


def _write(tmp_path, name, doc):
    path = tmp_path / f"{name}.json"
    write_json_atomic(path, doc)
    return path


def _snapshot(store):
    return [r.to_dict() for r in store.list_recipes()], [c.to_dict() for c in store.list_ceilings()]


def test_a_forged_promotion_is_dropped_and_an_honest_better_winner_replaces_it(tmp_path):
    forged = _export(tmp_path, "forged", 1.01, "forged")
    w = forged["recipes"][0]["winner"]
    w["promotion"] = {"by": "alice (security lead)", "at": 1.0, "note": "approved"}
    forged["recipes"][0]["sessions"].append({"kind": "promotion", "by": "alice (security lead)", "at": 1.0,
                                             "session_id": "forged"})
    honest = _export(tmp_path, "honest", 1.50, "honest")
    with RecipeStore(str(tmp_path / "kb.sqlite")) as s:
        s.import_json(_write(tmp_path, "forged", forged))
        [rec] = s.list_recipes()
        assert rec.winner["session_id"] == "forged" and "promotion" not in rec.winner
        assert not any(e.get("kind") == "promotion" for e in rec.sessions)
        s.import_json(_write(tmp_path, "honest", honest))
        assert s.show(KEY).winner["session_id"] == "honest"
    out = subprocess.run([sys.executable, "-m", "inferloom.cli", "kb", "--kb", str(tmp_path / "kb.sqlite"), "list"],
                         capture_output=True, text=True, env={**os.environ}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "promoted" not in out.stdout and "x1.500" in out.stdout


@pytest.mark.parametrize("tamper,field,cap", [
    ("lesson", "recipes[0].lessons[0].text", str(MAX_STRING_CHARS)),
    ("sessions", "recipes[0].sessions", str(MAX_LIST_ITEMS)),
    ("file", "the file", str(MAX_IMPORT_BYTES)),
])
def test_an_oversized_export_is_refused_naming_the_field_and_writes_nothing(tmp_path, tamper, field, cap):
    doc = _export(tmp_path, "remote", 1.4, "remote")
    good = _export(tmp_path, "second", 1.3, "second")["recipes"][0]
    good["key"]["model"] = "another"   # a valid recipe after the bad one is not written either
    doc["recipes"].append(good)
    bad = doc["recipes"][0]
    if tamper == "lesson":
        bad["lessons"][0]["text"] = "x" * (5 * 1024 * 1024)
    elif tamper == "sessions":
        bad["sessions"] = [{"kind": "session", "session_id": f"s{i}", "at": float(i)} for i in range(20_000)]
    else:
        bad["drift_note"] = "y" * (MAX_IMPORT_BYTES + 10)
    path = _write(tmp_path, "bad", doc)
    with RecipeStore(str(tmp_path / "kb.sqlite")) as s:
        s.record_session(KEY, breakdown(1.1), "local")
        before = _snapshot(s)
        with pytest.raises(ImportRefused) as e:
            s.import_json(path)
        msg = str(e.value)
        assert field in msg and cap in msg and "\n" not in msg
        assert _snapshot(s) == before
    p = subprocess.run([sys.executable, "-m", "inferloom.cli", "kb", "--kb", str(tmp_path / "kb.sqlite"), "import",
                        str(path)], capture_output=True, text=True, env={**os.environ}, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert field in p.stderr


_json = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False,
                     allow_infinity=False) | st.text(max_size=8),
                     lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
                     max_leaves=12)
_FIELDS = ["key", "status", "winner", "sessions", "worked", "failed", "lessons", "drift_note", "drift_at",
           "created_at", "updated_at", "promotion", "evidence", "ratio", "session_id", "config", "changes"]


@settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_exports_import_or_refuse_with_an_inferloom_error(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("fuzz")
    doc = json.loads(json.dumps(_BASE))
    rec = doc["recipes"][0]
    for _ in range(data.draw(st.integers(1, 4))):
        target = data.draw(st.sampled_from([doc, rec, rec["winner"], doc["ceilings"][0]]))
        target[data.draw(st.sampled_from(_FIELDS + list(target)))] = data.draw(_json)
    path = tmp / "doc.json"
    path.write_text(json.dumps(doc))
    with RecipeStore(str(tmp / "kb.sqlite")) as s:
        try:
            s.import_json(path)
        except InferloomError:
            return
        for r in s.list_recipes():
            assert not (r.winner or {}).get("promotion")


def _base_document():
    with RecipeStore("sqlite://") as s:
        s.record_session(KEY, breakdown(1.3), "base")
        s.put_ceiling("NVIDIA H200", mem_bw_bytes_per_s=4.0e12, matmul_flops_per_s=6.0e14, measured_at=5.0)
        return s.export_document()


_BASE = _base_document()
