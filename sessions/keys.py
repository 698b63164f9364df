"""Names that reach the file system (session keys, user names) and the opaque page cursors.

Every key and user name is checked against a strict pattern *before* any path is built, so a
value such as ``../../etc/passwd`` never reaches ``open``. A malformed session key raises the
same :class:`SessionNotFound` as an unknown one: a client learns nothing from the difference.

Cursors are URL-safe base64 of a short tagged string. They are opaque to clients (the format
may change) but validated strictly on the way back in, since they come from the network.
"""

from __future__ import annotations

import base64
import binascii
import re
import uuid

from .errors import InvalidSessionInput, SessionNotFound

__all__ = [
    "check_session_key",
    "check_user",
    "decode_history_cursor",
    "decode_list_cursor",
    "encode_history_cursor",
    "encode_list_cursor",
    "is_session_key",
    "is_user_name",
    "new_message_id",
    "new_session_key",
]

# uuid4().hex: 122 random bits, lower-case, no separators, safe as a file name.
_SESSION_KEY_RE = re.compile(r"[0-9a-f]{32}")
_USER_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# The one timestamp shape models.format_ts writes; anything else in a cursor was not ours.
_TS_RE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z")
# A cursor is a few dozen bytes; refuse to even decode anything much longer.
_MAX_CURSOR_CHARS = 200


def new_session_key() -> str:
    """A fresh, unguessable session key."""
    return uuid.uuid4().hex


def new_message_id() -> str:
    """A fresh message id (unique; ordering comes from the line's position, not the id)."""
    return uuid.uuid4().hex


def is_session_key(value: object) -> bool:
    return isinstance(value, str) and _SESSION_KEY_RE.fullmatch(value) is not None


def is_user_name(value: object) -> bool:
    return (
        isinstance(value, str)
        and _USER_RE.fullmatch(value) is not None
        and value not in (".", "..")
    )


def check_session_key(value: object) -> str:
    """``value`` if it is a well-formed key; otherwise the same error as an unknown key."""
    if not is_session_key(value):
        raise SessionNotFound()
    assert isinstance(value, str)
    return value


def check_user(value: object) -> str:
    """``value`` if it is an acceptable user name (it becomes a directory name)."""
    if not is_user_name(value):
        raise InvalidSessionInput(
            "user", "must be 1-64 characters from A-Z a-z 0-9 _ . - and not '.' or '..'"
        )
    assert isinstance(value, str)
    return value


def _encode(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode("ascii")).rstrip(b"=").decode("ascii")


def _decode(cursor: object) -> str:
    bad = InvalidSessionInput("before", "is not a cursor returned by this server")
    if not isinstance(cursor, str) or not 0 < len(cursor) <= _MAX_CURSOR_CHARS:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        return raw.decode("ascii")
    except (binascii.Error, ValueError):
        raise bad from None


def encode_list_cursor(updated_at: str, session_key: str) -> str:
    """Cursor for ``list``: the sort key of the last session on the page."""
    return _encode(f"s|{updated_at}|{session_key}")


def decode_list_cursor(cursor: object) -> tuple[str, str]:
    """``(updated_at, session_key)`` from a list cursor; InvalidSessionInput(field="before")."""
    parts = _decode(cursor).split("|")
    if (
        len(parts) != 3
        or parts[0] != "s"
        or _TS_RE.fullmatch(parts[1]) is None
        or not is_session_key(parts[2])
    ):
        raise InvalidSessionInput("before", "is not a cursor returned by this server")
    return parts[1], parts[2]


def encode_history_cursor(session_key: str, offset: int) -> str:
    """Cursor for ``history``: byte offset of the oldest line on the page, tied to its session."""
    return _encode(f"m|{session_key}|{offset}")


def decode_history_cursor(cursor: object, session_key: str) -> int:
    """The byte offset in a history cursor issued for ``session_key``."""
    parts = _decode(cursor).split("|")
    if (
        len(parts) != 3
        or parts[0] != "m"
        or parts[1] != session_key
        or not parts[2].isdigit()
        or len(parts[2]) > 18
    ):
        raise InvalidSessionInput("before", "is not a cursor returned by this server")
    return int(parts[2])
