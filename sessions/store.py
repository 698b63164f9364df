"""SessionStore: sessions and their JSONL transcripts, behind one synchronous, thread-safe API.

The gateway calls every method through ``asyncio.to_thread``. Locking, in the one order used
everywhere (never the reverse, so no deadlock):

1. a *stripe* lock chosen by session key (64 of them): serialises writes to one transcript and
   its first-open recovery, while different sessions append in parallel (an fsync under
   ``"always"`` holds only its own stripe);
2. the *index* lock: the single apsw connection;
3. the *state* lock (and :class:`Durability`'s own): the small in-memory sets (validated
   transcripts, rows to refresh, paths awaiting fsync), held only for set operations.

File descriptors are never cached: each append opens, writes and closes, so thousands of
sessions cost no descriptors between calls.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any, TypeAlias

import apsw
import structlog

from . import inputs
from .config import SessionsConfig
from .errors import InvalidSessionInput, SessionNotFound, StorageError
from .fileio import (
    FILE_MODE,
    Durability,
    FileIO,
    append_line,
    append_whole_line,
    check_free_space,
    create_with_line,
    describe_os_error,
    fsync_path,
)
from .index import SessionIndex
from .keys import (
    check_session_key,
    check_user,
    decode_history_cursor,
    decode_list_cursor,
    encode_history_cursor,
    encode_list_cursor,
    is_session_key,
    new_session_key,
)
from .layout import sessions_root, transcript_file
from .models import Message, Session, parse_ts
from .reconcile import checked_summary, reconcile
from .transcript import Header, Summary, parse_line, read_header, read_page, recover_tail

__all__ = ["MessagePage", "SessionPage", "SessionStore"]

log = structlog.get_logger(__name__)

# Aliases at module level: inside the class, `list` names the method, not the builtin.
SessionPage: TypeAlias = "tuple[builtins.list[Session], str | None]"
MessagePage: TypeAlias = "tuple[builtins.list[Message], str | None]"
_Ident: TypeAlias = "tuple[str, str]"

_STRIPES = 64
_DIR_MODE = 0o700  # transcripts are private conversations


class SessionStore:
    """All sessions under ``<data_dir>/sessions`` plus the index ``<data_dir>/sessions.db``."""

    def __init__(
        self,
        data_dir: Path,
        config: SessionsConfig = SessionsConfig(),  # noqa: B008 - frozen, so sharing is safe
        *,
        file_io: FileIO | None = None,
        key_factory: Callable[[], str] = new_session_key,
    ) -> None:
        """``file_io`` is the seam for fault tests; ``key_factory`` makes each new session's key
        (default: random, :func:`sessions.keys.new_session_key`). The benchmark harness passes a
        seeded one so that a dataset loads into the same keys, and so the same index, every run."""
        self._config = config
        self._key_factory = key_factory
        self._io = file_io if file_io is not None else FileIO()
        self._durability = Durability(config.fsync, self._io)
        self._root = sessions_root(data_dir)
        self._stripes = tuple(threading.Lock() for _ in range(_STRIPES))
        self._index_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._validated: dict[_Ident, int] = {}  # transcripts checked this process -> header end
        self._needs_refresh: set[_Ident] = set()
        self._closed = False
        try:
            self._root.mkdir(parents=True, exist_ok=True, mode=_DIR_MODE)
        except OSError as err:
            raise StorageError(describe_os_error(err, "creating the sessions directory")) from err
        try:
            self._index = SessionIndex(Path(data_dir) / "sessions.db")
        except apsw.Error as err:
            raise StorageError(f"could not open the session index: {err}") from err
        try:
            with self._index_op("checking the session index against the transcripts"):
                reconcile(self._index, self._root, self._io, durable=self._durability.enabled)
        except BaseException:
            self._index.close()
            raise

    # ----------------------------------------------------------------- public API

    def create(
        self,
        user: str,
        *,
        title: str | None = None,
        system_prompt: str | None = None,
        model: str | None = None,
        created_at: datetime | str | None = None,
        memory: bool = True,
    ) -> Session:
        """Start a session: a new transcript holding only its header, and its index row.
        ``memory=False``: incognito (kept, but the memory index never reads it)."""
        self._check_open()
        user = check_user(user)
        header, line = inputs.build_header(
            user,
            session_key=self._new_key(),
            title=title,
            system_prompt=system_prompt,
            model=model,
            created_at=created_at,
            config=self._config,
            memory=memory,
        )
        key = header.session_key
        user_dir = self._root / user
        check_free_space(self._root, self._config.min_free_bytes)
        with self._stripe(key):
            new_dirs = self._make_user_dir(user_dir)
            path = transcript_file(self._root, user, key)
            create_with_line(self._io, path, line, sync=self._durability.sync_each_write)
            self._durability.written(path, user_dir, *new_dirs)
            with self._state_lock:
                self._validated[(user, key)] = len(line)
            summary = Summary(header, len(line), 0, header.created_at, len(line))
            self._index_write((user, key), lambda: self._index.put(user, summary))
        return summary.session(user)

    def get(self, user: str, session_key: str) -> Session:
        """The session's metadata; SessionNotFound for unknown, foreign or malformed keys."""
        self._check_open()
        user, key = check_user(user), check_session_key(session_key)
        with self._stripe(key):
            self._ensure_open(user, key)
        self._refresh_pending()
        return self._session_row(user, key)

    def list(self, user: str, *, limit: int = 50, before: str | None = None) -> SessionPage:
        """One page of ``user``'s sessions, newest ``updatedAt`` first (ties: key descending).

        Returns the page and the cursor for the next one (None at the end). Keyset paging: a
        session updated between two calls moves to the front and is not repeated further on.
        """
        self._check_open()
        user = check_user(user)
        limit = inputs.check_limit(limit, self._config)
        after = decode_list_cursor(before) if before is not None else None
        self._refresh_pending()
        with self._index_op("listing sessions"):
            rows = self._index.page(user, after, limit + 1)
        if len(rows) <= limit:
            return rows, None
        last = rows[limit - 1]
        return rows[:limit], encode_list_cursor(last.updated_at, last.session_key)

    def history(
        self, user: str, session_key: str, *, limit: int = 50, before: str | None = None
    ) -> MessagePage:
        """The latest ``limit`` messages before the cursor, oldest first, and the next cursor.

        Reads backwards from the end of the transcript: cost grows with the page, not the file.
        The page also stops before the message that would take its lines past
        ``max_page_bytes`` (it always holds one), and the cursor then resumes exactly there.
        """
        self._check_open()
        user, key = check_user(user), check_session_key(session_key)
        limit = inputs.check_limit(limit, self._config)
        offset = decode_history_cursor(before, key) if before is not None else None
        return self._read_back(user, key, limit, offset, self._config.max_page_bytes)

    def recent_messages(self, user: str, session_key: str, n: int) -> builtins.list[Message]:
        """The last ``n`` messages in order, for building the model's context (no page cap)."""
        self._check_open()
        user, key = check_user(user), check_session_key(session_key)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidSessionInput("n", "must be a non-negative integer")
        return self._read_back(user, key, n, None)[0]

    def append_message(
        self,
        user: str,
        session_key: str,
        *,
        role: str,
        content: str,
        run_id: str | None = None,
        name: str | None = None,
        ts: datetime | str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Message:
        """Append one message line with one ``write``; nothing is written if anything is wrong.

        ``ts`` defaults to now (the benchmark harness passes dataset dates). ``extra`` adds keys
        such as ``model``, ``usage``, ``finishReason``, ``aborted``, ``failed`` to the line.
        """
        self._check_open()
        user, key = check_user(user), check_session_key(session_key)
        message, line = inputs.build_message(
            role=role, content=content, run_id=run_id, name=name, ts=ts, extra=extra,
            config=self._config,
        )
        ident = (user, key)
        check_free_space(self._root, self._config.min_free_bytes)
        with self._stripe(key):
            path, _ = self._ensure_open(user, key)
            new_size = self._append_line(ident, path, line)
            self._index_write(
                ident, lambda: self._index.record_append(user, key, message.ts, new_size)
            )
        return message

    def update(
        self, user: str, session_key: str, *, title: str | None = None,
        system_prompt: str | None = None,
    ) -> Session:
        """Change the title and/or system prompt: one ``update`` line is appended (the header
        is never rewritten) and the index row follows. ``updatedAt`` does not move."""
        self._check_open()
        user, key = check_user(user), check_session_key(session_key)
        ident = (user, key)
        # An update line carries the whole new prompt: it fills a disk as fast as an append.
        check_free_space(self._root, self._config.min_free_bytes)
        with self._stripe(key):
            path, _ = self._ensure_open(user, key)
            now = self._session_row(user, key)
            header = Header(key, user, now.created_at, now.title, now.system_prompt, now.model)
            new, line = inputs.build_update(header, title=title, system_prompt=system_prompt,
                                            config=self._config)
            size = self._append_line(ident, path, line)
            self._index_write(ident, lambda: self._index.record_update(
                user, key, new.title, new.system_prompt, size))
        return replace(now, title=new.title, system_prompt=new.system_prompt)

    def delete(self, user: str, session_key: str) -> None:
        """Remove the transcript, any ``.corrupt-*`` tails saved beside it, and its index row."""
        self._check_open()
        user, key = check_user(user), check_session_key(session_key)
        ident = (user, key)
        with self._stripe(key):
            path, _ = self._ensure_open(user, key)
            try:
                path.unlink()
            except FileNotFoundError:
                raise SessionNotFound() from None
            except OSError as err:
                raise StorageError(describe_os_error(err, "deleting transcript")) from err
            for aside in path.parent.glob(f"{path.name}.corrupt-*"):
                aside.unlink(missing_ok=True)
            self._forget(ident)
            self._durability.forget(path)
            self._durability.written(path.parent)
            self._index_write(ident, lambda: self._index.delete(user, key))

    def purge_messages(self, user: str, session_key: str, *, after: datetime | None = None,
                       before: datetime | None = None) -> int:
        """Rewrite the transcript without its messages timed in ``[after, before)`` (every
        message when neither is given); returns how many were removed.

        For forgetting for real (``memory.forget {purgeTranscript:true}``): the kept lines go to
        a temporary file beside the transcript, which is fsynced and renamed over it, then the
        directory is fsynced, so a crash leaves the old file or the new one, never a mix. The
        header and every other line stay byte for byte; the session's index row is re-derived.
        """
        self._check_open()
        user, key = check_user(user), check_session_key(session_key)
        ident = (user, key)
        with self._stripe(key):
            path, header_end = self._ensure_open(user, key)
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                raise SessionNotFound() from None
            except OSError as err:
                raise StorageError(describe_os_error(err, "reading transcript")) from err
            kept = [data[:header_end]]
            removed = 0
            for raw in data[header_end:].splitlines(keepends=True):
                obj = parse_line(raw.rstrip(b"\n"))
                if obj is not None and obj["type"] == "message" and _within(obj.get("ts"), after, before):
                    removed += 1
                    continue
                kept.append(raw)
            if removed:
                self._rewrite(path, b"".join(kept))
                self._forget(ident)
                self._durability.forget(path)
                self._refresh_row(user, key)
        log.info("transcript.purged", session=key, messages=removed)
        return removed

    def _rewrite(self, path: Path, content: bytes) -> None:
        tmp = path.with_name(path.name + ".purge")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, FILE_MODE)
        except OSError as err:
            raise StorageError(describe_os_error(err, "rewriting transcript"), errno=err.errno) from err
        try:
            append_whole_line(self._io, fd, content, 0, "rewriting transcript")
            self._io.fsync(fd)
        except (StorageError, OSError) as err:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            if isinstance(err, StorageError):
                raise
            raise StorageError(describe_os_error(err, "syncing rewritten transcript"), errno=err.errno) from err
        os.close(fd)
        try:
            os.replace(tmp, path)
        except OSError as err:
            tmp.unlink(missing_ok=True)
            raise StorageError(describe_os_error(err, "replacing transcript"), errno=err.errno) from err
        fsync_path(self._io, path.parent)

    def transcript_path(self, user: str, session_key: str) -> Path:
        """Where the transcript lives (checked names only; the file may not exist)."""
        return transcript_file(self._root, check_user(user), check_session_key(session_key))

    def flush(self) -> None:
        """fsync every transcript and directory written since the last flush (``"batch"``);
        StorageError if any fsync failed (each is logged)."""
        self._durability.flush()

    def close(self) -> None:
        """Flush, then close the index. Safe to call twice; later calls to the store fail."""
        if self._closed:
            return
        self._closed = True
        try:
            self.flush()
        finally:
            with self._index_lock:
                self._index.close()

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----------------------------------------------------------------- transcripts

    def _new_key(self) -> str:
        key = self._key_factory()
        if not is_session_key(key):
            # A programming error in the caller's factory, not bad input from a client.
            raise ValueError(f"key_factory returned {key!r}, which is not a session key")
        return key

    def _stripe(self, session_key: str) -> threading.Lock:
        return self._stripes[int(session_key[:8], 16) % _STRIPES]

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError("the session store is closed")

    def _make_user_dir(self, user_dir: Path) -> tuple[Path, ...]:
        """Create the user's directory if needed; returns the directories whose entries changed."""
        if user_dir.is_dir():
            return ()
        try:
            user_dir.mkdir(mode=_DIR_MODE, exist_ok=True)
        except OSError as err:
            raise StorageError(describe_os_error(err, "creating the user's directory")) from err
        return (self._root,)

    def _append_line(self, ident: _Ident, path: Path, line: bytes) -> int:
        """Append under the stripe lock; returns the new size. Leaves the file whole on error."""
        try:
            new_size = append_line(self._io, path, line, sync=self._durability.sync_each_write)
        except FileNotFoundError:
            # Removed behind our back: drop what we knew about it.
            self._forget(ident)
            self._index_write(ident, lambda: self._index.delete(*ident))
            raise SessionNotFound() from None
        except StorageError:
            # Should the cut-back have failed too, recovery on next use repairs the tail.
            self._forget(ident)
            raise
        self._durability.appended(path)
        return new_size

    def _forget(self, ident: _Ident) -> None:
        with self._state_lock:
            self._validated.pop(ident, None)

    def _ensure_open(self, user: str, key: str) -> tuple[Path, int]:
        """First use in this process: repair the tail, check the header. Caller holds the stripe.

        Returns the path and the header's end offset. A missing file or unreadable header is
        SessionNotFound (logged), never a crash.
        """
        ident = (user, key)
        path = transcript_file(self._root, user, key)
        with self._state_lock:
            header_end = self._validated.get(ident)
        if header_end is not None:
            return path, header_end
        recovery = recover_tail(path, self._io, durable=self._durability.enabled)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            self._index_write(ident, lambda: self._index.delete(user, key))
            raise SessionNotFound() from None
        except OSError as err:
            raise StorageError(describe_os_error(err, "opening transcript")) from err
        try:
            size = os.fstat(fd).st_size
            found = read_header(fd, size)
        except OSError as err:
            raise StorageError(describe_os_error(err, "reading transcript")) from err
        finally:
            os.close(fd)
        if found is None or found[0].session_key != key or found[0].user != user:
            log.warning("transcript.unreadable", path=str(path), reason="bad header")
            raise SessionNotFound()
        with self._state_lock:
            self._validated[ident] = found[1]
        with self._index_op("reading the session index"):
            row = self._index.get(user, key)
        if recovery is not None or row is None or row[1] != size:
            self._refresh_row(user, key)
        return path, found[1]

    def _read_back(self, user: str, key: str, limit: int, before: int | None,
                   max_bytes: int | None = None) -> MessagePage:
        with self._stripe(key):
            path, header_end = self._ensure_open(user, key)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise SessionNotFound() from None
            except OSError as err:
                raise StorageError(describe_os_error(err, "reading transcript")) from err
            # Taken under the stripe lock, so no append is half-way through: the size is a
            # line boundary. Reading needs no lock: lines before it never change, and a
            # delete meanwhile leaves this descriptor readable.
            try:
                size = os.fstat(fd).st_size
            except OSError as err:
                os.close(fd)
                raise StorageError(describe_os_error(err, "reading transcript")) from err
        try:
            page, more = read_page(fd, size, header_end, limit, before, path, max_bytes)
        except OSError as err:
            raise StorageError(describe_os_error(err, "reading transcript")) from err
        finally:
            os.close(fd)
        cursor = encode_history_cursor(key, page[0][0]) if more else None
        return [message for _, message in page], cursor

    # ----------------------------------------------------------------- index

    @contextlib.contextmanager
    def _index_op(self, action: str) -> Iterator[None]:
        with self._index_lock:
            try:
                yield
            except apsw.Error as err:
                log.error("sessions.index_failed", action=action, error=str(err))
                raise StorageError(f"session index failed while {action}") from err

    def _index_write(self, ident: _Ident, write: Callable[[], None]) -> None:
        """An index update after the transcript changed: the transcript is already the truth,
        so a failure here is logged and repaired from the file later rather than raised."""
        try:
            with self._index_op("updating the session index"):
                write()
        except StorageError:
            with self._state_lock:
                self._needs_refresh.add(ident)

    def _refresh_row(self, user: str, key: str) -> Session | None:
        """Re-derive one row from its transcript (deleting it if the transcript is unusable)."""
        summary = checked_summary(self._root, user, key)
        with self._index_op("updating the session index"):
            if summary is None:
                self._index.delete(user, key)
                return None
            self._index.put(user, summary)
        return summary.session(user)

    def _refresh_pending(self) -> None:
        with self._state_lock:
            if not self._needs_refresh:
                return
            pending, self._needs_refresh = self._needs_refresh, set()
        for user, key in pending:
            try:
                with self._stripe(key):
                    self._refresh_row(user, key)
            except StorageError:
                with self._state_lock:
                    self._needs_refresh.add((user, key))

    def _session_row(self, user: str, key: str) -> Session:
        with self._index_op("reading the session index"):
            row = self._index.get(user, key)
        if row is not None:
            return row[0]
        session = self._refresh_row(user, key)
        if session is None:
            raise SessionNotFound()
        return session


def _within(ts: object, after: datetime | None, before: datetime | None) -> bool:
    """Whether a message time lies in [after, before). With no bound every message matches; a
    message whose time cannot be read cannot be placed in a bounded range and is kept."""
    if after is None and before is None:
        return True
    try:
        moment = parse_ts(ts) if isinstance(ts, str) else None
    except ValueError:
        moment = None
    if moment is None:
        return False
    return (after is None or moment >= after) and (before is None or moment < before)
