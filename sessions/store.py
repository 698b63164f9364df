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
import os
import threading
from collections.abc import Callable, Collection
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import TypeAlias

import apsw
import structlog

from . import inputs
from .attachments import AttachmentStore, attachment_hashes
from .checked import CheckedSessionStore
from .config import SessionsConfig
from .errors import SessionNotFound, StorageError
from .fileio import (
    Durability,
    FileIO,
    append_line,
    check_free_space,
    create_with_line,
    describe_os_error,
)
from .idle import idle_query
from .index import SessionIndex
from .keys import check_session_key, check_user, encode_history_cursor, new_session_key
from .layout import sessions_root, transcript_file
from .models import ConversationSummary, Message, MessagePage, Session, SessionPage
from .purge import rewrite_file, without_messages
from .reconcile import catch_up, reconcile_at_open
from .recovery import recover_tail
from .rows import IndexRows
from .shutdown import write_marker
from .transcript import Header, Summary, header_of, open_sized, read_page, read_summary_backward

__all__ = ["MessagePage", "SessionPage", "SessionStore"]

log = structlog.get_logger(__name__)

_Ident: TypeAlias = "tuple[str, str]"

_STRIPES = 64
_DIR_MODE = 0o700  # transcripts are private conversations


class SessionStore(CheckedSessionStore):
    """All sessions under ``<data_dir>/sessions`` plus the index ``<data_dir>/sessions.db``.

    ``create``, ``list``, ``history``, ``recent_messages`` and ``append_message`` (their checks and
    paging) are :class:`~sessions.checked.CheckedSessionStore`'s; this class gives their storage
    steps over transcripts."""

    def __init__(
        self,
        data_dir: Path,
        config: SessionsConfig = SessionsConfig(),  # noqa: B008 - frozen, so sharing is safe
        *,
        file_io: FileIO | None = None,
        key_factory: Callable[[], str] = new_session_key,
        trust_clean_stop: bool = False,
    ) -> None:
        """``file_io`` is the seam for fault tests; ``key_factory`` makes each new session's key
        (default: random, :func:`sessions.keys.new_session_key`). The benchmark harness passes a
        seeded one so that a dataset loads into the same keys, and so the same index, every run.

        ``trust_clean_stop``: after a clean stop (:mod:`sessions.shutdown`), check only the user
        directories at open and every transcript in a background thread, which ``close`` joins;
        otherwise (and always after a crash) every transcript is checked before this returns.
        ``clean_start`` says which ran."""
        self._config = config
        self._key_factory = key_factory
        self._io = file_io if file_io is not None else FileIO()
        self._durability = Durability(config.fsync, self._io)
        self._root = sessions_root(data_dir)
        self._stripes = tuple(threading.Lock() for _ in range(_STRIPES))
        self._state_lock = threading.Lock()
        self._validated: dict[_Ident, int] = {}  # transcripts checked this process -> header end
        # The newest conversation summary of each transcript read this process (None: it has
        # none), so the prompt of each run finds it without scanning the file again.
        self._summaries: dict[_Ident, ConversationSummary | None] = {}
        self._closed = False
        self._data_dir = Path(data_dir)
        # chat.send's files (sessions.attachments), deleted with their session.
        self.attachments = AttachmentStore(self._data_dir, config.min_free_bytes, self._io)
        self._catching_up: threading.Thread | None = None
        try:
            self._root.mkdir(parents=True, exist_ok=True, mode=_DIR_MODE)
        except OSError as err:
            raise StorageError(describe_os_error(err, "creating the sessions directory")) from err
        try:
            index = SessionIndex(self._data_dir / "sessions.db")
        except apsw.Error as err:
            raise StorageError(f"could not open the session index: {err}") from err
        self._rows = IndexRows(index, self._root, self._stripe)
        try:
            with self._rows.op("checking the session index against the transcripts"):
                self.clean_start = reconcile_at_open(index, self._data_dir, self._root, self._io,
                                                     durable=self._durability.enabled,
                                                     trust_marker=trust_clean_stop)
        except BaseException:
            index.close()
            raise
        if self.clean_start:
            self._catching_up = threading.Thread(target=self._catch_up_logged,
                                                 name="sessions-catch-up", daemon=True)
            self._catching_up.start()

    # ----------------------------------------------------------------- public API

    def get(self, user: str, session_key: str) -> Session:
        """The session's metadata; SessionNotFound for unknown, foreign or malformed keys."""
        self._check_open()
        user, key = check_user(user), check_session_key(session_key)
        with self._stripe(key):
            self._ensure_open(user, key)
        self._rows.refresh_pending()
        return self._rows.session(user, key)

    def update(
        self, user: str, session_key: str, *, title: str | None = None,
        system_prompt: str | None = None, model: str | None = None,
        temperature: float | None = None, max_tokens: int | None = None,
        clear: Collection[str] = (),
    ) -> Session:
        """Change the title, system prompt, model or sampling (``clear``: back to the default):
        one ``update`` line is appended (the header is never rewritten) and the index row
        follows. ``updatedAt`` does not move."""
        self._check_open()
        user, key = check_user(user), check_session_key(session_key)
        ident = (user, key)
        # An update line carries the whole new prompt: it fills a disk as fast as an append.
        check_free_space(self._root, self._config.min_free_bytes)
        with self._stripe(key):
            path, _ = self._ensure_open(user, key)
            now = self._rows.session(user, key)
            header = Header(key, user, now.created_at, now.title, now.system_prompt, now.model,
                            now.memory, now.temperature, now.max_tokens)
            new, line = inputs.build_update(header, title=title, system_prompt=system_prompt,
                                            model=model, temperature=temperature,
                                            max_tokens=max_tokens, clear=clear, config=self._config)
            size = self._append_line(ident, path, line)
            self._rows.write(ident, lambda: self._rows.index.record_update(user, key, new, size))
        return replace(now, title=new.title, system_prompt=new.system_prompt, model=new.model,
                       temperature=new.temperature, max_tokens=new.max_tokens)

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
            self.attachments.delete_session(user, key)
            self._forget(ident)
            self._durability.forget(path)
            self._durability.written(path.parent)
            self._rows.write(ident, lambda: self._rows.index.delete(user, key))

    def purge_messages(self, user: str, session_key: str, *, after: datetime | None = None,
                       before: datetime | None = None) -> int:
        """Rewrite the transcript without its messages timed in ``[after, before)`` (every
        message when neither is given); returns how many were removed.

        For forgetting for real (``memory.forget {purgeTranscript:true}``), crash-safe
        (:mod:`sessions.purge`). The header and every other line stay byte for byte; the
        session's index row is re-derived.
        """
        self._check_open()
        user, key = check_user(user), check_session_key(session_key)
        ident = (user, key)
        with self._stripe(key):
            path, header_end = self._ensure_open(user, key)
            content, removed = without_messages(path, header_end, after, before)
            if removed:
                rewrite_file(self._io, path, content)
                # A forgotten message's files go with it; those the kept lines name stay.
                self.attachments.keep_only(user, key, attachment_hashes(content))
                self._forget(ident)
                self._durability.forget(path)
                self._rows.refresh(user, key)
        log.info("transcript.purged", session=key, messages=removed)
        return removed

    def append_summary(self, user: str, session_key: str, *, content: str, through: str,
                       messages: int) -> ConversationSummary:
        """Append a conversation summary line covering the messages up to ``through`` (an id),
        ``messages`` of them; it supersedes every earlier one. Not a message: neither the count
        nor ``updatedAt`` moves."""
        self._check_open()
        user, key = check_user(user), check_session_key(session_key)
        summary, line = inputs.build_summary(content=content, through=through, messages=messages,
                                             config=self._config)
        ident = (user, key)
        check_free_space(self._root, self._config.min_free_bytes)
        with self._stripe(key):
            path, _ = self._ensure_open(user, key)
            size = self._append_line(ident, path, line)
            with self._state_lock:
                self._summaries[ident] = summary
            self._rows.write(ident, lambda: self._rows.index.record_size(user, key, size))
        return summary

    def summary(self, user: str, session_key: str) -> ConversationSummary | None:
        """The session's newest conversation summary, or None. The first call for a session in
        this process reads the transcript back to it (to the header when there is none)."""
        self._check_open()
        user, key = check_user(user), check_session_key(session_key)
        ident = (user, key)
        with self._stripe(key):
            path, header_end = self._ensure_open(user, key)
            with self._state_lock:
                if ident in self._summaries:
                    return self._summaries[ident]
            fd, size = open_sized(path)
            try:
                found = read_summary_backward(fd, size, header_end)
            except OSError as err:
                raise StorageError(describe_os_error(err, "reading transcript")) from err
            finally:
                os.close(fd)
            with self._state_lock:
                self._summaries[ident] = found
        return found

    def transcript_path(self, user: str, session_key: str) -> Path:
        """Where the transcript lives (checked names only; the file may not exist)."""
        return transcript_file(self._root, check_user(user), check_session_key(session_key))

    def idle_sessions(self, cutoff: datetime, *, limit: int,
                      after: tuple[str, str] | None = None) -> builtins.list[tuple[str, str]]:
        """:meth:`~sessions.protocol.SessionStoreLike.idle_sessions`, from the index (reconciled at
        open; the sweep's ``get`` before a delete re-derives a row its transcript outgrew)."""
        self._check_open()
        self._rows.refresh_pending()
        with self._rows.op("finding idle sessions"):
            return self._rows.index.idle(*idle_query(cutoff, limit, after))

    def flush(self) -> None:
        """fsync every transcript and directory written since the last flush (``"batch"``);
        StorageError if any fsync failed (each is logged)."""
        self._durability.flush()

    def close(self) -> None:
        """Flush, close the index, then leave the clean-stop marker. Safe to call twice; later
        calls to the store fail."""
        if self._closed:
            return
        self._closed = True
        if self._catching_up is not None:
            self._catching_up.join()  # it stops at its next transcript once closed is set
        try:
            self.flush()
        finally:
            with self._rows.lock:
                self._rows.index.close()
        write_marker(self._data_dir, self._root, durable=self._durability.enabled)

    def catch_up(self) -> int:
        """Check every transcript against its row while the store is in use (a transcript
        appended to while the daemon was down is found here); returns how many rows it
        re-derived. See :func:`sessions.reconcile.catch_up`."""
        return catch_up(self._rows, self._root, self._io, durable=self._durability.enabled,
                        stripe=self._stripe, forget=self._forget, closed=lambda: self._closed)

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----------------------------------------------------------------- storage steps
    # The public methods they serve (create, list, history, recent_messages, append_message)
    # and their checks are CheckedSessionStore's, the same on PostgreSQL.

    def _create(self, user: str, header: Header, line: bytes) -> Session:
        """A new transcript holding only its header, and its index row."""
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
            self._rows.write((user, key), lambda: self._rows.index.put(user, summary))
        return summary.session(user)

    def _list_page(self, user: str, after: tuple[str, str] | None,
                   limit: int) -> builtins.list[Session]:
        """From the index, once the rows waiting to be refreshed are."""
        self._rows.refresh_pending()
        with self._rows.op("listing sessions"):
            return self._rows.index.page(user, after, limit)

    def _append_message(self, user: str, key: str, message: Message, line: bytes) -> Message:
        """One line with one ``write`` under the session's stripe; then its index row."""
        ident = (user, key)
        check_free_space(self._root, self._config.min_free_bytes)
        with self._stripe(key):
            path, _ = self._ensure_open(user, key)
            new_size = self._append_line(ident, path, line)
            self._rows.write(
                ident, lambda: self._rows.index.record_append(user, key, message.ts, new_size)
            )
        return message

    # ----------------------------------------------------------------- transcripts

    def _catch_up_logged(self) -> None:
        try:
            self.catch_up()
        except Exception as err:  # noqa: BLE001 - a background check; each session's first use re-checks
            log.error("sessions.catch_up_failed", error=str(err), error_type=type(err).__name__)

    def _stripe(self, session_key: str) -> threading.Lock:
        return self._stripes[int(session_key[:8], 16) % _STRIPES]

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
            self._rows.write(ident, lambda: self._rows.index.delete(*ident))
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
            self._summaries.pop(ident, None)

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
            size, found = header_of(path)
        except FileNotFoundError:
            self._rows.write(ident, lambda: self._rows.index.delete(user, key))
            raise SessionNotFound() from None
        if found is None or found[0].session_key != key or found[0].user != user:
            log.warning("transcript.unreadable", path=str(path), reason="bad header")
            raise SessionNotFound()
        with self._state_lock:
            self._validated[ident] = found[1]
        with self._rows.op("reading the session index"):
            row = self._rows.index.get(user, key)
        if recovery is not None or row is None or row[1] != size:
            self._rows.refresh(user, key)
        return path, found[1]

    def _read_back(self, user: str, key: str, limit: int, before: int | None,
                   max_bytes: int | None = None) -> MessagePage:
        """Backwards from the end of the transcript: cost grows with the page, not the file."""
        with self._stripe(key):
            path, header_end = self._ensure_open(user, key)
            # Sized under the stripe lock, so no append is half-way through: the size is a
            # line boundary. Reading needs no lock: lines before it never change, and a
            # delete meanwhile leaves this descriptor readable.
            fd, size = open_sized(path)
        try:
            page, more = read_page(fd, size, header_end, limit, before, path, max_bytes)
        except OSError as err:
            raise StorageError(describe_os_error(err, "reading transcript")) from err
        finally:
            os.close(fd)
        cursor = encode_history_cursor(key, page[0][0]) if more else None
        return [message for _, message in page], cursor
