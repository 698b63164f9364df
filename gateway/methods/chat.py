"""``chat.send``, ``chat.abort``, ``chat.regenerate``, ``chat.continue``, ``chat.edit`` and
``chat.choose``: check the call, then hand it to :class:`ChatRuns`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

from gateway.chat import ChatRuns, Hub
from gateway.chat.attachments import parse_attachments
from gateway.config import ChatConfig
from gateway.errors import InvalidParams
from gateway.methods.sessions import MAX_KEY
from gateway.rpc import Bound, ByteRate, CallContext, Registry, bounded, written_size
from gateway.wire import MessageWire, message_wire
from sessions import SessionStoreLike

__all__ = ["ChatMethods", "declare_chat"]


@dataclass(frozen=True, slots=True)
class ChatSendParams:
    session_key: str = bounded(max_len=MAX_KEY)
    message: str = bounded()
    idempotency_key: str | None = bounded(None, max_len=200)
    recall: bool = bounded(True, doc="false: no memories recalled into this run's prompt")
    # Checked by gateway.chat.attachments (each field named in its -32602), not by the registry.
    attachments: list[Any] | None = bounded(None, doc="files sent with the message: [{name, "
                                            "mediaType, data (base64)}] (docs/protocol.md, "
                                            "Attachments)")


@dataclass(frozen=True, slots=True)
class ChatAbortParams:
    session_key: str = bounded(max_len=MAX_KEY)
    run_id: str | None = bounded(None, max_len=MAX_KEY)


@dataclass(frozen=True, slots=True)
class ChatRegenerateParams:
    session_key: str = bounded(max_len=MAX_KEY)
    recall: bool = bounded(True, doc="false: no memories recalled into this run's prompt")


@dataclass(frozen=True, slots=True)
class ChatContinueParams:
    session_key: str = bounded(max_len=MAX_KEY)
    recall: bool = bounded(True, doc="false: no memories recalled into this run's prompt")


@dataclass(frozen=True, slots=True)
class ChatEditParams:
    session_key: str = bounded(max_len=MAX_KEY)
    text: str = bounded(doc="the new text of the session's last user message")
    recall: bool = bounded(True, doc="false: no memories recalled into this run's prompt")
    message_id: str | None = bounded(None, max_len=MAX_KEY, doc="a shown user message to edit "
                                     "instead of the last; what followed it leaves the shown "
                                     "history (a fork)")


@dataclass(frozen=True, slots=True)
class ChatChooseParams:
    session_key: str = bounded(max_len=MAX_KEY)
    message_id: str = bounded(max_len=MAX_KEY,
                              doc="the version to show (one of sessions.history's versions.ids)")


class ChooseReply(TypedDict):
    messages: list[MessageWire]  # the lines appended (none when that version was shown already)


class SendReply(TypedDict):
    runId: str
    status: Literal["started"]
    duplicate: NotRequired[Literal[True]]  # a repeated idempotencyKey: the first run's id


class ResendReply(TypedDict):
    runId: str
    status: Literal["started"]


class AbortReply(TypedDict):
    aborted: bool


class ChatMethods:
    def __init__(self, config: ChatConfig, store: SessionStoreLike, hub: Hub, runs: ChatRuns,
                 message_bytes: ByteRate | None = None,
                 attachment_bytes: ByteRate | None = None) -> None:
        self.config = config
        self.store = store
        self.hub = hub
        self.runs = runs
        # quotas.message_bytes_per_minute: what a user's messages may add to the transcripts.
        self.message_bytes = message_bytes
        # quotas.attachment_bytes_per_minute: what a user's files may add to the disk.
        self.attachment_bytes = attachment_bytes

    def _measure(self, field: str, text: str, *, may_be_empty: bool = False) -> int:
        # Measured as it will be written, so the raw length cannot pass here and the
        # transcript line still be refused later.
        size = written_size(text)
        if size > self.config.max_message_bytes:
            raise InvalidParams(
                field, f"is {size} bytes as written (JSON-escaped UTF-8); the limit is "
                f"{self.config.max_message_bytes} (chat.max_message_bytes)"
            )
        if not text.strip() and not may_be_empty:
            raise InvalidParams(field, "must not be empty")
        return size

    async def send(self, ctx: CallContext, p: ChatSendParams) -> SendReply:
        user = ctx.caller
        if p.idempotency_key is not None and "\x00" in p.idempotency_key:
            # PostgreSQL text cannot hold it (the key is stored there across nodes): refused on
            # every backend alike, before anything is counted or written.
            raise InvalidParams("idempotencyKey", "must not contain NUL characters")
        # Checked here, without an await (decoding and sniffing only); PDF text, the model's
        # check and the writes come with the append, in ChatRuns.
        uploads = parse_attachments(p.attachments, self.config)
        size = self._measure("message", p.message, may_be_empty=bool(uploads))
        files = sum(len(u.data) for u in uploads)
        rate, file_rate = self.message_bytes, self.attachment_bytes if uploads else None
        if rate is not None:
            rate.take(user, size)
        if file_rate is not None:
            try:
                file_rate.take(user, files)
            except BaseException:
                if rate is not None:
                    rate.refund(user, size)
                raise
        # Nothing is awaited before submit(): arrival order is transcript order (see ChatRuns).
        try:
            run_id, duplicate = await self.runs.submit(user, p.session_key, p.message,
                                                       p.idempotency_key, recall=p.recall,
                                                       uploads=uploads)
        except BaseException:
            self._refund(user, size, files)  # refused (or cancelled) before the append
            raise
        if duplicate:
            self._refund(user, size, files)  # the first send appended it; this one appends nothing
        # Attached before returning, hence before the worker publishes this run's first event.
        self.hub.attach(ctx, user, p.session_key)
        if duplicate:
            return {"runId": run_id, "status": "started", "duplicate": True}
        return {"runId": run_id, "status": "started"}

    def _refund(self, user: str, size: int, files: int) -> None:
        if self.message_bytes is not None:
            self.message_bytes.refund(user, size)
        if files and self.attachment_bytes is not None:
            self.attachment_bytes.refund(user, files)

    async def regenerate(self, ctx: CallContext, p: ChatRegenerateParams) -> ResendReply:
        user = ctx.caller
        await asyncio.to_thread(self.store.get, user, p.session_key)  # -32002 if not ours
        run_id = await self.runs.resend(user, p.session_key, None, recall=p.recall)
        self.hub.attach(ctx, user, p.session_key)
        return {"runId": run_id, "status": "started"}

    async def carry_on(self, ctx: CallContext, p: ChatContinueParams) -> ResendReply:
        user = ctx.caller
        await asyncio.to_thread(self.store.get, user, p.session_key)  # -32002 if not ours
        run_id = await self.runs.resend(user, p.session_key, None, recall=p.recall, carry_on=True)
        self.hub.attach(ctx, user, p.session_key)
        return {"runId": run_id, "status": "started"}

    async def edit(self, ctx: CallContext, p: ChatEditParams) -> ResendReply:
        user = ctx.caller
        size = self._measure("text", p.text)
        await asyncio.to_thread(self.store.get, user, p.session_key)  # -32002 if not ours
        rate = self.message_bytes
        if rate is not None:
            rate.take(user, size)
        try:
            run_id = await self.runs.resend(user, p.session_key, p.text, recall=p.recall,
                                            edits=p.message_id)
        except BaseException:
            if rate is not None:
                rate.refund(user, size)
            raise
        self.hub.attach(ctx, user, p.session_key)
        return {"runId": run_id, "status": "started"}

    async def choose(self, ctx: CallContext, p: ChatChooseParams) -> ChooseReply:
        user = ctx.caller
        await asyncio.to_thread(self.store.get, user, p.session_key)  # -32002 if not ours
        written = await self.runs.choose(user, p.session_key, p.message_id)
        return {"messages": [message_wire(m) for m in written]}

    async def abort(self, ctx: CallContext, p: ChatAbortParams) -> AbortReply:
        user = ctx.caller
        await asyncio.to_thread(self.store.get, user, p.session_key)  # -32002 if not ours
        return {"aborted": self.runs.abort(user, p.session_key, p.run_id)}


def declare_chat(reg: Registry, config: ChatConfig, h: ChatMethods | None) -> None:
    # A message has at most as many characters as bytes, so the byte limit bounds its length.
    reg.declare("chat.send", ChatSendParams, "Send a message; the reply streams as chat.* events.",
                h.send if h else None, result=SendReply,
                bounds={"message": Bound(max_len=config.max_message_bytes)})
    reg.declare("chat.regenerate", ChatRegenerateParams, "Answer the last message again; the new "
                "reply supersedes the last one (an idle session only).",
                h.regenerate if h else None, result=ResendReply)
    reg.declare("chat.continue", ChatContinueParams, "Write on the last reply where it stopped at "
                "the length limit; the longer reply supersedes it (an idle session only).",
                h.carry_on if h else None, result=ResendReply)
    reg.declare("chat.edit", ChatEditParams, "Replace the last user message (or messageId: an "
                "earlier one, forking) and what followed it with text and answer it (an idle "
                "session only).", h.edit if h else None, result=ResendReply,
                bounds={"text": Bound(max_len=config.max_message_bytes)})
    reg.declare("chat.choose", ChatChooseParams, "Show an earlier version of a message again (and "
                "the branch that followed it), appended as new lines (an idle session only).",
                h.choose if h else None, result=ChooseReply)
    reg.declare("chat.abort", ChatAbortParams, "Abort the running reply of a session.",
                h.abort if h else None, result=AbortReply)
