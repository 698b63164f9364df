"""Checks on caller-supplied values, each failing with :class:`InvalidSessionInput`.

The gateway validates its params against schemas too, but the store is also called by the CLI
and the benchmark harness, so it trusts nobody: every value that ends up in a transcript line
is checked here, and ``field`` is the wire (camelCase) name so the error reads naturally on the
wire.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

import orjson

from .config import SessionsConfig
from .errors import InvalidSessionInput, LineTooLarge
from .keys import new_message_id
from .models import MESSAGE_ROLES, RESERVED_LINE_KEYS, ConversationSummary, Message, now_ts, to_ts
from .transcript import UPDATE_TYPE, Header

__all__ = [
    "CLEARABLE",
    "DEFAULT_TITLE",
    "build_header",
    "build_message",
    "build_summary",
    "build_update",
    "check_content",
    "check_extra",
    "check_limit",
    "check_max_tokens",
    "check_model",
    "check_name",
    "check_role",
    "check_run_id",
    "check_system_prompt",
    "check_temperature",
    "check_title",
    "check_ts",
    "plain_title",
]

DEFAULT_TITLE = "New session"
# The session settings sessions.update can set back to the default (wire names, as on the line).
CLEARABLE = ("model", "temperature", "maxTokens")
# Run ids come from the gateway (uuid hex); anything this long is not one.
_MAX_RUN_ID_CHARS = 200
# C0 and C1 control characters (NUL, ESC, BEL, newline, …): a title is one line of plain text,
# shown in sidebars and terminals, where an escape sequence would act instead of showing.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


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
    if value is None:
        return DEFAULT_TITLE
    title = _check_text("title", value, config.max_title_chars)
    if _CONTROL.search(title):
        raise InvalidSessionInput("title", "must not contain control characters (U+0000-U+001F, "
                                           "U+007F-U+009F)")
    return title


def plain_title(text: str) -> str | None:
    """``text`` as a title :func:`check_title` accepts, for writers that clean rather than refuse
    (an import, a title made from a message): control characters become spaces, runs of spaces
    one; None when nothing is left."""
    return " ".join(_CONTROL.sub(" ", text).split()) or None


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


def build_header(
    user: str,
    *,
    session_key: str,
    title: object,
    system_prompt: object,
    model: object,
    created_at: object,
    config: SessionsConfig,
    memory: bool = True,
) -> tuple[Header, bytes]:
    """A checked header for a new session (its key made by the store) and its serialised line
    (size checked too)."""
    header = Header(
        session_key=session_key,
        user=user,
        created_at=check_ts(created_at, "createdAt"),
        title=check_title(title, config),
        system_prompt=check_system_prompt(system_prompt),
        model=check_model(model, config),
        memory=memory is not False,
    )
    line = orjson.dumps(header.to_line()) + b"\n"
    if len(line) > config.max_line_bytes:
        # Only the system prompt can make a header this big.
        raise LineTooLarge(len(line), config.max_line_bytes, field="systemPrompt")
    return header, line


def build_message(
    *,
    role: object,
    content: object,
    run_id: object,
    name: object,
    ts: object,
    extra: object,
    config: SessionsConfig,
) -> tuple[Message, bytes]:
    """A checked message and its serialised line; LineTooLarge before anything is written."""
    message = Message(
        id=new_message_id(),
        role=check_role(role),
        content=check_content(content),
        ts=check_ts(ts),
        run_id=check_run_id(run_id),
        name=check_name(name, config),
        extra=check_extra(extra),
    )
    try:
        line = orjson.dumps(message.to_line()) + b"\n"
    except orjson.JSONEncodeError:
        # Every other field is a checked str, so the culprit is inside extra.
        raise InvalidSessionInput("extra", "must hold only JSON values") from None
    if len(line) > config.max_line_bytes:
        raise LineTooLarge(len(line), config.max_line_bytes)
    return message, line


def build_summary(*, content: object, through: object, messages: object,
                  config: SessionsConfig) -> tuple[ConversationSummary, bytes]:
    """A checked conversation summary and its serialised line; LineTooLarge before anything is
    written. ``through`` is the id of the last message it covers, ``messages`` how many."""
    if isinstance(messages, bool) or not isinstance(messages, int) or messages < 1:
        raise InvalidSessionInput("messages", "must be a positive integer")
    summary = ConversationSummary(
        id=new_message_id(),
        content=check_content(content),
        ts=now_ts(),
        through=_check_text("through", through, _MAX_RUN_ID_CHARS),
        messages=messages,
    )
    line = orjson.dumps(summary.to_line()) + b"\n"
    if len(line) > config.max_line_bytes:
        raise LineTooLarge(len(line), config.max_line_bytes, field="content")
    return summary, line


def check_temperature(value: object) -> float | None:
    """A finite number from 0 (the operator's upper bound is the gateway's, llm.max_temperature)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1e6:
        raise InvalidSessionInput("temperature", "must be a number from 0")
    return float(value)


def check_max_tokens(value: object) -> int | None:
    """A positive integer (the operator's bound is the gateway's, llm.max_tokens_limit)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31 - 1:
        raise InvalidSessionInput("maxTokens", "must be a positive integer")
    return value


def build_update(
    header: Header, *, title: object, system_prompt: object, config: SessionsConfig,
    model: object = None, temperature: object = None, max_tokens: object = None,
    clear: Collection[str] = (),
) -> tuple[Header, bytes]:
    """The header after a ``sessions.update`` and the ``update`` line that records it.

    ``None`` leaves a field as it is; an empty ``system_prompt`` clears the prompt's effect;
    ``clear`` names fields (of :data:`CLEARABLE`) set back to the default, written as ``null``.
    """
    unknown = set(clear) - set(CLEARABLE)
    if unknown:
        raise InvalidSessionInput("clear", f"may name only {', '.join(CLEARABLE)}")
    given = (title, system_prompt, model, temperature, max_tokens)
    if all(v is None for v in given) and not clear:
        raise InvalidSessionInput("title", "give a title, a systemPrompt, a model, a temperature "
                                           "or maxTokens")
    line_obj: dict[str, Any] = {"type": UPDATE_TYPE, "ts": now_ts()}
    if title is not None:
        line_obj["title"] = check_title(title, config)
    if system_prompt is not None:
        line_obj["systemPrompt"] = check_system_prompt(system_prompt)
    for wire, value in (("model", check_model(model, config)),
                        ("temperature", check_temperature(temperature)),
                        ("maxTokens", check_max_tokens(max_tokens))):
        if wire in clear and value is not None:
            raise InvalidSessionInput(wire, "is both given and cleared")
        if value is not None or wire in clear:
            line_obj[wire] = value
    line = orjson.dumps(line_obj) + b"\n"
    if len(line) > config.max_line_bytes:
        raise LineTooLarge(len(line), config.max_line_bytes, field="systemPrompt")
    return header.updated(line_obj), line
