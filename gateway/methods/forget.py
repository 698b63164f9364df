"""``memory.forget``: forgetting for real, under the user's control.

``{sessionKey?, after?, before?, purgeTranscript?}`` names what to forget: the caller's messages
(of one session, or of all their sessions) timed in ``[after, before)``. At least one of the
three must be given, so a forgotten parameter never wipes a whole memory. What it removes:

- the matching chunks from the index and the facts the model saved from those conversations;
- without ``purgeTranscript``: the transcript keeps the messages, and the range is recorded so
  that no later sync, full reindex or restart indexes them again;
- with ``purgeTranscript: true``: the messages are removed from the stored sessions too (the
  store's ``purge_messages``: an atomic rewrite of the transcript, or a delete on PostgreSQL;
  without a ``sessionKey`` every session the store lists for the caller), so not even a rebuild
  from the transcripts brings them back; then what is left is re-indexed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict

from gateway.errors import InvalidParams
from gateway.methods.sessions import MAX_KEY
from gateway.rpc import CallContext, Registry, bounded
from memory import ForgetRange, Memory
from sessions import SessionNotFound, SessionStoreLike, parse_ts

__all__ = ["ForgetMethods", "declare_forget"]


@dataclass(frozen=True, slots=True)
class MemoryForgetParams:
    session_key: str | None = bounded(None, max_len=MAX_KEY)
    after: str | None = bounded(None, max_len=64,
                                doc="ISO-8601: forget what was said at or after it")
    before: str | None = bounded(None, max_len=64, doc="ISO-8601: forget what was said before it")
    purge_transcript: bool = False


class ForgetReply(TypedDict):
    """What was removed: index chunks, facts saved from those conversations, transcript messages."""

    chunks: int
    facts: int
    messages: int  # 0 without purgeTranscript


class ForgetMethods:
    def __init__(self, service: Memory, store: SessionStoreLike) -> None:
        self.service = service
        self.store = store

    async def forget(self, ctx: CallContext, p: MemoryForgetParams) -> ForgetReply:
        user = ctx.caller
        if p.session_key is None and p.after is None and p.before is None:
            raise InvalidParams("sessionKey", "name a sessionKey, after or before (all three "
                                              "absent would forget everything)")
        after, before = _moment("after", p.after), _moment("before", p.before)
        if after is not None and before is not None and after >= before:
            raise InvalidParams("before", "must be later than after")
        if p.session_key is not None:
            # -32002 if not the caller's
            await asyncio.to_thread(self.store.get, user, p.session_key)
        r = ForgetRange(user, p.session_key, _ms(after), _ms(before))
        purged = 0
        if p.purge_transcript:
            purged = await self._purge(user, p.session_key, after, before)
        removed = await self.service.forget(r, record=not p.purge_transcript)
        if p.purge_transcript:
            # What is left of the rewritten transcripts goes back into the index.
            self.service.nudge()
        return {"chunks": removed["chunks"], "facts": removed["facts"], "messages": purged}

    async def _purge(self, user: str, session_key: str | None, after: datetime | None,
                     before: datetime | None) -> int:
        if session_key is not None:
            return await asyncio.to_thread(self.store.purge_messages, user, session_key,
                                           after=after, before=before)
        purged = 0
        for key in await asyncio.to_thread(self._keys_of, user):
            try:
                purged += await asyncio.to_thread(self.store.purge_messages, user, key, after=after,
                                                  before=before)
            except SessionNotFound:
                # Deleted since it was listed (or unreadable: the store logged it). Failing here
                # would leave the sessions before it purged and the index not forgotten.
                continue
        return purged

    def _keys_of(self, user: str) -> list[str]:
        # Asked of the store, not the data dir: on PostgreSQL there are no transcript files to scan.
        keys: list[str] = []
        cursor: str | None = None
        while True:
            page, cursor = self.store.list(user, before=cursor)
            keys.extend(s.session_key for s in page)
            if cursor is None:
                return keys


def _moment(field: str, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_ts(value)
    except ValueError:
        raise InvalidParams(field, "must be an ISO-8601 date or time") from None


def _ms(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp() * 1000)


def declare_forget(reg: Registry, h: ForgetMethods | None) -> None:
    reg.declare("memory.forget", MemoryForgetParams,
                "Forget messages (of a session, in a time window) from memory; purgeTranscript "
                "also removes them from the transcript.", h.forget if h else None,
                result=ForgetReply)
