"""The KB on PostgreSQL (a throwaway cluster): the same schema as SQLite, concurrent writers from
several processes, a server restart retried, a server that stays away named in one line.
(Every test of test_kb.py runs on both backends too.)"""

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import inspect

from inferloom.kb import KBError, RecipeStore, WorkloadKey
from inferloom.kb.db import KBUnavailable
from test_kb import KEY, breakdown


def _schema(url):
    with RecipeStore(url) as s:
        insp = inspect(s.db.engine)
        return {t: ([(c["name"], type(c["type"]).__name__, c["nullable"]) for c in insp.get_columns(t)],
                    sorted((i["name"], tuple(i["column_names"]), bool(i["unique"])) for i in insp.get_indexes(t)
                           if not i["name"].startswith("uq_")),
                    sorted(tuple(u["column_names"]) for u in insp.get_unique_constraints(t)),
                    insp.get_pk_constraint(t)["constrained_columns"])
                for t in sorted(insp.get_table_names())}


def test_postgresql_gets_the_same_tables_columns_and_indexes_as_sqlite(tmp_path, pg_url):
    lite, pg = _schema(f"sqlite:///{tmp_path / 'kb.sqlite'}"), _schema(pg_url)
    assert sorted(lite) == sorted(pg) == ["ceilings", "recipes", "schema_version"]
    for t in lite:
        (lc, li, lu, lp), (pc, pi, pu, pp) = lite[t], pg[t]
        assert [c[0] for c in lc] == [c[0] for c in pc], t
        assert [c[2] for c in lc] == [c[2] for c in pc], t
        assert li == pi and lu == pu and lp == pp, t


def test_concurrent_writer_processes_lose_nothing_on_postgresql(pg_url):
    code = textwrap.dedent(f"""
        import sys
        from inferloom.kb import RecipeStore
        from test_kb import KEY, breakdown
        with RecipeStore({pg_url!r}) as s:
            for i in range(5):
                s.record_session(KEY, breakdown(1.1 + 0.01 * int(sys.argv[1]) + 0.001 * i), f"p{{sys.argv[1]}}-{{i}}")
    """)
    here = str(Path(__file__).parent)  # test_kb's helpers
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(w)], env=env) for w in range(4)]
    assert [p.wait(120) for p in procs] == [0] * 4
    with RecipeStore(pg_url) as s:
        r = s.get(KEY)
    assert sorted(r.session_ids) == sorted(f"p{w}-{i}" for w in range(4) for i in range(5))
    assert r.winner["ratio"] == pytest.approx(1.134)  # the best of all twenty


def test_a_restarted_server_delays_a_write_and_loses_nothing(pg_cluster, pg_url, caplog):
    store = RecipeStore(pg_url)
    store.record_session(KEY, breakdown(1.2), "before")  # a pooled connection, soon dead
    pg_cluster.stop("fast")
    box = {}
    t = threading.Thread(target=lambda: box.update(res=store.record_session(KEY, breakdown(1.3), "during")))
    with caplog.at_level(logging.WARNING, logger="inferloom.kb"):
        t.start()
        time.sleep(2.0)
        pg_cluster.start()
        t.join(60)
    assert box["res"].winner_entered
    assert any("unreachable" in r.getMessage() and "retry 1" in r.getMessage() for r in caplog.records)
    assert sorted(store.get(KEY).session_ids) == ["before", "during"]
    store.close()


def test_a_server_that_stays_away_is_one_line_naming_it(pg_cluster, pg_url, monkeypatch):
    store = RecipeStore(pg_url)
    monkeypatch.setenv("INFERLOOM_KB_RETRY_S", "1")
    pg_cluster.stop("fast")
    try:
        with pytest.raises(KBUnavailable) as e:
            store.get(WorkloadKey(**{**KEY.to_dict(), "model": "other"}))
    finally:
        pg_cluster.start()
    msg = str(e.value)
    assert isinstance(e.value, KBError) and "\n" not in msg
    assert f"127.0.0.1:{pg_cluster.port}" in msg and "can't be reached" in msg and "INFERLOOM_KB_RETRY_S" in msg
    store.close()


def test_a_plain_postgresql_url_uses_psycopg_3(pg_url):
    with RecipeStore(pg_url.replace("postgresql+psycopg://", "postgresql://")) as s:
        assert s.db.engine.dialect.driver == "psycopg"
        assert s.list_recipes() == []
