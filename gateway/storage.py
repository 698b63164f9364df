"""Where sessions are kept: the ``[storage]`` settings and the one function that opens the
configured store.

``backend = "sqlite"`` (the default) keeps JSONL transcripts and a SQLite index in the data
dir; ``"postgres"`` keeps them in the PostgreSQL database at ``dsn``, which several gateway
nodes may share (docs/scaling.md). Mistakes are refused where the configuration is loaded,
naming the setting; an unreachable server is refused when the store opens, naming
``storage.dsn`` — never a silent fallback to the other backend. No message repeats the DSN,
which may hold a password.

A leaf: it imports the standard library and ``sessions``, and psycopg only for the postgres
backend (the ``postgres`` extra), so the default install never needs the driver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from sessions import FileIO, SchemaTooNew, SessionsConfig, SessionStore, StorageError

if TYPE_CHECKING:
    from sessions import PgSessionStore

__all__ = ["PoolSettings", "StorageConfig", "StorageUnavailable", "open_session_store",
           "pool_settings"]

_DSN_FORMS = (
    "a URI such as postgresql://user@host:5432/recalld, or key=value pairs such as "
    "'host=db dbname=recalld'"
)


@dataclass(frozen=True, slots=True)
class StorageConfig:
    """The ``[storage]`` settings (``RECALLD_STORAGE_<KEY>``); config.example.toml has each."""

    backend: Literal["sqlite", "postgres"] = "sqlite"
    dsn: str | None = None
    pool_size: int = field(default=10, metadata={"min": 1, "max": 1000})
    connect_timeout_s: float = field(default=10.0, metadata={"min": 1, "max": 300})
    # A call waits at most this long for a pooled connection (and a new connection this long to
    # open): while the database is down, calls answer the storage error after it, not later.
    call_timeout_s: float = field(default=4.0, metadata={"min": 0.5, "max": 300})
    # A pool retries a lost connection in the background for this long, then at the next call;
    # short, so the first call after the database is back connects at once (no long backoff).
    reconnect_timeout_s: float = field(default=1.0, metadata={"min": 0.1, "max": 3600})
    # Set on every pooled connection (libpq options); 0 turns one off, as in PostgreSQL.
    statement_timeout_s: float = field(default=30.0, metadata={"min": 0, "max": 86_400})
    lock_timeout_s: float = field(default=5.0, metadata={"min": 0, "max": 86_400})
    # Above the longest embedding call (the indexer holds a transaction across one).
    idle_in_transaction_timeout_s: float = field(default=300.0, metadata={"min": 0, "max": 86_400})
    # How often the readiness check (gateway.health, GET /readyz) asks the database.
    check_interval_s: float = field(default=1.0, metadata={"min": 0.1, "max": 300})
    # Events waiting for the cluster bus beyond this many are dropped (logged): a database that
    # stalls must not grow a node's memory without bound; clients see the seq gap.
    max_outbound_events: int = field(default=10_000, metadata={"min": 100})
    # A run waits at most this long for the bus (catching up, sending its events) before going on.
    bus_wait_s: float = field(default=5.0, metadata={"min": 0.1, "max": 300})
    # At close, the events of runs that just ended still go out within this.
    close_flush_s: float = field(default=2.0, metadata={"min": 0, "max": 300})

    def __post_init__(self) -> None:
        if self.backend != "postgres":
            return
        if not self.dsn:
            raise ValueError(
                'storage.backend = "postgres" needs storage.dsn (RECALLD_STORAGE_DSN): '
                + _DSN_FORMS
            )
        problem = dsn_problem(self.dsn)
        if problem is not None:
            raise ValueError(problem)


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """What every PostgreSQL pool of a node is opened with (the sessions store, memory and the
    cluster's), so that all of them answer and recover the same way."""

    call_timeout_s: float
    reconnect_timeout_s: float
    # libpq ``options`` for each pooled connection: the timeouts, then the DSN's own options
    # (a later ``-c`` wins, so a DSN that sets one keeps its value).
    options: str

    @property
    def connect_timeout(self) -> int:
        """libpq's ``connect_timeout`` (whole seconds; libpq treats less than 2 as 2)."""
        return max(2, round(self.call_timeout_s))


def pool_settings(storage: StorageConfig) -> PoolSettings:
    """The pool settings of ``[storage]`` (postgres only: needs a DSN)."""
    assert storage.dsn is not None  # StorageConfig refuses postgres without one
    from psycopg.conninfo import conninfo_to_dict

    timeouts = {"statement_timeout": storage.statement_timeout_s,
                "lock_timeout": storage.lock_timeout_s,
                "idle_in_transaction_session_timeout": storage.idle_in_transaction_timeout_s}
    ours = " ".join(f"-c {name}={round(s * 1000)}" for name, s in timeouts.items())
    theirs = str(conninfo_to_dict(storage.dsn).get("options") or "")
    return PoolSettings(storage.call_timeout_s, storage.reconnect_timeout_s,
                        f"{ours} {theirs}".strip())


class StorageUnavailable(Exception):
    """The configured store could not be opened; the message names the setting to look at."""


def dsn_problem(dsn: str) -> str | None:
    """Why ``dsn`` is not a PostgreSQL connection string (None when it is one), by libpq's
    own parser; the reason names ``storage.dsn`` and never repeats the value."""
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        return 'storage.backend = "postgres" needs the driver: pip install "recalld[postgres]"'
    try:
        params = conninfo_to_dict(dsn)
    except Exception:
        return ("storage.dsn (RECALLD_STORAGE_DSN) is not a PostgreSQL connection string; expected "
                f"{_DSN_FORMS}")
    ports = str(params.get("port") or "5432").split(",")
    if not all(port.strip().isdigit() for port in ports):
        return "storage.dsn (RECALLD_STORAGE_DSN) has a port that is not a number"
    return None


def open_session_store(
    storage: StorageConfig,
    data_dir: Path,
    sessions: SessionsConfig,
    *,
    file_io: FileIO | None = None,
    key_factory: Callable[[], str] | None = None,
    trust_clean_stop: bool = False,
) -> SessionStore | PgSessionStore:
    """The configured store, open. For postgres it connects at once and applies pending
    migrations; a server it cannot reach is :class:`StorageUnavailable` naming
    ``storage.dsn`` with the server's reason. Blocking: call it off the event loop.
    ``key_factory`` names new sessions (the importer keeps keys stable); default random.
    ``trust_clean_stop``: the file store may skip its per-transcript walk after a clean stop
    (the daemon's own start; see sessions.md)."""
    return _STORES[storage.backend](storage, data_dir, sessions, file_io, key_factory,
                                    trust_clean_stop)


def _sqlite_store(storage: StorageConfig, data_dir: Path, sessions: SessionsConfig,
                  file_io: FileIO | None, key_factory: Callable[[], str] | None,
                  trust_clean_stop: bool) -> SessionStore:
    if key_factory is None:
        return SessionStore(data_dir, sessions, file_io=file_io, trust_clean_stop=trust_clean_stop)
    return SessionStore(data_dir, sessions, file_io=file_io, trust_clean_stop=trust_clean_stop,
                        key_factory=key_factory)


def _pg_store(storage: StorageConfig, data_dir: Path, sessions: SessionsConfig,
              file_io: FileIO | None, key_factory: Callable[[], str] | None,
              trust_clean_stop: bool) -> PgSessionStore:
    assert storage.dsn is not None  # StorageConfig refuses postgres without one
    from sessions import PgSessionStore

    keys = {} if key_factory is None else {"key_factory": key_factory}
    try:
        pool = pool_settings(storage)
        return PgSessionStore(storage.dsn, sessions, pool_size=storage.pool_size,
                              connect_timeout_s=storage.connect_timeout_s,
                              call_timeout_s=pool.call_timeout_s,
                              reconnect_timeout_s=pool.reconnect_timeout_s,
                              options=pool.options, **keys)
    except SchemaTooNew as err:  # reachable and readable: the node is what needs changing
        raise StorageUnavailable(f"storage.dsn (RECALLD_STORAGE_DSN): {err}") from err
    except StorageError as err:
        raise StorageUnavailable(
            f"storage.dsn (RECALLD_STORAGE_DSN): {err.message}; is the PostgreSQL server "
            "running and reachable, and may this user create tables in the database?"
        ) from err


# The session store of each storage.backend (gateway.opening.BACKENDS has the other parts).
_STORES: dict[str, Callable[[StorageConfig, Path, SessionsConfig, FileIO | None,
                             Callable[[], str] | None, bool],
                            SessionStore | PgSessionStore]] = {
    "sqlite": _sqlite_store,
    "postgres": _pg_store,
}
