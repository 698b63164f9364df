"""``sessions.import``: a chat history sent by a client (the web page's "Import chats"), written
as the caller's sessions by the parser and writer ``recalld import`` uses
(:mod:`gateway.importing`), so both read, refuse, skip and resume alike.

One call carries one file's text (a ChatGPT ``conversations.json``, or recalld JSONL) within one
frame: ``server.max_size`` bounds it (published as ``data``'s ``maxLength`` by ``rpc.discover``).
A larger export is sent in parts cut at conversation boundaries, each a valid file of its own
(the page does that); since a conversation's session key comes from its id, the parts may come
in any order and a part sent twice writes nothing the second time.

* The whole of ``data`` is parsed before anything is written: a malformed part answers -32602
  naming the conversation or line, and writes nothing. ``dryRun`` does only that and counts what
  would be written (the page checks every part so before it writes the first).
* A storage failure part-way (a full disk) keeps what was written; the same call resumes.
* Writes: refused to a read-only client token (-32005). The bytes count against
  ``quotas.import_bytes_per_minute`` (a dry run writes nothing and counts nothing), and one
  import runs at a time per user (another answers -32003).
* Every session made or resumed is announced (``sessions.created`` / ``sessions.updated``) to the
  user's watching connections, so sidebars show them, and the memory indexer is nudged.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import structlog

from gateway.chat import Hub, announce
from gateway.errors import Conflict, InvalidParams, StorageFailed, wire_error
from gateway.importing import (
    Format,
    ImportFormatError,
    ImportReport,
    detect,
    parse,
    write_conversations,
)
from gateway.rpc import Bound, ByteRate, CallContext, Registry, bounded
from gateway.wire import session_wire
from memory import Memory
from sessions import Session, SessionNotFound, SessionStoreLike, StorageError

__all__ = ["ImportMethods", "declare_importing"]

log = structlog.get_logger("recalld.import")

MAX_NAME = 255
# Lines of leftOut in a reply; leftOutCount says how many there were.
MAX_LEFT_OUT = 20


@dataclass(frozen=True, slots=True)
class ImportParams:
    data: str = bounded(doc="the file's text: a ChatGPT conversations.json, or recalld JSONL (one "
                            "frame: server.max_size bytes; a larger export goes in parts cut "
                            "between conversations)")
    format: Literal["auto", "chatgpt", "jsonl"] = bounded("auto", doc="auto: a JSON array is "
                                                          "chatgpt, lines of objects jsonl")
    name: str | None = bounded(None, max_len=MAX_NAME, doc="the file's name, said in errors")
    dry_run: bool = bounded(False,
                            doc="check all of data and count what would be written; write nothing")


class ImportReply(TypedDict):
    format: Literal["chatgpt", "jsonl"]
    conversations: int  # in data
    created: int  # new sessions
    resumed: int  # sessions that held the first messages of their conversation and got the rest
    unchanged: int  # already imported: nothing written
    empty: int  # conversations without a text message: skipped
    messages: int  # message lines written (dryRun: that would be written)
    leftOut: list[str]  # what was left out of the sessions (a model
                        # not offered, a field too long), the first 20
    leftOutCount: int
    dryRun: bool


class ImportMethods:
    def __init__(self, store: SessionStoreLike, hub: Hub, memory: Memory,
                 models: tuple[str, ...] | None, import_bytes: ByteRate | None = None) -> None:
        self.store = store
        self.hub = hub
        self.memory = memory  # nudged after a write, so the new messages
                              # are indexed soon (MemoryOff: a no-op)
        self.models = models  # LlmConfig.choices: a conversation's model is kept only if offered
        self.import_bytes = import_bytes  # quotas.import_bytes_per_minute
        self._running: set[str] = set()  # users with an import in progress

    async def import_history(self, ctx: CallContext, p: ImportParams) -> ImportReply:
        user = ctx.caller
        if user in self._running:
            raise Conflict(
                "busy: an import of yours is running; send the next one when it has answered")
        raw = p.data.encode("utf-8", "surrogatepass")  # a lone surrogate is then
                                                       # invalid JSON, said so
        rate = None if p.dry_run else self.import_bytes
        if rate is not None:
            rate.take(user, len(raw))
        self._running.add(user)
        # The user's next import waits for this thread to end, not for this call: a call
        # cancelled (its connection closed) leaves the thread writing, and a second import of
        # the same data beside it would append the same messages again.
        job = asyncio.ensure_future(asyncio.to_thread(self._run, user, raw, p.format, p.dry_run))
        job.add_done_callback(lambda done: self._ended(user, done))
        try:
            report, fmt, sessions = await asyncio.shield(job)
        except ImportFormatError as exc:
            if rate is not None:
                rate.refund(user, len(raw))  # nothing was written
            where = f"{p.name}: " if p.name else ""
            raise InvalidParams("data", f"{where}{exc}; nothing was imported") from None
        except StorageError as exc:
            mapped = wire_error(exc)
            if not isinstance(mapped, StorageFailed):
                raise
            raise StorageFailed(f"{mapped.message}; the import stopped there: what was written "
                                "stays, and sending the same data again resumes it",
                                retryable=mapped.retryable,
                                retry_after_ms=mapped.retry_after_ms) from exc
        if not p.dry_run:
            created = set(report.created_keys)
            for session in sessions:
                method = ("sessions.created" if session.session_key in created
                          else "sessions.updated")
                announce(self.hub, user, session.session_key, method,
                         {"session": session_wire(session)})
            if report.messages:
                self.memory.nudge()
            log.info("sessions.imported", user=user, format=fmt, conversations=report.conversations,
                     created=report.created, resumed=report.resumed, unchanged=report.unchanged,
                     messages=report.messages, left_out=len(report.skipped),
                     seconds=round(report.seconds, 3))
        return {"format": fmt, "conversations": report.conversations, "created": report.created,
                "resumed": report.resumed, "unchanged": report.unchanged, "empty": report.empty,
                "messages": report.messages, "leftOut": list(report.skipped[:MAX_LEFT_OUT]),
                "leftOutCount": len(report.skipped), "dryRun": p.dry_run}

    def _ended(self, user: str, job: asyncio.Future[Any]) -> None:
        self._running.discard(user)
        if not job.cancelled():
            job.exception()  # retrieved: a call cancelled meanwhile never reads it

    def _run(self, user: str, raw: bytes, wanted: Literal["auto", "chatgpt", "jsonl"],
             dry_run: bool) -> tuple[ImportReport, Format, list[Session]]:
        """In a worker thread: parse all of it, then write it, then read back what to announce."""
        fmt: Format = detect(raw) if wanted == "auto" else wanted
        conversations = parse(raw, fmt)
        report = write_conversations(self.store, user, fmt, conversations, models=self.models,
                                     dry_run=dry_run)
        sessions: list[Session] = []
        if not dry_run:
            for key in (*report.created_keys, *report.resumed_keys):
                try:
                    sessions.append(self.store.get(user, key))
                except SessionNotFound:  # deleted meanwhile: nothing to show
                    pass
        return report, fmt, sessions


def declare_importing(reg: Registry, h: ImportMethods | None, *, max_data_chars: int) -> None:
    """``max_data_chars``: ``server.max_size``, as ``data``'s published bound (a frame never
    carries more, so the page sizes its parts by it)."""
    reg.declare("sessions.import", ImportParams, "Import a chat history (a ChatGPT "
                "conversations.json, or recalld JSONL) as your sessions, idempotently; dryRun only "
                "checks and counts.",
                h.import_history if h else None, result=ImportReply,
                bounds={"data": Bound(max_len=max_data_chars)})
