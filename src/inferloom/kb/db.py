"""Schema, engine and transactions of the Recipe KB (SQLAlchemy Core only).

Portability: only ``Integer``, ``Float``, ``String`` and ``Text`` columns;
JSON is stored as TEXT (:func:`dumps` / :func:`loads`); times are unix seconds
(``Float``). So a PostgreSQL URL works by construction; SQLite is the default.

Schema versions: a KB of an older version is migrated when it is opened, in one
write transaction that re-reads the version first (two sessions opening it at
once migrate it once); :data:`MIGRATIONS` maps each version to the statements
that lift it to the next. 1 -> 2 adds ``recipes.promoted_at`` and
``recipes.promotion`` (a person's approval of the winner: ``inferloom promote``).

SQLite concurrency (many sessions, one file): every connection sets
``busy_timeout`` (30 s), ``journal_mode=WAL`` and ``synchronous=FULL``; the
pysqlite driver's own transaction handling is switched off so that a write
transaction starts with ``BEGIN IMMEDIATE`` (it takes the write lock up front,
so two read-modify-write transactions never deadlock on lock upgrade) and a
read with a plain ``BEGIN``. Transactions are short: one recipe, no I/O
inside. WAL needs a local filesystem (not NFS); a fleet shares a PostgreSQL
server instead, where writes lock the recipe row (``SELECT ... FOR UPDATE``)
and retry once when two sessions create the same recipe at once.

A lost server (PostgreSQL restarted, a network blip): every :class:`RecipeStore`
call is one idempotent transaction, retried by :meth:`Database.retrying` while
the server can't be reached, for up to ``$INFERLOOM_KB_RETRY_S`` seconds (default
120), each retry logged (logger ``inferloom.kb``) with what failed; then one
:class:`KBUnavailable` line. Pooled connections are pinged before use, so a
restarted server's dead connections are replaced rather than failing a write.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from sqlalchemy import (
    Column, Connection, Engine, Float, Index, Integer, MetaData, PrimaryKeyConstraint, String, Table, Text,
    UniqueConstraint, create_engine, event, select,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    ArgumentError, DBAPIError, IntegrityError, InterfaceError, NoSuchModuleError, OperationalError, SQLAlchemyError,
)
from sqlalchemy.pool import StaticPool

from inferloom.errors import InferloomError
from inferloom.kb.key import KEY_FIELDS
from inferloom.redact import redact_text

__all__ = [
    "SCHEMA_VERSION", "KBError", "KBUnavailable", "default_kb_url", "retry_seconds", "FLEET_KB_RETRY_S", "metadata",
    "recipes", "ceilings", "schema_version", "INDEX_ORDER", "dumps", "loads", "Database", "MIGRATIONS",
]

SCHEMA_VERSION = 2
BUSY_TIMEOUT_MS = 30_000
DEFAULT_RETRY_S = 5.0     # a session or command: a blip is retried, a mistyped URL fails within seconds
FLEET_KB_RETRY_S = 120.0  # a fleet's sessions (fleet/worker.py sets it): a shared server restarting is waited for
log = logging.getLogger("inferloom.kb")
T = TypeVar("T")


class KBError(InferloomError, RuntimeError):
    """The KB cannot be used: one line naming the file (or URL), what is wrong, what to do."""


class KBUnavailable(KBError):
    """The KB server could not be reached (refused, lost, restarting): retried by :meth:`Database.retrying`."""


def retry_seconds() -> float:
    """How long a KB call retries while its server can't be reached (``$INFERLOOM_KB_RETRY_S``; default 5 s,
    120 s in a fleet's sessions)."""
    raw = os.environ.get("INFERLOOM_KB_RETRY_S", "")
    try:
        v = float(raw) if raw else DEFAULT_RETRY_S
    except ValueError:
        raise KBError(f"INFERLOOM_KB_RETRY_S={raw!r}: expected a number of seconds (e.g. 120)") from None
    return v if math.isfinite(v) and v >= 0 else DEFAULT_RETRY_S


def default_kb_url() -> str:
    """``$INFERLOOM_KB`` (a SQL URL, or a file path taken as SQLite), else
    ``sqlite:///~/.cache/inferloom/kb.sqlite`` (expanded)."""
    return to_url(os.environ.get("INFERLOOM_KB") or str(Path("~/.cache/inferloom/kb.sqlite")))


def to_url(url_or_path: str) -> str:
    """A SQL URL as is; anything without ``://`` is a SQLite file path."""
    if "://" in url_or_path:
        return url_or_path
    return "sqlite:///" + str(Path(url_or_path).expanduser().resolve())


# Key columns in index order: the fields a lookup tier keeps fixed are always a
# prefix of this order (see inferloom.kb.lookup.TIERS), so one index per tier
# (prefix, status, ratio) answers "best recipe of this tier" with one seek.
INDEX_ORDER: tuple[str, ...] = (
    "framework", "precision", "model_type", "architecture", "model", "hardware", "framework_version",
)
assert sorted(INDEX_ORDER) == sorted(KEY_FIELDS)

metadata = MetaData()

schema_version = Table("schema_version", metadata, Column("version", Integer, primary_key=True, autoincrement=False))

recipes = Table(
    "recipes", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    *[Column(f, String(255), nullable=False) for f in KEY_FIELDS],
    Column("status", String(16), nullable=False),          # 'ok' | 'drift'
    Column("winner_config", Text),                          # JSON: the final stack (full config); NULL = no winner
    Column("winner_changes", Text),                         # JSON: what the final stack changes from stock
    Column("ratio", Float),                                 # final stack / stock (paired); NULL = no winner
    Column("ci_low", Float),
    Column("ci_high", Float),
    Column("stock_objective", Float),                       # output tok/s, stock, same run as the final compare
    Column("final_objective", Float),                       # output tok/s, final stack
    Column("n_pairs", Integer),
    Column("winner_session_id", String(255)),
    Column("winner_evidence", Text),                        # JSON: protocol verdict, quality, ledger seq, ...
    Column("winner_at", Float),
    Column("sessions", Text, nullable=False),               # JSON list: every session (and drift mark) recorded
    Column("worked", Text, nullable=False),                 # JSON list of kept changes of validated sessions
    Column("failed", Text, nullable=False),                 # JSON list of failures with their rule / outcome
    Column("lessons", Text, nullable=False),                # JSON list of strings
    Column("drift_note", Text),
    Column("drift_at", Float),
    Column("promoted_at", Float),                           # when a person promoted the winner; NULL = not promoted
    Column("promotion", Text),                              # JSON: by, at, note, bundle_hash, session_id (schema 2)
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    UniqueConstraint(*INDEX_ORDER, name="uq_recipes_key"),
    *[Index(f"ix_recipes_tier{t}", *INDEX_ORDER[: len(INDEX_ORDER) - t], "status", "ratio") for t in range(1, 6)],
)

ceilings = Table(
    "ceilings", metadata,
    Column("device", String(255), nullable=False),
    Column("dtype", String(32), nullable=False),            # the matmul dtype the rate was measured in
    Column("mem_bw_bytes_per_s", Float, nullable=False),
    Column("matmul_flops_per_s", Float, nullable=False),
    Column("measured_at", Float, nullable=False),
    Column("details", Text, nullable=False),                # JSON: how it was measured
    PrimaryKeyConstraint("device", "dtype", name="pk_ceilings"),
)


# version -> the statements that lift a KB of that version to the next (portable SQL: SQLite and PostgreSQL)
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: ("ALTER TABLE recipes ADD COLUMN promoted_at FLOAT", "ALTER TABLE recipes ADD COLUMN promotion TEXT"),
}
assert sorted(MIGRATIONS) == list(range(1, SCHEMA_VERSION))


def _finite(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def dumps(value: Any) -> str:
    """Canonical JSON text (sorted keys, no NaN: non-finite numbers become null)."""
    return json.dumps(_finite(value), sort_keys=True, separators=(",", ":"), allow_nan=False, default=str)


def loads(text: str | None, default: Any = None) -> Any:
    return default if text is None else json.loads(text)


class Database:
    """An engine on one KB URL with the schema in place (created if missing)."""

    def __init__(self, url: str) -> None:
        self.url = to_url(url)
        try:
            u = make_url(self.url)
        except ArgumentError:
            raise KBError(f"KB URL {redact_text(url)!r}: not a SQL URL; expected sqlite:///PATH, a file path, or "
                          "postgresql://USER@HOST/DB (set INFERLOOM_KB or pass the KB location)") from None
        if u.drivername == "postgresql":  # no driver named: psycopg 3 (the `fleet` extra), not psycopg2
            u = u.set(drivername="postgresql+psycopg")
        self.is_sqlite = u.get_backend_name() == "sqlite"
        self.where = redact_text(u.render_as_string(hide_password=True))  # ?password=... too
        kwargs: dict[str, Any] = {}
        if self.is_sqlite:
            db = u.database or ""
            if db and db != ":memory:" and not db.startswith("file:"):
                path = Path(db).expanduser()
                self.where = str(path)
                if path.exists() and not path.is_file():
                    raise KBError(f"KB file {path}: is a directory, not a file; point INFERLOOM_KB at a .sqlite file")
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise KBError(f"KB file {path}: cannot create its directory ({exc.strerror}); "
                                  "choose a writable location (INFERLOOM_KB)") from None
                u = u.set(database=str(path))
            else:
                kwargs["poolclass"] = StaticPool
            kwargs["connect_args"] = {"timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": False}
        else:
            kwargs["pool_pre_ping"] = True  # a restarted server's dead connections are replaced, not used
        try:
            self.engine: Engine = create_engine(u, **kwargs)
        except (NoSuchModuleError, ImportError) as exc:
            raise KBError(f"KB URL {self.where}: no driver for it ({exc}); install the database driver "
                          "(e.g. psycopg for PostgreSQL) or use a sqlite:/// URL") from None
        except ArgumentError as exc:  # e.g. a user or password in a sqlite:// URL
            raise KBError(f"KB URL {self.where}: not usable ({redact_text(str(exc).splitlines()[0])}); expected "
                          "sqlite:///PATH, a file path, or postgresql://USER@HOST/DB") from None
        if self.is_sqlite:
            _sqlite_events(self.engine)
        self.retrying(self._ensure_schema, "opening")

    def unreachable(self, exc: BaseException) -> bool:
        """Is ``exc`` a lost or refused connection to a KB server (worth retrying)?"""
        if self.is_sqlite:
            return False
        return isinstance(exc, (OperationalError, InterfaceError)) or (
            isinstance(exc, DBAPIError) and exc.connection_invalidated)

    def retrying(self, fn: Callable[[], T], doing: str) -> T:
        """``fn()`` (one idempotent transaction), again while the server can't be
        reached, for up to :func:`retry_seconds`; each retry is logged."""
        deadline = time.monotonic() + retry_seconds()
        wait, tries = 0.5, 0
        while True:
            try:
                return fn()
            except KBUnavailable as exc:
                tries += 1
                left = deadline - time.monotonic()
                if left <= 0:
                    raise KBUnavailable(f"{redact_text(str(exc))} (gave up after {tries} tries, {retry_seconds():g} s; "
                                        "INFERLOOM_KB_RETRY_S sets how long)") from None
                log.warning("KB %s: %s unreachable (%s); retry %d in %.1f s", self.where, doing, redact_text(str(exc)), tries,
                            min(wait, left))
                self.engine.dispose()  # the pool's connections died with the server
                time.sleep(min(wait, left))
                wait = min(wait * 2, 5.0)

    def error(self, exc: BaseException, doing: str) -> KBError:
        """Turn a driver error into a one-line :class:`KBError`."""
        msg = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        kind = "file" if self.is_sqlite else "URL"
        if "not a database" in msg or "malformed" in msg:
            hint = "it is not an inferloom KB (or it is damaged); move it away or point INFERLOOM_KB elsewhere"
        elif "unable to open" in msg or "readonly" in msg or "read-only" in msg or "permission" in msg.lower():
            hint = "check that the file and its directory exist and are readable and writable"
        elif "locked" in msg:
            hint = "another process held the KB too long; retry"
        else:
            hint = "check the KB location (INFERLOOM_KB) and that the database is reachable"
        cls = KBUnavailable if self.unreachable(exc) else KBError
        if cls is KBUnavailable:
            hint = "the database server can't be reached; check that it is running"
        return cls(f"KB {kind} {self.where}: {doing} failed ({redact_text(msg)}); {hint}")

    @contextmanager
    def read(self) -> Iterator[Connection]:
        try:
            with self.engine.connect() as conn, conn.begin():
                yield conn
        except SQLAlchemyError as exc:
            raise self.error(exc, "reading") from None

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A short read-modify-write transaction (``BEGIN IMMEDIATE`` on SQLite)."""
        try:
            with self.engine.connect() as conn:
                conn.execution_options(kb_begin="IMMEDIATE")
                with conn.begin():
                    yield conn
        except IntegrityError:
            raise  # the caller retries (two writers created the same row at once)
        except SQLAlchemyError as exc:
            raise self.error(exc, "writing") from None

    def _ensure_schema(self) -> None:
        try:
            with self.engine.connect() as conn:
                with conn.begin():
                    have = set(self.engine.dialect.get_table_names(conn))
                    version = conn.execute(select(schema_version.c.version)).scalar() if "schema_version" in have else None
            if version is None:
                for attempt in range(2):
                    try:
                        with self.engine.connect() as conn:
                            conn.execution_options(kb_begin="IMMEDIATE")
                            with conn.begin():
                                metadata.create_all(conn, checkfirst=True)
                                version = conn.execute(select(schema_version.c.version)).scalar()
                                if version is None:
                                    conn.execute(schema_version.insert().values(version=SCHEMA_VERSION))
                                    version = SCHEMA_VERSION
                        break
                    except SQLAlchemyError:
                        if attempt:  # a concurrent creator (PostgreSQL): its tables now exist
                            raise
        except SQLAlchemyError as exc:
            raise self.error(exc, "opening") from None
        if version > SCHEMA_VERSION:
            raise KBError(f"KB {self.where}: schema_version {version} was written by a newer inferloom (this one "
                          f"reads up to {SCHEMA_VERSION}); upgrade inferloom")
        if version < SCHEMA_VERSION:
            self._migrate()

    def _migrate(self) -> None:
        """Lift an older KB to :data:`SCHEMA_VERSION`, one version at a time, in one write transaction."""
        try:
            with self.engine.connect() as conn:
                conn.execution_options(kb_begin="IMMEDIATE")
                with conn.begin():
                    version = conn.execute(select(schema_version.c.version).with_for_update()).scalar() or 1
                    while version < SCHEMA_VERSION:
                        for stmt in MIGRATIONS[version]:
                            conn.exec_driver_sql(stmt)
                        conn.execute(schema_version.update().values(version=version + 1))
                        version += 1
        except SQLAlchemyError as exc:
            raise self.error(exc, f"migrating the schema to version {SCHEMA_VERSION}") from None

    def close(self) -> None:
        self.engine.dispose()


def _sqlite_events(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (see "begin")
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            cur.execute("PRAGMA journal_mode=WAL")  # persistent; ':memory:' keeps 'memory'
            cur.execute("PRAGMA synchronous=FULL")
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get("kb_begin", "")
        conn.exec_driver_sql(f"BEGIN {mode}".strip())
