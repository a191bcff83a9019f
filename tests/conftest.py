"""Test isolation: every test gets its own knowledge base file (never ~/.cache); the throwaway PostgreSQL
cluster (tests/pg_cluster.py) for the KB and fleet tests that ask for it."""

import pytest

from pg_cluster import PgCluster, find_bin


@pytest.fixture(autouse=True)
def _isolated_kb(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERLOOM_KB", str(tmp_path / "kb.sqlite"))


@pytest.fixture(scope="session")
def pg_cluster():
    """A throwaway PostgreSQL cluster (temp dir, local port, non-root user), stopped after the run."""
    bindir = find_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb) and `make postgresql` "
                    "could not install it: apt-get install postgresql")
    c = PgCluster(bindir)
    yield c
    c.destroy()


@pytest.fixture
def pg_url(pg_cluster):
    """A fresh database on the throwaway cluster: its SQLAlchemy URL (postgresql+psycopg://)."""
    return pg_cluster.new_database()
