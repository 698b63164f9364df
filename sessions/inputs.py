"""Checks on caller-supplied values, each failing with :class:`InvalidSessionInput`.

The gateway validates its params against schemas too, but the store is also called by the CLI
and the benchmark harness, so it trusts nobody: every value that ends up in a transcript line
is checked here, and ``field`` is the wire (camelCase) name so the error reads naturally on the
wire.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from .config import SessionsConfig
from .errors import InvalidSessionInput
from .models import MESSAGE_ROLES, RESERVED_LINE_KEYS, now_ts, to_ts

__all__ = [
    "DEFAULT_TITLE",
    "check_content",
    "check_extra",
    "check_limit",
    "check_model",
    "check_name",
    "check_role",
    "check_run_id",
    "check_system_prompt",
    "check_title",
    "check_ts",
]

DEFAULT_TITLE = "New session"
# Run ids come from the gateway (uuid hex); anything this long is not one.
_MAX_RUN_ID_CHARS = 200


def _check_text(field: str, value: object, max_chars: int) -> str:
    if not isinstance(value, str):
        raise InvalidSessionInput(field, "must be a string")
    if not value.strip():
        raise InvalidSessionInput(field, "must not be blank")
    if len(value) > max_chars:
        raise InvalidSessionInput(field, f"must be at most {max_chars} characters")
    _check_encodable(field, value)
    return value


def _check_encodable(field: str, value: str) -> None:
    # A lone surrogate (possible in a Python str, never in UTF-8) would make the line unwritable.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidSessionInput(field, "is not valid Unicode text") from None


def check_title(value: object, config: SessionsConfig) -> str:
    return DEFAULT_TITLE if value is None else _check_text("title", value, config.max_title_chars)


def check_model(value: object, config: SessionsConfig) -> str | None:
    return None if value is None else _check_text("model", value, config.max_model_chars)


def check_name(value: object, config: SessionsConfig) -> str | None:
    return None if value is None else _check_text("name", value, config.max_name_chars)


def check_run_id(value: object) -> str | None:
    return None if value is None else _check_text("runId", value, _MAX_RUN_ID_CHARS)


def check_system_prompt(value: object) -> str | None:
    """Any string (even empty); its size is bounded by ``max_line_bytes`` with the header."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidSessionInput("systemPrompt", "must be a string")
    _check_encodable("systemPrompt", value)
    return value


def check_role(value: object) -> str:
    if not isinstance(value, str) or value not in MESSAGE_ROLES:
        raise InvalidSessionInput("role", f"must be one of {', '.join(sorted(MESSAGE_ROLES))}")
    return value


def check_content(value: object) -> str:
    """Any string, empty included (an aborted reply may have produced nothing)."""
    if not isinstance(value, str):
        raise InvalidSessionInput("content", "must be a string")
    _check_encodable("content", value)
    return value


def check_ts(value: object, field: str = "ts") -> str:
    """``None`` means now; a datetime or ISO-8601 string is normalised (naive means UTC)."""
    if value is None:
        return now_ts()
    if not isinstance(value, (str, datetime)):
        raise InvalidSessionInput(field, "must be an ISO-8601 date-time")
    try:
        return to_ts(value)
    except (ValueError, OverflowError):
        raise InvalidSessionInput(field, "must be an ISO-8601 date-time") from None


def check_extra(value: object) -> dict[str, Any]:
    """Extra keys for a message line; they may not shadow the keys the store writes."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidSessionInput("extra", "must be an object")
    extra: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise InvalidSessionInput("extra", "keys must be strings")
        if key in RESERVED_LINE_KEYS:
            raise InvalidSessionInput("extra", f"key {key!r} is written by the store itself")
        extra[key] = item
    return extra


def check_limit(value: object, config: SessionsConfig, field: str = "limit") -> int:
    # bool is an int subclass; `limit=True` is a bug in the caller, not a page size of 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSessionInput(field, f"must be an integer from 1 to {config.max_page_size}")
    if not 1 <= value <= config.max_page_size:
        raise InvalidSessionInput(field, f"must be an integer from 1 to {config.max_page_size}")
    return value
