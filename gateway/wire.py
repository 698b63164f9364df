"""The wire's shapes, as TypedDicts, and the one place values of ``sessions``/``memory``
become them.

Values stay dataclasses (``Session``, ``Message``, ``Fact``, ``SearchHit``) until a handler
returns; the functions here turn each into its camelCase wire dict once, at the edge, so the
libraries never know the wire's casing. Each method's own result shape is a TypedDict beside its
handler in ``gateway/methods/``; ``rpc.discover`` publishes the schemas generated from both.
Keys are camelCase because they are the wire's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, NotRequired, TypedDict, cast

from memory import Episode, Fact, FactAction, FactChange, SearchHit, SearchResponse
from sessions import ConversationSummary, Message, Session

__all__ = [
    "PROTOCOL_VERSION",
    "AttachmentWire",
    "ChatDelta",
    "ChatEventBase",
    "EpisodeWire",
    "ErrorObject",
    "FactChangeWire",
    "FactWire",
    "LiveRun",
    "MemoryHealth",
    "MessageWire",
    "RecalledRef",
    "SearchHitWire",
    "SearchWire",
    "ServerInfo",
    "SessionDetailWire",
    "SessionWire",
    "SummaryWire",
    "VersionsWire",
    "episode_wire",
    "fact_change_wire",
    "fact_wire",
    "message_wire",
    "recalled_refs",
    "search_wire",
    "server_info",
    "session_wire",
    "summary_wire",
]

PROTOCOL_VERSION = 1


class ServerInfo(TypedDict):
    name: Literal["recalld"]
    version: str
    protocol: int


def server_info(version: str) -> ServerInfo:
    """What the auth frame's answer and the ``auth`` method say about this server."""
    return {"name": "recalld", "version": version, "protocol": PROTOCOL_VERSION}


class ErrorObject(TypedDict, total=False):
    code: int
    message: str
    data: Any
    retryable: bool  # chat.error's error object adds it (docs/protocol.md)


class ChatEventBase(TypedDict):
    """What every ``chat.*`` event carries."""

    sessionKey: str
    runId: str
    seq: int


class ChatDelta(ChatEventBase):
    """``chat.delta``: the next piece of the reply's text."""

    delta: str


class MemoryHealth(TypedDict, total=False):
    """``gateway.health.memory``: cheap, no database query."""

    enabled: bool
    provider: str
    model: str | None  # the active embedder's model, None without one
    embedderReason: str  # why this embedder (or none) is active
    syncCount: int


class LiveRun(TypedDict):
    """The reply a session is streaming now (``sessions.subscribe``'s ``runs``)."""

    runId: str
    seq: int  # the last event's seq, -1 before the first
    text: str  # every delta published so far


class SessionWire(TypedDict):
    """A session's metadata (``sessions.get/list/update``, ``sessions.created/updated``); ``user``
    stays server-side."""

    sessionKey: str
    title: str
    createdAt: str
    updatedAt: str
    messageCount: int
    systemPrompt: NotRequired[str]
    model: NotRequired[str]
    memory: NotRequired[bool]  # only ever false: an incognito session
    temperature: NotRequired[float]  # chosen by sessions.update; absent: the endpoint's default
    maxTokens: NotRequired[int]


def session_wire(s: Session) -> SessionWire:
    wire: SessionWire = {
        "sessionKey": s.session_key,
        "title": s.title,
        "createdAt": s.created_at,
        "updatedAt": s.updated_at,
        "messageCount": s.message_count,
    }
    if s.system_prompt is not None:
        wire["systemPrompt"] = s.system_prompt
    if s.model is not None:
        wire["model"] = s.model
    if not s.memory:
        wire["memory"] = False
    if s.temperature is not None:
        wire["temperature"] = s.temperature
    if s.max_tokens is not None:
        wire["maxTokens"] = s.max_tokens
    return wire


class SummaryWire(TypedDict):
    """A session's conversation summary: what left the prompt's history window, as the
    session's model summarised it (``sessions.get``, ``sessions.history``'s newest page)."""

    text: str
    through: str  # the id of the last message it covers
    messages: int  # how many messages it covers
    ts: str


def summary_wire(s: ConversationSummary) -> SummaryWire:
    return {"text": s.content, "through": s.through, "messages": s.messages, "ts": s.ts}


class SessionDetailWire(SessionWire):
    """``sessions.get``: the session's metadata and, when it has one, its conversation summary."""

    summary: NotRequired[SummaryWire]


class RecalledRef(TypedDict):
    """One chunk recall put into a reply's prompt, as its assistant line keeps it: where to find
    the excerpt again (``memory.search``'s ``chunkId``, or its session and lines), never
    its text."""

    chunkId: int
    sessionKey: str
    lineStart: int
    lineEnd: int
    startTs: str | None


def recalled_refs(hits: Sequence[SearchHit]) -> list[RecalledRef]:
    return [{"chunkId": h.chunk_id, "sessionKey": h.session_key, "lineStart": h.line_start,
             "lineEnd": h.line_end, "startTs": h.start_ts} for h in hits]


class MessageWire(TypedDict):
    """A transcript message (``sessions.history``, ``chat.final``). Besides the keys named here, a
    line keeps any other key it was written or imported with (``Message.extra``)."""

    id: str
    role: str
    content: str
    ts: str
    runId: NotRequired[str]
    name: NotRequired[str]
    model: NotRequired[str]  # the keys below are the ones chat runs write on an assistant line
    usage: NotRequired[dict[str, Any]]
    finishReason: NotRequired[str]
    aborted: NotRequired[bool]
    failed: NotRequired[bool]
    error: NotRequired[str]
    recalled: NotRequired[list[RecalledRef]]  # what recall put into this reply's prompt
    replaces: NotRequired[str]  # the id of the message this one supersedes (regenerate, edit)
    continues: NotRequired[str]  # chat.continue: the cut reply this one carries on (and replaces)
    restores: NotRequired[str]  # chat.choose: the version this line
                                # is a copy of (made current again)
    versions: NotRequired[VersionsWire]  # sessions.history: when its place has several versions
    attachments: NotRequired[list[AttachmentWire]]  # a user message's files (chat.send attachments)


class AttachmentWire(TypedDict):
    """A file sent with a user message: its metadata (the bytes: sessions.attachment)."""

    name: str
    mediaType: str
    sha256: str
    bytes: int
    text: NotRequired[str]  # a text file's or a PDF's text as the model is given it (bounded)


class VersionsWire(TypedDict):
    """Where a shown message stands among the versions of its place (regenerate, edit)."""

    index: int  # from 1: which of them is shown
    count: int
    ids: list[str]  # each version's id, oldest first (what chat.choose and sessions.versions take)


def message_wire(m: Message) -> MessageWire:
    wire: dict[str, Any] = {"id": m.id, "role": m.role, "content": m.content, "ts": m.ts}
    if m.run_id is not None:
        wire["runId"] = m.run_id
    if m.name is not None:
        wire["name"] = m.name
    wire.update(m.extra)
    return cast(MessageWire, wire)  # extra's keys are the line's own, checked when it was written


class FactWire(TypedDict):
    """A fact (``memory.facts.*``, ``chat.final``'s ``facts``, ``recalld facts --json``)."""

    id: int
    text: str
    active: bool
    source: str
    client: str | None  # the client token it was saved through ("claude"); null: the user's own
    createdAt: str
    updatedAt: str
    replaces: NotRequired[int]  # the version this one replaced
    sessionKey: NotRequired[str]  # the session it was saved from


def fact_wire(f: Fact) -> FactWire:
    out: FactWire = {"id": f.id, "text": f.text, "active": f.active, "source": f.source,
                     "client": f.client, "createdAt": f.created_at, "updatedAt": f.updated_at}
    if f.previous_id is not None:
        out["replaces"] = f.previous_id
    if f.session_key:
        out["sessionKey"] = f.session_key
    return out


class FactChangeWire(TypedDict):
    action: FactAction
    fact: FactWire
    previousId: NotRequired[int]
    similarity: NotRequired[float]


def fact_change_wire(c: FactChange) -> FactChangeWire:
    out: FactChangeWire = {"action": c.action, "fact": fact_wire(c.fact)}
    if c.previous_id is not None:
        out["previousId"] = c.previous_id
    if c.similarity is not None:
        out["similarity"] = round(c.similarity, 4)
    return out


class EpisodeWire(TypedDict):
    """An episode (``memory.episodes.list``)."""

    id: int
    sessionKey: str
    text: str
    theme: str
    date: str
    week: str
    year: int
    merges: int


def episode_wire(e: Episode) -> EpisodeWire:
    return {"id": e.id, "sessionKey": e.session_key, "text": e.text, "theme": e.theme,
            "date": e.day, "week": e.week, "year": e.year, "merges": e.merges}


class SearchHitWire(TypedDict):
    """A chunk among ``memory.search``'s results."""

    chunkId: int
    sessionKey: str
    content: str
    score: float
    lineStart: int
    lineEnd: int
    startTs: str | None
    endTs: str | None
    keywordRank: NotRequired[int]
    vectorRank: NotRequired[int]
    similarity: NotRequired[float]


def _hit_wire(h: SearchHit) -> SearchHitWire:
    out: SearchHitWire = {
        "chunkId": h.chunk_id, "sessionKey": h.session_key, "content": h.content,
        "score": h.score, "lineStart": h.line_start, "lineEnd": h.line_end,
        "startTs": h.start_ts, "endTs": h.end_ts,
    }
    if h.keyword_rank is not None:
        out["keywordRank"] = h.keyword_rank
    if h.vector_rank is not None:
        out["vectorRank"] = h.vector_rank
    if h.similarity is not None:
        out["similarity"] = round(h.similarity, 4)
    return out


class SearchWire(TypedDict):
    """A chunk search as ``memory.search`` and ``recalld memory search --json`` show it."""

    results: list[SearchHitWire]
    mode: str  # the mode actually run
    fallbackReason: NotRequired[str]
    previousModel: NotRequired[str]  # during a rebuild: the model whose
                                     # vectors ranked the vector leg


def search_wire(r: SearchResponse) -> SearchWire:
    out: SearchWire = {"results": [_hit_wire(h) for h in r.results], "mode": r.mode}
    if r.fallback_reason:
        out["fallbackReason"] = r.fallback_reason
    if r.previous_model:
        out["previousModel"] = r.previous_model
    return out
