"""Values the store hands out (:class:`Session`, :class:`Message`, :class:`ConversationSummary`,
the pages :data:`SessionPage` and :data:`MessagePage`) and the timestamp format. Both backends
and :class:`~sessions.protocol.SessionStoreLike` import them from here.

Timestamps everywhere in transcripts, the index and on the wire are ISO-8601 UTC strings with
exactly three fractional digits and a ``Z``: ``2026-11-22T10:00:00.123Z``. The fixed width is
deliberate: such strings sort lexicographically in time order, which the metadata index and the
list cursor rely on, and every JavaScript ``Date`` parses them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, TypeAlias

__all__ = [
    "MESSAGE_ROLES",
    "RESERVED_LINE_KEYS",
    "SUMMARY_TYPE",
    "ConversationSummary",
    "Message",
    "MessagePage",
    "Role",
    "Session",
    "SessionPage",
    "format_ts",
    "now_ts",
    "parse_ts",
    "to_ts",
]

Role = Literal["user", "assistant"]

# New lines may carry only these roles (docs/sessions.md); reading stays lenient so an old or
# hand-edited transcript with another role is shown rather than hidden.
MESSAGE_ROLES: frozenset[str] = frozenset({"user", "assistant"})

# Keys the store writes itself; ``extra`` may not shadow them.
RESERVED_LINE_KEYS: frozenset[str] = frozenset(
    {"type", "id", "role", "content", "ts", "runId", "name"}
)


def format_ts(moment: datetime) -> str:
    """``moment`` as ``YYYY-MM-DDTHH:MM:SS.mmmZ`` in UTC; a naive datetime is taken as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    m = moment.astimezone(UTC)
    # Built by hand rather than strftime: %Y does not zero-pad years below 1000 on glibc, and
    # the fixed width is what keeps the strings sortable.
    return (
        f"{m.year:04d}-{m.month:02d}-{m.day:02d}T"
        f"{m.hour:02d}:{m.minute:02d}:{m.second:02d}.{m.microsecond // 1000:03d}Z"
    )


def now_ts() -> str:
    """The current time in the transcript format."""
    return format_ts(datetime.now(UTC))


def parse_ts(text: str) -> datetime:
    """Parse any ISO-8601 string (``Z`` or an offset; naive means UTC); ValueError if not one."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC)


def to_ts(value: datetime | str) -> str:
    """Normalise a datetime or an ISO-8601 string to the transcript format (ValueError if bad)."""
    if isinstance(value, datetime):
        return format_ts(value)
    if isinstance(value, str):
        return format_ts(parse_ts(value))
    raise ValueError("must be an ISO-8601 string or a datetime")


@dataclass(frozen=True, slots=True)
class Session:
    """One session's metadata as the index knows it."""

    session_key: str
    user: str
    title: str
    created_at: str
    updated_at: str
    message_count: int
    system_prompt: str | None = None
    model: str | None = None
    memory: bool = True  # False: incognito (the transcript's header says so)
    # Sampling the session chose (sessions.update); None: the endpoint's default, none sent.
    temperature: float | None = None
    max_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """One ``"type":"message"`` transcript line.

    ``extra`` holds every other key of the line as written (``model``, ``usage``,
    ``finishReason``, ``aborted``, ``failed``…), already in wire casing.
    """

    id: str
    role: str
    content: str
    ts: str
    run_id: str | None
    name: str | None = None
    # Excluded from hashing: a dict is not hashable, and equality still compares it.
    extra: dict[str, Any] = field(default_factory=dict, hash=False)

    def to_line(self) -> dict[str, Any]:
        """The transcript line as a dict, keys in the documented order (docs/sessions.md)."""
        line: dict[str, Any] = {
            "type": "message",
            "id": self.id,
            "role": self.role,
            "content": self.content,
            "ts": self.ts,
            "runId": self.run_id,
        }
        if self.name is not None:
            line["name"] = self.name
        line.update(self.extra)
        return line

    @classmethod
    def from_line(cls, obj: Mapping[str, Any]) -> Message | None:
        """The message a parsed line holds, or None when it is not a well-formed message line."""
        if obj.get("type") != "message":
            return None
        msg_id, role, content, ts = (obj.get("id"), obj.get("role"), obj.get("content"),
                                     obj.get("ts"))
        run_id, name = obj.get("runId"), obj.get("name")
        if not (
            isinstance(msg_id, str)
            and isinstance(role, str)
            and isinstance(content, str)
            and isinstance(ts, str)
            and (run_id is None or isinstance(run_id, str))
            and (name is None or isinstance(name, str))
        ):
            return None
        extra = {k: v for k, v in obj.items() if k not in RESERVED_LINE_KEYS}
        return cls(msg_id, role, content, ts, run_id, name, extra)


# The line type of a conversation summary (docs/sessions.md, "Conversation summaries").
SUMMARY_TYPE = "summary"


@dataclass(frozen=True, slots=True)
class ConversationSummary:
    """One ``"type":"summary"`` line: what the session's model wrote about the messages that
    left the prompt's history window, from the first up to ``through`` (a message id),
    ``messages`` of them. The newest supersedes every earlier one; it is not a message."""

    id: str
    content: str
    ts: str
    through: str
    messages: int

    def to_line(self) -> dict[str, Any]:
        return {"type": SUMMARY_TYPE, "id": self.id, "ts": self.ts, "content": self.content,
                "through": self.through, "messages": self.messages}

    @classmethod
    def from_line(cls, obj: Mapping[str, Any]) -> ConversationSummary | None:
        """The summary a parsed line holds, or None when it is not a well-formed summary line."""
        if obj.get("type") != SUMMARY_TYPE:
            return None
        sid, content, ts, through, count = (obj.get("id"), obj.get("content"), obj.get("ts"),
                                            obj.get("through"), obj.get("messages"))
        if not (isinstance(sid, str) and isinstance(content, str) and isinstance(ts, str)
                and isinstance(through, str) and isinstance(count, int)
                and not isinstance(count, bool)):
            return None
        return cls(sid, content, ts, through, count)


# One page of a listing and its next cursor (None on the last page), as every backend returns it.
SessionPage: TypeAlias = "tuple[list[Session], str | None]"
MessagePage: TypeAlias = "tuple[list[Message], str | None]"
