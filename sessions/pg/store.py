"""PgSessionStore: the public API of :class:`sessions.SessionStore` on PostgreSQL.

Synchronous and thread-safe like the file store (the gateway calls it through
``asyncio.to_thread``): each call borrows a connection from a ``psycopg_pool.ConnectionPool``
and runs in one transaction. Values are checked by the same :mod:`sessions.inputs` as the file
store, so both refuse the same input with the same errors, and a message's ``line_bytes`` is
the size of the transcript line it would be, so ``max_line_bytes`` and ``max_page_bytes`` mean
the same on both.

An append is ONE ``INSERT`` whose ``seq`` comes from the session row, bumped in the same
transaction (``UPDATE … RETURNING``): the row lock orders appends to one session across every
node, and the ``NOTIFY recalld_messages, '<sessionKey>'`` sent in that transaction reaches
listeners only once the message is committed. An append made by a run carries its session
lease's fencing token (:mod:`sessions.fence`) and is refused once another node took that lease over.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, NoReturn, TypeAlias

import psycopg
import structlog
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from .. import inputs
from ..attachments import is_sha256
from ..checked import CheckedSessionStore
from ..config import SessionsConfig
from ..errors import InvalidSessionInput, SessionNotFound, StorageError
from ..fence import RUN_FENCE, LeaseLost
from ..idle import idle_query
from ..keys import check_session_key, check_user, encode_history_cursor, new_session_key
from ..models import ConversationSummary, Message, MessagePage, Session
from ..supersede import retarget
from ..transcript import Header
from .feed import NOTIFY_CHANNEL
from .schema import migrate

__all__ = ["NOTIFY_CHANNEL", "PgSessionStore"]

log = structlog.get_logger(__name__)

_Conn: TypeAlias = "psycopg.Connection[tuple[Any, ...]]"

_SESSION_COLUMNS = (
    "session_key, user_id, title, created_at, updated_at, message_count, system_prompt, model,"
    " memory, temperature, max_tokens"
)
# Pages leave the system prompt out, as the file store's index does: get() has it.
_LIST_COLUMNS = _SESSION_COLUMNS.replace("system_prompt", "NULL")
_MESSAGE_COLUMNS = "id, role, content, ts, run_id, name, extra"

_FIRST_PAGE_SQL = f"""
SELECT {_LIST_COLUMNS} FROM recalld_sessions WHERE user_id = %s
ORDER BY updated_at DESC, session_key DESC LIMIT %s"""
# The row comparison lets the planner seek into recalld_sessions_newest at the cursor.
_PAGE_SQL = f"""
SELECT {_LIST_COLUMNS} FROM recalld_sessions
WHERE user_id = %s AND (updated_at, session_key) < (%s, %s)
ORDER BY updated_at DESC, session_key DESC LIMIT %s"""
_APPEND_SQL = """
UPDATE recalld_sessions
SET message_count = message_count + 1, bytes = bytes + %s, next_seq = next_seq + 1, updated_at = %s
WHERE session_key = %s AND user_id = %s
RETURNING next_seq - 1"""
# A fenced append (sessions.fence) first takes a share lock on its lease row: a takeover,
# which updates that row, then waits for the append to commit, or the append sees the new
# token (READ COMMITTED re-reads the locked row) and is refused.
_FENCE_SQL = """
SELECT 1 FROM recalld_run_leases
WHERE session_key = %s AND token = %s AND expires_at > clock_timestamp() FOR SHARE"""
_INSERT_MESSAGE_SQL = """
INSERT INTO recalld_messages
    (session_key, seq, id, role, content, ts, run_id, name, extra, line_bytes)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"""
# The retention sweep's page: byte order (COLLATE "C") on both columns, as SQLite sorts.
_IDLE_SQL = """
SELECT user_id, session_key FROM recalld_sessions
WHERE updated_at < %s AND (user_id COLLATE "C", session_key) > (%s, %s)
ORDER BY user_id COLLATE "C", session_key LIMIT %s"""
_UPSERT_SUMMARY_SQL = """
INSERT INTO recalld_summaries (session_key, id, content, ts, through, through_seq, messages)
VALUES (%s, %s, %s, %s, %s,
        COALESCE((SELECT seq FROM recalld_messages WHERE session_key = %s AND id = %s), %s), %s)
ON CONFLICT (session_key) DO UPDATE SET
    id = EXCLUDED.id, content = EXCLUDED.content, ts = EXCLUDED.ts,
    through = EXCLUDED.through, through_seq = EXCLUDED.through_seq, messages = EXCLUDED.messages"""
# After a purge the row is re-derived from what is left, as the file store re-derives its index.
_RECOUNT_SQL = """
UPDATE recalld_sessions s
SET message_count = m.n, bytes = m.b, updated_at = COALESCE(m.last_ts, s.created_at)
FROM (SELECT count(*) AS n, COALESCE(sum(line_bytes), 0) AS b,
             (SELECT ts FROM recalld_messages WHERE session_key = %s
              ORDER BY seq DESC LIMIT 1) AS last_ts
      FROM recalld_messages WHERE session_key = %s) m
WHERE s.session_key = %s"""


class PgSessionStore(CheckedSessionStore):
    """Every user's sessions and messages in ``recalld_sessions`` / ``recalld_messages``;
    the checked public methods are :class:`~sessions.checked.CheckedSessionStore`'s."""

    def __init__(
        self,
        dsn: str,
        config: SessionsConfig = SessionsConfig(),  # noqa: B008 - frozen, so sharing is safe
        *,
        key_factory: Callable[[], str] = new_session_key,
        pool_size: int = 10,
        connect_timeout_s: float = 10.0,
        call_timeout_s: float = 4.0,
        reconnect_timeout_s: float = 1.0,
        options: str = "",
    ) -> None:
        """Connect at once (StorageError naming the server's answer when it cannot), apply the
        pending migrations, then open the pool. ``key_factory`` is as for the file store.

        ``connect_timeout_s`` bounds the opening; afterwards a call waits at most
        ``call_timeout_s`` for a connection (StorageError after it), a lost connection is
        retried in the background for ``reconnect_timeout_s`` and then at the next call, and
        every pooled connection gets the libpq ``options`` (the gateway's statement, lock and
        idle-transaction timeouts; not the migrations, which may wait for another node's)."""
        self._config = config
        self._key_factory = key_factory
        self._closed = False
        timeout = max(1, round(connect_timeout_s))
        try:
            with psycopg.connect(dsn, connect_timeout=timeout) as conn:
                migrate(conn)
        except psycopg.Error as err:
            raise StorageError(f"could not open the session database: {_reason(err)}") from err
        self._pool: ConnectionPool[_Conn] = ConnectionPool(
            dsn,
            min_size=1,
            max_size=pool_size,
            kwargs={"connect_timeout": max(2, round(call_timeout_s)),
                    **({"options": options} if options else {})},
            # A connection the server dropped (a restart, a failover) is replaced, not handed out.
            check=ConnectionPool.check_connection,
            timeout=call_timeout_s,
            reconnect_timeout=reconnect_timeout_s,
            open=False,
            name="recalld-sessions",
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout_s)
        except Exception as err:
            self._pool.close()
            raise StorageError(f"could not open the session database: {err}") from err
        # chat.send's files (recalld_attachments), deleted with their session by the cascade.
        self.attachments = PgAttachments(self)

    # ----------------------------------------------------------------- public API

    def get(self, user: str, session_key: str) -> Session:
        """The session's metadata; SessionNotFound for unknown, foreign or malformed keys."""
        self._check_open()
        user, key = check_user(user), check_session_key(session_key)
        with self._tx("reading a session") as conn:
            return self._session_row(conn, user, key)

    def update(
        self, user: str, session_key: str, *, title: str | None = None,
        system_prompt: str | None = None, model: str | None = None,
        temperature: float | None = None, max_tokens: int | None = None,
        clear: Collection[str] = (),
    ) -> Session:
        """Change the title, system prompt, model or sampling (``clear``: back to the default);
        ``updatedAt`` and the count do not move."""
        self._check_open()
        user, key = check_user(user), check_session_key(session_key)
        with self._tx("updating a session") as conn:
            now = self._session_row(conn, user, key, lock=True)
            header = Header(key, user, now.created_at, now.title, now.system_prompt, now.model,
                            now.memory, now.temperature, now.max_tokens)
            # The same check as the file store's update line, so the same values are refused.
            new, _ = inputs.build_update(header, title=title, system_prompt=system_prompt,
                                         model=model, temperature=temperature,
                                         max_tokens=max_tokens, clear=clear, config=self._config)
            _refuse_nul(("title", new.title), ("systemPrompt", new.system_prompt),
                        ("model", new.model))
            conn.execute(
                "UPDATE recalld_sessions SET title = %s, system_prompt = %s, model = %s,"
                " temperature = %s, max_tokens = %s WHERE session_key = %s",
                (new.title, new.system_prompt, new.model, new.temperature, new.max_tokens, key),
            )
        return replace(now, title=new.title, system_prompt=new.system_prompt, model=new.model,
                       temperature=new.temperature, max_tokens=new.max_tokens)

    def delete(self, user: str, session_key: str) -> None:
        """Remove the session and (by cascade) its messages."""
        self._check_open()
        user, key = check_user(user), check_session_key(session_key)
        with self._tx("deleting a session") as conn:
            cur = conn.execute(
                "DELETE FROM recalld_sessions WHERE session_key = %s AND user_id = %s", (key, user)
            )
            if cur.rowcount == 0:
                raise SessionNotFound()

    def purge_messages(self, user: str, session_key: str, *, after: datetime | None = None,
                       before: datetime | None = None) -> int:
        """Delete the messages timed in ``[after, before)`` (every message when neither is
        given) and re-derive the session row; returns how many were removed. The kept
        messages keep their ``seq``, so cursors handed out before stay valid."""
        self._check_open()
        user, key = check_user(user), check_session_key(session_key)
        with self._tx("purging messages") as conn:
            self._session_row(conn, user, key, lock=True)
            moved = self._retargets(conn, key, after, before)
            cur = conn.execute(
                "DELETE FROM recalld_messages WHERE session_key = %s"
                " AND (%s::timestamptz IS NULL OR ts::timestamptz >= %s::timestamptz)"
                " AND (%s::timestamptz IS NULL OR ts::timestamptz < %s::timestamptz)"
                " RETURNING seq, id",
                (key, after, after, before, before),
            )
            gone = cur.fetchall()
            removed_seqs = [int(row[0]) for row in gone]
            removed = len(removed_seqs)
            if removed:
                self._apply_retargets(conn, key, moved)
                # A forgotten message's files go with it; those a kept message names stay.
                conn.execute(
                    "DELETE FROM recalld_attachments a WHERE a.session_key = %s AND NOT EXISTS ("
                    " SELECT 1 FROM recalld_messages m, jsonb_array_elements(CASE WHEN"
                    " jsonb_typeof(m.extra->'attachments') = 'array' THEN m.extra->'attachments'"
                    " ELSE '[]' END) f WHERE m.session_key = a.session_key"
                    " AND f->>'sha256' = a.sha256)", (key,))
                # A summary covering a removed message would keep the forgotten text.
                conn.execute("DELETE FROM recalld_summaries WHERE session_key = %s"
                             " AND through_seq >= %s",
                             (key, min(removed_seqs)))
                conn.execute(_RECOUNT_SQL, (key, key, key))
                # The indexers re-chunk what is left now, not at their next poll.
                conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, key))
        log.info("transcript.purged", session=key, messages=removed)
        return removed

    @staticmethod
    def _retargets(conn: Any, key: str, after: datetime | None,
                   before: datetime | None) -> dict[str, str | None]:
        """Before a purge: what becomes of the ``replaces`` of the messages it keeps
        (``sessions.supersede.retarget``: one naming a purged message would hide every message
        before it). Reads the session's ids in order, in the purge's transaction."""
        rows = conn.execute(
            "SELECT id, extra->>'replaces',"
            " (%s::timestamptz IS NULL OR ts::timestamptz >= %s::timestamptz)"
            " AND (%s::timestamptz IS NULL OR ts::timestamptz < %s::timestamptz)"
            " FROM recalld_messages WHERE session_key = %s ORDER BY seq",
            (after, after, before, before, key)).fetchall()
        gone = {str(mid) for mid, _, within in rows if within}
        targets = {str(mid): str(target)
                   for mid, target, within in rows if target is not None and not within}
        return retarget([str(mid) for mid, _, _ in rows], gone, targets)

    @staticmethod
    def _apply_retargets(conn: Any, key: str, moved: dict[str, str | None]) -> None:
        for mid, target in moved.items():
            if target is None:
                conn.execute("UPDATE recalld_messages SET extra = extra - 'replaces'"
                             " WHERE session_key = %s AND id = %s", (key, mid))
            else:
                conn.execute("UPDATE recalld_messages SET extra = jsonb_set(extra, '{replaces}',"
                             " to_jsonb(%s::text)) WHERE session_key = %s AND id = %s",
                             (target, key, mid))

    def append_summary(self, user: str, session_key: str, *, content: str, through: str,
                       messages: int) -> ConversationSummary:
        """Keep the session's conversation summary (one row, replaced by the next); the message
        row's ``seq`` of ``through`` is kept beside it (the newest message's when the id is not
        one of the session's) so that a purge can tell what it covers."""
        self._check_open()
        user, key = check_user(user), check_session_key(session_key)
        summary, _ = inputs.build_summary(content=content, through=through, messages=messages,
                                          config=self._config)
        _refuse_nul(("content", summary.content), ("through", summary.through))
        with self._tx("keeping a conversation summary") as conn:
            session = conn.execute(
                "SELECT next_seq FROM recalld_sessions WHERE session_key = %s"
                " AND user_id = %s FOR UPDATE",
                (key, user),
            ).fetchone()
            if session is None:
                raise SessionNotFound()
            conn.execute(_UPSERT_SUMMARY_SQL, (
                key, summary.id, summary.content, summary.ts, summary.through, key, summary.through,
                session[0] - 1, summary.messages,
            ))
        return summary

    def summary(self, user: str, session_key: str) -> ConversationSummary | None:
        """The session's conversation summary, or None."""
        self._check_open()
        user, key = check_user(user), check_session_key(session_key)
        with self._tx("reading a conversation summary") as conn:
            self._session_row(conn, user, key)
            row = conn.execute(
                "SELECT id, content, ts, through, messages FROM recalld_summaries"
                " WHERE session_key = %s",
                (key,),
            ).fetchone()
        return None if row is None else ConversationSummary(row[0], row[1], row[2], row[3],
                                                            int(row[4]))

    def transcript_path(self, user: str, session_key: str) -> NoReturn:
        """There is no transcript file: a malformed key is SessionNotFound as in the file store,
        any other call StorageError. JSONL is the export format (``recalld import``), not the
        storage, on this backend."""
        check_user(user)
        check_session_key(session_key)
        raise StorageError("sessions stored in PostgreSQL have no transcript file")

    def idle_sessions(self, cutoff: datetime, *, limit: int,
                      after: tuple[str, str] | None = None) -> builtins.list[tuple[str, str]]:
        """:meth:`~sessions.protocol.SessionStoreLike.idle_sessions`, from ``recalld_sessions``."""
        self._check_open()
        bound, limit, (user, key) = idle_query(cutoff, limit, after)
        with self._tx("finding idle sessions") as conn:
            rows = conn.execute(_IDLE_SQL, (bound, user, key, limit)).fetchall()
        return [(str(user), str(key)) for user, key in rows]

    def flush(self) -> None:
        """Nothing to do: every call commits before it returns (durability is the server's)."""

    def close(self) -> None:
        """Close the pool. Safe to call twice; later calls to the store fail."""
        if self._closed:
            return
        self._closed = True
        self._pool.close()

    def __enter__(self) -> PgSessionStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----------------------------------------------------------------- storage steps
    # The public methods they serve (create, list, history, recent_messages, append_message)
    # and their checks are CheckedSessionStore's, the same as the file store's.

    def _create(self, user: str, header: Header, line: bytes) -> Session:
        """One row."""
        _refuse_nul(("title", header.title), ("systemPrompt", header.system_prompt),
                    ("model", header.model))
        with self._tx("creating a session") as conn:
            try:
                conn.execute(
                    "INSERT INTO recalld_sessions (session_key, user_id, title, system_prompt,"
                    " model, memory, created_at, updated_at, temperature, max_tokens)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                    (header.session_key, user, header.title, header.system_prompt, header.model,
                     header.memory, header.created_at, header.created_at, header.temperature,
                     header.max_tokens),
                )
            except psycopg.errors.UniqueViolation:
                raise StorageError("a session with this key already exists") from None
        return Session(header.session_key, user, header.title, header.created_at, header.created_at,
                       0, header.system_prompt, header.model, header.memory, header.temperature,
                       header.max_tokens)

    def _list_page(self, user: str, after: tuple[str, str] | None,
                   limit: int) -> builtins.list[Session]:
        with self._tx("listing sessions") as conn:
            if after is None:
                rows = conn.execute(_FIRST_PAGE_SQL, (user, limit)).fetchall()
            else:
                rows = conn.execute(_PAGE_SQL, (user, after[0], after[1], limit)).fetchall()
        return [_session(row) for row in rows]

    def _append_message(self, user: str, key: str, message: Message, line: bytes) -> Message:
        """The next ``seq`` of the session and the ``INSERT`` commit together, with the notify."""
        _refuse_nul(("content", message.content), ("name", message.name), ("runId", message.run_id))
        if _holds_nul(message.extra):
            raise InvalidSessionInput("extra", "must not contain NUL characters")
        fence = RUN_FENCE.get()
        if fence is not None and fence.session_key != key:
            fence = None
        with self._tx("appending a message") as conn:
            if fence is not None and (
                    fence.lost or conn.execute(_FENCE_SQL, (key, fence.token)).fetchone() is None):
                fence.lost = True
                raise LeaseLost()
            row = conn.execute(_APPEND_SQL, (len(line), message.ts, key, user)).fetchone()
            if row is None:
                raise SessionNotFound()
            conn.execute(_INSERT_MESSAGE_SQL, (
                key, row[0], message.id, message.role, message.content, message.ts,
                message.run_id, message.name, Jsonb(message.extra), len(line),
            ))
            conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, key))
        return message

    # ----------------------------------------------------------------- internals

    @contextlib.contextmanager
    def _tx(self, action: str) -> Iterator[_Conn]:
        """One pooled connection and one transaction; a database failure becomes StorageError."""
        try:
            with self._pool.connection() as conn, conn.transaction():
                yield conn
        except psycopg.Error as err:
            log.error("sessions.db_failed", action=action, error=_reason(err))
            raise StorageError(f"session database failed while {action}") from err
        except Exception as err:
            if type(err).__module__.startswith("psycopg_pool"):  # PoolTimeout, PoolClosed
                log.error("sessions.db_failed", action=action, error=str(err))
                raise StorageError(f"session database unavailable while {action}") from err
            raise

    def _session_row(self, conn: _Conn, user: str, key: str, *, lock: bool = False) -> Session:
        row = conn.execute(
            f"SELECT {_SESSION_COLUMNS} FROM recalld_sessions WHERE session_key = %s"
            " AND user_id = %s"
            + (" FOR UPDATE" if lock else ""),
            (key, user),
        ).fetchone()
        if row is None:
            raise SessionNotFound()
        return _session(row)

    def _read_back(self, user: str, key: str, limit: int, before: int | None,
                   max_bytes: int | None) -> MessagePage:
        """Up to ``limit`` messages with ``seq < before`` (default: all), oldest first, capped by
        the bytes of their lines; sizes are read first so a page never loads what it leaves.
        The history cursor is the ``seq`` of the oldest message on the page, so it stays valid
        while messages are appended."""
        with self._tx("reading messages") as conn:
            next_seq = conn.execute(
                "SELECT next_seq FROM recalld_sessions WHERE session_key = %s AND user_id = %s",
                (key, user),
            ).fetchone()
            if next_seq is None:
                raise SessionNotFound()
            if before is not None and not 0 <= before <= next_seq[0]:
                raise InvalidSessionInput("before", "is not a cursor returned by this server")
            if limit <= 0:
                return [], None
            bound = next_seq[0] if before is None else before
            sizes = conn.execute(
                "SELECT seq, line_bytes FROM recalld_messages WHERE session_key = %s AND seq < %s"
                " ORDER BY seq DESC LIMIT %s",
                (key, bound, limit + 1),
            ).fetchall()
            taken, used = 0, 0
            for _, line_bytes in sizes[:limit]:
                if max_bytes is not None and taken > 0 and used + line_bytes > max_bytes:
                    break
                taken += 1
                used += line_bytes
            if taken == 0:
                return [], None
            oldest = sizes[taken - 1][0]
            rows = conn.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM recalld_messages"
                " WHERE session_key = %s AND seq >= %s AND seq < %s ORDER BY seq",
                (key, oldest, bound),
            ).fetchall()
        messages = [Message(r[0], r[1], r[2], r[3], r[4], r[5], dict(r[6])) for r in rows]
        more = len(sizes) > taken
        return messages, (encode_history_cursor(key, oldest) if more else None)


def _session(row: tuple[Any, ...]) -> Session:
    key, user, title, created, updated, count, prompt, model, memory, temperature, max_tokens = row
    return Session(key, user, title, created, updated, count, prompt, model, bool(memory),
                   None if temperature is None else float(temperature), max_tokens)


def _refuse_nul(*fields: tuple[str, str | None]) -> None:
    # PostgreSQL text cannot hold U+0000 (a transcript line can): refuse it as bad input
    # before the server does, so the caller learns which field it was.
    for field, value in fields:
        if value is not None and "\x00" in value:
            raise InvalidSessionInput(field, "must not contain NUL characters")


def _holds_nul(value: object) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, Mapping):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_holds_nul(v) for v in value)
    return False


def _reason(err: psycopg.Error) -> str:
    """The server's or libpq's one-line reason (never the DSN, which may hold a password)."""
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


class PgAttachments:
    """:class:`sessions.AttachmentFiles` on PostgreSQL: ``recalld_attachments`` rows (bytea),
    one per file and session."""

    def __init__(self, store: PgSessionStore) -> None:
        self._store = store

    def put(self, user: str, session_key: str, data: bytes) -> str:
        store = self._store
        store._check_open()
        user, key = check_user(user), check_session_key(session_key)
        sha = hashlib.sha256(data).hexdigest()
        with store._tx("storing an attachment") as conn:
            store._session_row(conn, user, key)
            conn.execute("INSERT INTO recalld_attachments (session_key, sha256, bytes, data)"
                         " VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                         (key, sha, len(data), data))
        return sha

    def get(self, user: str, session_key: str, sha256: str) -> bytes:
        store = self._store
        store._check_open()
        user, key = check_user(user), check_session_key(session_key)
        if not is_sha256(sha256):
            raise InvalidSessionInput("sha256", "must be 64 lowercase hex digits")
        with store._tx("reading an attachment") as conn:
            store._session_row(conn, user, key)
            row = conn.execute("SELECT data FROM recalld_attachments WHERE session_key = %s"
                               " AND sha256 = %s",
                               (key, sha256)).fetchone()
        if row is None:
            raise InvalidSessionInput("sha256", "is not an attachment of this session")
        return bytes(row[0])
