"""The sessions package's exceptions.

Tree::

    SessionError                 meaning
    ├── SessionNotFound          unknown key, another user's key, or a malformed key
    ├── InvalidSessionInput      a caller-supplied value is wrong; ``field`` names it
    │   └── LineTooLarge         the line would exceed ``sessions.max_line_bytes``
    └── StorageError             the disk failed (ENOSPC, EIO, short write, index I/O)
        └── UnsafePath           a symlink (or not a regular file) where the store keeps its own

This package knows nothing of JSON-RPC: the gateway's one error map (``gateway.errors``) turns
each class into a wire error, so the mapping lives in one place and this package stays
transport-free.

Messages are written for the person at the other end of the wire: they say what happened and
never include file-system paths, other users' data, or whether a key exists for someone else.
"""

from __future__ import annotations

import errno as errno_codes

__all__ = [
    "InvalidSessionInput",
    "LineTooLarge",
    "SessionError",
    "SessionNotFound",
    "StorageError",
    "UnsafePath",
]


class SessionError(Exception):
    """Root of every error this package raises on purpose."""


    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SessionNotFound(SessionError):
    """No session under this key for this user.

    Raised with one fixed message for an unknown key, another user's key, a key that is not
    even well-formed (``../../etc/passwd``) and a transcript whose header cannot be read, so a
    caller can never learn which of those it was.
    """

    MESSAGE = "session not found"

    def __init__(self) -> None:
        super().__init__(self.MESSAGE)


class InvalidSessionInput(SessionError):
    """A value passed by the caller is unacceptable; ``field`` uses the wire (camelCase) name."""


    def __init__(self, field: str, reason: str) -> None:
        # The gateway builds "invalid params: <field>: <message>", so the message is the
        # reason alone.
        super().__init__(reason)
        self.field = field
        self.reason = reason


class LineTooLarge(InvalidSessionInput):
    """The serialised transcript line would be larger than ``sessions.max_line_bytes``.

    Raised before anything is written, so the transcript is untouched.
    """

    def __init__(self, size: int, limit: int, field: str = "message") -> None:
        super().__init__(
            field,
            f"transcript line would be {size} bytes, more than sessions.max_line_bytes ({limit})",
        )
        self.size = size
        self.limit = limit


class StorageError(SessionError):
    """The disk refused a write or a read; the transcript was left valid and the store usable.

    ``errno`` carries the OS error number when there was one (``errno.ENOSPC``, ``errno.EIO``).
    """


    def __init__(self, message: str, *, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class SchemaTooNew(StorageError):
    """The database records a migration newer than the newest this version knows: a newer
    recalld migrated it, and this one would read the changed tables wrongly. Not retryable;
    the node is upgraded (docs/scaling.md, "Upgrading the nodes")."""


class UnsafePath(StorageError):
    """A symbolic link, or something other than a regular file (a directory for a user's
    directory), where the store keeps its own file: refused, never followed.

    Only someone with write access to the data dir can plant one, so it is not retryable; the
    message names what was refused (never the path, which would tell where the data dir is).
    """

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what} is a symbolic link or not a regular file: refused, links in the data dir "
            "are never followed",
            errno=errno_codes.ELOOP,
        )
        self.what = what
