"""``sessions.*``: create, list, read, update, delete and (un)subscribe, over the
:class:`SessionStoreLike`.

``sessions.watch`` attaches a connection to all of its user's sessions at once: it then hears
``sessions.created`` / ``sessions.updated`` / ``sessions.deleted`` (how a web client's sidebar
stays in step with other tabs). Only watchers hear them: a connection that merely subscribed to
a session keeps receiving nothing but that session's ``chat.*`` events, as before.

Blocking store calls go to a worker thread so the event loop never waits on the disk. Page
sizes and text lengths are bounded by the same ``[sessions]`` settings the store enforces.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, NotRequired, TypedDict

from gateway.chat import ALL_SESSIONS, ChatRuns, Hub, announce
from gateway.config import LlmConfig
from gateway.errors import InvalidParams
from gateway.rpc import Bound, ByteRate, CallContext, Registry, bounded, written_size
from gateway.wire import (
    LiveRun,
    MessageWire,
    SessionDetailWire,
    SessionWire,
    SummaryWire,
    VersionsWire,
    message_wire,
    session_wire,
    summary_wire,
)
from memory import Memory
from sessions import (
    AttachmentFiles,
    ConversationSummary,
    Message,
    SessionsConfig,
    SessionStoreLike,
    Versions,
    read_all,
    visible_history,
    visible_messages,
)

__all__ = ["MAX_KEY", "MAX_SYSTEM_PROMPT_CHARS", "SessionsMethods", "declare_sessions"]

MAX_KEY = 128
MAX_SYSTEM_PROMPT_CHARS = 64 * 1024


@dataclass(frozen=True, slots=True)
class CreateSessionParams:
    title: str | None = None
    system_prompt: str | None = bounded(None, max_len=MAX_SYSTEM_PROMPT_CHARS)
    model: str | None = None
    memory: bool = bounded(True,
                           doc="false: incognito; kept, never indexed, recalled or remembered from")


@dataclass(frozen=True, slots=True)
class ListSessionsParams:
    limit: int = bounded(50, min=1)
    before: str | None = bounded(None, max_len=512, doc="cursor from a previous page's next")


@dataclass(frozen=True, slots=True)
class SessionKeyParams:
    session_key: str = bounded(max_len=MAX_KEY)


@dataclass(frozen=True, slots=True)
class UpdateSessionParams:
    session_key: str = bounded(max_len=MAX_KEY)
    title: str | None = None
    system_prompt: str | None = bounded(None, max_len=MAX_SYSTEM_PROMPT_CHARS,
                                        doc="an empty string clears it")
    model: str | None = bounded(None, doc="one models.list offers; the next run uses it")
    temperature: float | None = bounded(None, min=0,
                                        doc="sent to the model; up to llm.max_temperature")
    max_tokens: int | None = bounded(None, min=1,
                                     doc="the reply's bound in tokens; up to llm.max_tokens_limit")
    clear: tuple[Literal["model", "temperature", "maxTokens"], ...] | None = bounded(
        None, doc="set these back to the operator's default")


@dataclass(frozen=True, slots=True)
class WatchParams:
    pass


@dataclass(frozen=True, slots=True)
class HistoryParams:
    session_key: str = bounded(max_len=MAX_KEY)
    limit: int = bounded(50, min=1)
    before: str | None = bounded(None, max_len=512)


@dataclass(frozen=True, slots=True)
class VersionsParams:
    session_key: str = bounded(max_len=MAX_KEY)
    message_id: str = bounded(max_len=MAX_KEY,
                              doc="any version of the message (sessions.history's id)")


class VersionsReply(TypedDict):
    index: int  # from 1: the version shown now (0: none of them is shown)
    count: int
    versions: list[MessageWire]  # each version's newest line, oldest version first


@dataclass(frozen=True, slots=True)
class AttachmentParams:
    session_key: str = bounded(max_len=MAX_KEY)
    sha256: str = bounded(max_len=64,
                          doc="an attachment's sha256, as sessions.history's message names it")


class AttachmentReply(TypedDict):
    sha256: str
    bytes: int
    data: str  # the file, base64


class CreatedReply(TypedDict):
    sessionKey: str
    title: str
    createdAt: str
    memory: NotRequired[Literal[False]]  # only for an incognito session


class SessionsPageReply(TypedDict):
    sessions: list[SessionWire]  # without systemPrompt (sessions.get has it)
    next: NotRequired[str]  # the cursor for the next page, when there is one


class HistoryReply(TypedDict):
    messages: list[MessageWire]
    next: NotRequired[str]
    summary: NotRequired[SummaryWire]  # on the newest page (no `before`) when the session has one


class DeletedReply(TypedDict):
    deleted: Literal[True]


class WatchingReply(TypedDict):
    watching: Literal[True]


class SubscribedReply(TypedDict):
    subscribed: Literal[True]
    runs: list[LiveRun]  # the reply being streamed now, if any


class UnsubscribedReply(TypedDict):
    unsubscribed: bool


class SessionsMethods:
    def __init__(self, store: SessionStoreLike, hub: Hub, runs: ChatRuns, memory: Memory,
                 models: tuple[str, ...] | None = None,
                 prompt_bytes: ByteRate | None = None) -> None:
        self.store = store
        self.hub = hub
        self.runs = runs  # a deleted session's runs are aborted first
        self.memory = memory  # and its index rows go with it
        # The models a session may choose (LlmConfig.choices); None: any.
        self.models = models
        # quotas.message_bytes_per_minute, shared with chat.send: a system prompt is written to
        # the transcript (again by each update) as a message is, so it spends the same bytes.
        self.prompt_bytes = prompt_bytes

    @contextlib.contextmanager
    def _spending(self, user: str, system_prompt: str | None) -> Iterator[None]:
        rate = self.prompt_bytes
        if rate is None or not system_prompt:
            yield
            return
        with rate.spending(user, written_size(system_prompt)):
            yield

    def _check_offered(self, model: str | None) -> None:
        # sessions.create and sessions.update alike: every request goes out on the operator's key.
        if model is not None and self.models is not None and model not in self.models:
            raise InvalidParams("model", f"not offered here; choose one of {list(self.models)} "
                                "(llm.models, listed by models.list)")

    async def create(self, ctx: CallContext, p: CreateSessionParams) -> CreatedReply:
        self._check_offered(p.model)
        with self._spending(ctx.caller, p.system_prompt):
            session = await asyncio.to_thread(
                self.store.create, ctx.caller, title=p.title, system_prompt=p.system_prompt,
                model=p.model, memory=p.memory,
            )
        self.hub.attach(ctx, ctx.caller, session.session_key)
        wire = session_wire(session)
        announce(self.hub, ctx.caller, session.session_key, "sessions.created", {"session": wire})
        out: CreatedReply = {"sessionKey": wire["sessionKey"], "title": wire["title"],
                             "createdAt": wire["createdAt"]}
        if not session.memory:
            out["memory"] = False
        return out

    async def list(self, ctx: CallContext, p: ListSessionsParams) -> SessionsPageReply:
        sessions, nxt = await asyncio.to_thread(self.store.list, ctx.caller, limit=p.limit,
                                                before=p.before)
        out: SessionsPageReply = {"sessions": [session_wire(s) for s in sessions]}
        if nxt:
            out["next"] = nxt
        return out

    async def get(self, ctx: CallContext, p: SessionKeyParams) -> SessionDetailWire:
        def read() -> SessionDetailWire:
            session = self.store.get(ctx.caller, p.session_key)
            summary = self.store.summary(ctx.caller, p.session_key)
            out: SessionDetailWire = {**session_wire(session)}  # type: ignore[typeddict-item]
            if summary is not None:  # as on sessions.history's newest
                                     # page: the key only when there is one
                out["summary"] = summary_wire(summary)
            return out

        return await asyncio.to_thread(read)

    async def history(self, ctx: CallContext, p: HistoryParams) -> HistoryReply:
        # Superseded messages (a regenerated reply, an edited message and its reply) are left out.
        def read() -> tuple[list[Message], str | None, ConversationSummary | None]:
            messages, nxt = visible_history(self.store, ctx.caller, p.session_key, limit=p.limit,
                                            before=p.before)
            return (messages, nxt,
                    self.store.summary(ctx.caller, p.session_key) if p.before is None else None)

        messages, nxt, summary = await asyncio.to_thread(read)
        out: HistoryReply = {"messages": [message_wire(m) for m in messages]}
        # A shown message of a place with several versions is a later version (``replaces``) or
        # a chosen copy (``restores``), so a page without either costs no whole-transcript read.
        if any("replaces" in m or "restores" in m for m in out["messages"]):
            marks = await asyncio.to_thread(
                lambda: Versions(read_all(self.store, ctx.caller, p.session_key)))
            for wire in out["messages"]:
                mark = marks.mark(wire["id"])
                if mark is not None:
                    wire["versions"] = VersionsWire(index=mark[0], count=mark[1], ids=mark[2])
        if nxt:
            out["next"] = nxt
        if summary is not None:
            out["summary"] = summary_wire(summary)
        return out

    async def versions(self, ctx: CallContext, p: VersionsParams) -> VersionsReply:
        def read() -> VersionsReply:
            store, user = self.store, ctx.caller
            all_lines = read_all(store, user, p.session_key)
            marks = Versions(all_lines)
            if p.message_id not in marks.by_id:
                raise InvalidParams("messageId", "is not a message of this session")
            ids = marks.of(p.message_id)
            shown = {marks.canon(m.id) for m in visible_messages(all_lines)}
            index = next((i + 1 for i, v in enumerate(ids) if v in shown), 0)
            return {"index": index, "count": len(ids),
                    "versions": [message_wire(marks.latest(v)) for v in ids]}

        return await asyncio.to_thread(read)

    async def update(self, ctx: CallContext, p: UpdateSessionParams) -> SessionWire:
        self._check_offered(p.model)
        with self._spending(ctx.caller, p.system_prompt):
            session = await asyncio.to_thread(
                self.store.update, ctx.caller, p.session_key, title=p.title,
                system_prompt=p.system_prompt, model=p.model, temperature=p.temperature,
                max_tokens=p.max_tokens, clear=p.clear or (),
            )
        wire = session_wire(session)
        announce(self.hub, ctx.caller, p.session_key, "sessions.updated", {"session": wire})
        return wire

    async def delete(self, ctx: CallContext, p: SessionKeyParams) -> DeletedReply:
        user = ctx.caller
        await self.runs.abort_session(user, p.session_key)
        await asyncio.to_thread(self.store.delete, user, p.session_key)
        await self.memory.delete_session(user, p.session_key)
        announce(self.hub, user, p.session_key, "sessions.deleted", {})
        return {"deleted": True}

    async def attachment(self, ctx: CallContext, p: AttachmentParams) -> AttachmentReply:
        found = getattr(self.store, "attachments", None)
        if not isinstance(found, AttachmentFiles):
            raise InvalidParams("sha256",
                                "attachments are not kept by this gateway's session store")
        files: AttachmentFiles = found

        def read() -> bytes:
            self.store.get(ctx.caller, p.session_key)  # -32002 if not ours
            return files.get(ctx.caller, p.session_key, p.sha256)

        data = await asyncio.to_thread(read)
        return {"sha256": p.sha256, "bytes": len(data),
                "data": base64.b64encode(data).decode("ascii")}

    async def watch(self, ctx: CallContext, p: WatchParams) -> WatchingReply:
        self.hub.attach(ctx, ctx.caller, ALL_SESSIONS)
        return {"watching": True}

    async def subscribe(self, ctx: CallContext, p: SessionKeyParams) -> SubscribedReply:
        await asyncio.to_thread(self.store.get, ctx.caller, p.session_key)  # not-found check
        # Attach and snapshot with no await between: every event this connection then
        # receives continues the snapshot (its seq is higher), so a client that reconnects
        # mid-reply shows the text so far and keeps streaming, with no gap and no repeat.
        self.hub.attach(ctx, ctx.caller, p.session_key)
        return {"subscribed": True, "runs": self.runs.live_runs(ctx.caller, p.session_key)}

    async def unsubscribe(self, ctx: CallContext, p: SessionKeyParams) -> UnsubscribedReply:
        return {"unsubscribed": self.hub.detach(ctx, ctx.caller, p.session_key)}


def declare_sessions(reg: Registry, config: SessionsConfig, h: SessionsMethods | None,
                     llm: LlmConfig = LlmConfig()) -> None:  # noqa: B008 - frozen, so sharing is safe
    page = {"limit": Bound(max=config.max_page_size)}
    d = reg.declare
    d("sessions.create", CreateSessionParams, "Create a session.", h.create if h else None,
      result=CreatedReply,
      bounds={"title": Bound(max_len=config.max_title_chars),
              "model": Bound(max_len=config.max_model_chars)})
    d("sessions.list", ListSessionsParams, "List your sessions, newest first.",
      h.list if h else None, result=SessionsPageReply, bounds=page)
    d("sessions.get", SessionKeyParams, "One session's metadata and its conversation summary.",
      h.get if h else None, result=SessionDetailWire)
    d("sessions.history", HistoryParams, "Messages of a session, oldest first within a page.",
      h.history if h else None, result=HistoryReply, bounds=page)
    d("sessions.versions", VersionsParams, "Every version of a message (regenerated replies, "
      "edited messages), oldest first; chat.choose makes one current.", h.versions if h else None,
      result=VersionsReply)
    d("sessions.attachment", AttachmentParams, "One file sent with a message of the session "
      "(chat.send attachments), base64.", h.attachment if h else None, result=AttachmentReply,
      writes=False)
    d("sessions.update", UpdateSessionParams, "Change a session's title, system prompt, model, "
      "temperature or maxTokens.", h.update if h else None, result=SessionWire,
      bounds={"title": Bound(max_len=config.max_title_chars),
              "model": Bound(max_len=config.max_model_chars),
              "temperature": Bound(max=llm.max_temperature),
              "maxTokens": Bound(max=llm.max_tokens_limit)})
    d("sessions.watch", WatchParams,
      "Receive sessions.created/updated/deleted for all your sessions.",
      h.watch if h else None, result=WatchingReply, inline=True)
    d("sessions.delete", SessionKeyParams, "Delete a session, its transcript and index rows.",
      h.delete if h else None, result=DeletedReply)
    d("sessions.subscribe", SessionKeyParams, "Receive chat events of a session.",
      h.subscribe if h else None, result=SubscribedReply)
    # inline: never waits on I/O, so the server answers it in the read loop (RpcCore.accept).
    d("sessions.unsubscribe", SessionKeyParams, "Stop receiving a session's chat events.",
      h.unsubscribe if h else None, result=UnsubscribedReply, inline=True)
