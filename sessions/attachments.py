"""Files sent with a chat message (``chat.send {attachments}``), stored content-addressed beside
the transcripts: ``<data_dir>/attachments/<user>/<sessionKey>/<sha256>``.

A file is kept per *session*, not per user: deleting a session (``sessions.delete``, retention)
removes its files with one directory, with no count of which other sessions hold the same
bytes; the same file sent twice in one session is stored once. Files are 0600 and directories
0700 (private conversations, as the transcripts); a file is written under a temporary name,
fsynced and renamed, so a crash never leaves half of one under its hash. The transcript's user
line carries only the metadata (``attachments: [{name, mediaType, sha256, bytes, text?}]``).
"""

from __future__ import annotations

import errno as errno_codes
import hashlib
import os
import re
import secrets
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Protocol, runtime_checkable

import orjson

from .errors import InvalidSessionInput, SessionNotFound, StorageError
from .fileio import (
    FileIO,
    append_whole_line,
    check_free_space,
    describe_os_error,
    fsync_path,
    open_no_links,
)
from .keys import check_session_key, check_user

__all__ = ["ATTACHMENTS_DIR", "AttachmentFiles", "AttachmentStore", "attachment_hashes",
           "is_sha256"]

ATTACHMENTS_DIR = "attachments"
_DIR_MODE = 0o700
_SHA256 = re.compile(r"[0-9a-f]{64}")


def is_sha256(value: object) -> bool:
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


@runtime_checkable
class AttachmentFiles(Protocol):
    """Where a store keeps its sessions' files: :class:`AttachmentStore` (files beside the
    transcripts) or the PostgreSQL store's table. A store offers one as ``.attachments``."""

    def put(self, user: str, session_key: str, data: bytes) -> str:
        """Store ``data`` (once per session); its SHA-256."""
        ...

    def get(self, user: str, session_key: str, sha256: str) -> bytes:
        """The bytes; InvalidSessionInput (``sha256``) when the session holds no such file."""
        ...


class AttachmentStore:
    """The attachment files of every session under ``<data_dir>/attachments``."""

    def __init__(self, data_dir: Path, min_free_bytes: int, file_io: FileIO | None = None) -> None:
        self.root = Path(data_dir) / ATTACHMENTS_DIR
        self._floor = min_free_bytes
        self._io = file_io if file_io is not None else FileIO()

    def _dir(self, user: str, session_key: str) -> Path:
        return self.root / check_user(user) / check_session_key(session_key)

    def _make_dirs(self, path: Path) -> None:
        for d in (self.root, path.parent, path):
            try:
                d.mkdir(mode=_DIR_MODE)
            except FileExistsError:
                if d.is_symlink() or not d.is_dir():
                    raise StorageError(f"refusing to store attachments through {d.name!r}: "
                                       "not a directory") from None
            except OSError as err:
                raise StorageError(describe_os_error(err, "creating the attachments directory"),
                                   errno=err.errno) from err

    def put(self, user: str, session_key: str, data: bytes) -> str:
        """Store ``data`` (once per session) and return its SHA-256; StorageError (ENOSPC)
        before anything is written when it would leave less than the free-disk floor."""
        sha = hashlib.sha256(data).hexdigest()
        folder = self._dir(user, session_key)
        final = folder / sha
        if final.is_file() and not final.is_symlink():
            return sha  # content-addressed: the same bytes are already there
        # The floor as for a transcript line, with the file's own size on top: a 10 MiB file
        # must not be what takes the disk below it.
        check_free_space(self.root.parent, self._floor + len(data) if self._floor > 0 else 0)
        self._make_dirs(folder)
        tmp = folder / f".{sha}.{secrets.token_hex(4)}.tmp"
        try:
            fd = open_no_links(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, what="the attachment")
        except OSError as err:
            raise StorageError(describe_os_error(err, "writing an attachment"),
                               errno=err.errno) from err
        try:
            append_whole_line(self._io, fd, data, 0, "writing an attachment")
            self._io.fsync(fd)
        except (StorageError, OSError) as err:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            if isinstance(err, StorageError):
                raise
            raise StorageError(describe_os_error(err, "syncing an attachment"),
                               errno=err.errno) from err
        os.close(fd)
        try:
            os.replace(tmp, final)
        except OSError as err:
            tmp.unlink(missing_ok=True)
            raise StorageError(describe_os_error(err, "storing an attachment"),
                               errno=err.errno) from err
        fsync_path(self._io, folder)
        return sha

    def get(self, user: str, session_key: str, sha256: str) -> bytes:
        """The stored bytes; InvalidSessionInput (field ``sha256``) when the session has no such
        file."""
        if not is_sha256(sha256):
            raise InvalidSessionInput("sha256", "must be 64 lowercase hex digits")
        path = self._dir(user, session_key) / sha256
        try:
            fd = open_no_links(path, os.O_RDONLY, what="the attachment")
        except FileNotFoundError:
            raise InvalidSessionInput("sha256", "is not an attachment of this session") from None
        except OSError as err:
            raise StorageError(describe_os_error(err, "reading an attachment"),
                               errno=err.errno) from err
        with os.fdopen(fd, "rb") as fh:
            return fh.read()

    def delete_session(self, user: str, session_key: str) -> None:
        """Remove every file of the session (nothing to do when it has none)."""
        try:
            shutil.rmtree(self._dir(user, session_key))
        except FileNotFoundError:
            return
        except SessionNotFound:
            return
        except OSError as err:
            if err.errno == errno_codes.ENOENT:
                return
            raise StorageError(describe_os_error(err, "deleting attachments"),
                               errno=err.errno) from err

    def keep_only(self, user: str, session_key: str, keep: Collection[str]) -> int:
        """Remove the session's files whose hash is not in ``keep`` (after messages were
        forgotten for real); returns how many went."""
        folder = self._dir(user, session_key)
        removed = 0
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            return 0
        for entry in entries:
            if entry.name not in keep:
                try:
                    os.unlink(entry.path)
                    removed += 1
                except FileNotFoundError:
                    pass
        return removed


def attachment_hashes(transcript: bytes) -> set[str]:
    """The hashes the message lines of a transcript's bytes name in ``attachments``."""
    found: set[str] = set()
    for raw in transcript.splitlines():
        if b'"attachments"' not in raw:
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        items = obj.get("attachments") if isinstance(obj, dict) else None
        for item in items if isinstance(items, list) else ():
            if isinstance(item, dict) and is_sha256(item.get("sha256")):
                found.add(item["sha256"])
    return found
