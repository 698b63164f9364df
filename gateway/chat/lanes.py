"""A run and the lane of runs of one session: the values :class:`gateway.chat.runs.ChatRuns`
queues, executes and announces (each event takes the run's next ``seq`` here)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gateway.chat.gate import RunTicket
from gateway.chat.prompt import SessionRead
from gateway.wire import ChatDelta, ChatEventBase
from memory import RunMemory
from sessions import Session

__all__ = ["Attempt", "Run", "SessionLane"]


@dataclass(eq=False)
class Run:
    run_id: str
    user: str
    session_key: str
    message: str
    seq: int = 0
    partial: list[str] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    abort_requested: bool = False
    started: float = field(default_factory=time.monotonic)
    final_extra: dict[str, Any] = field(default_factory=dict)  # chat.final fields
                                                               # the memory tools add
    recall: bool = True  # chat.send {recall:false} turns recall off for this run
    memory: RunMemory = RunMemory()  # what memory does for the run, decided once it starts
    # The session and its recent messages, read right after the user message was appended
    # when the run went into an idle session (ChatRuns.submit); None: the run reads them.
    prefetched: SessionRead | None = None
    ticket: RunTicket | None = None  # its place across nodes (postgres backend only)
    # chat.regenerate: the user message the run answers (none is appended) and the reply its
    # line supersedes; None for a run of chat.send or chat.edit (its own user line).
    answers: str | None = None
    replaces: str | None = None
    # chat.continue: the id of the reply cut at the length limit that this run carries on (it
    # also ``replaces`` it; ``partial`` starts with its text, so the line holds the whole reply).
    continues: str | None = None
    session: Session | None = None  # as the run's prompt read it (its title decides naming)
    # chat.send's checked attachments (gateway.chat.attachments.Upload), stored with its line.
    uploads: tuple[Any, ...] = ()

    def next_event(self) -> ChatEventBase:
        """The fields every chat event carries, taking this run's next ``seq``: call it once
        per event actually published."""
        return {"sessionKey": self.session_key, "runId": self.run_id, "seq": self._take_seq()}

    def next_delta(self, text: str) -> ChatDelta:
        """:meth:`next_event`'s fields and ``text``: the per-delta path, one dict built once."""
        return {"sessionKey": self.session_key, "runId": self.run_id, "seq": self._take_seq(),
                "delta": text}

    def _take_seq(self) -> int:
        seq = self.seq
        self.seq += 1
        return seq


@dataclass(eq=False)
class SessionLane:
    """The queue of runs of one session, drained by one worker task."""

    append_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    queue: deque[Run] = field(default_factory=deque)
    current: Run | None = None
    worker: asyncio.Task[None] | None = None
    # submit() calls between finding this lane and queueing their run. Counted by hand, not
    # read from the lock: while an asyncio.Lock is handed to the next waiter, locked() is
    # False, and a lane dropped then would leave that waiter's run in an orphan queue.
    submitters: int = 0


@dataclass(eq=False)
class Attempt:
    """The first send under an idempotency key; ``outcome`` is True once its run is queued,
    False if its append failed (the key is then free for a retry)."""

    run_id: str
    expires: float
    outcome: asyncio.Future[bool]
