"""How a run ends: its assistant line, its terminal event, and what follows a reply.

A reply that completes is appended with the model, usage, finish reason and the references of
the chunks recalled into its prompt (``recalled``), then announced by ``chat.final``; after it,
off the reply's path, the session may be named (:class:`~gateway.chat.titles.Titler`) and
compacted (:class:`~gateway.chat.compaction.Compactor`), the episode writer is told and the
indexer nudged. A failure writes the partial text marked
``failed`` and emits ``chat.error``; an abort writes it marked ``aborted`` and emits
``chat.aborted``. A run that regenerates a reply writes ``replaces`` on its line in every case.
Every event takes the run's next ``seq`` here (:meth:`RunEnds.publish`), so a seq is spent only
on an event actually sent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import structlog

from gateway.chat.compaction import Compactor
from gateway.chat.hub import Hub
from gateway.chat.lanes import Run
from gateway.chat.titles import Titler
from gateway.errors import GatewayError, InternalError, new_error_id, wire_error
from gateway.wire import ErrorObject, message_wire, recalled_refs
from memory import EpisodeWriter, Memory, SearchHit
from sessions import CONTINUES_KEY, REPLACES_KEY, Message, SessionStoreLike

__all__ = ["RunEnds", "event_error", "run_error"]

log = structlog.get_logger("recalld.chat")


class RunEnds:
    """Writes and announces the end of each run."""

    def __init__(self, store: SessionStoreLike, hub: Hub, memory: Memory, episodes: EpisodeWriter,
                 titler: Titler, compactor: Compactor) -> None:
        self.store = store
        self.hub = hub
        self.memory = memory
        self.episodes = episodes
        self.titler = titler
        self.compactor = compactor

    async def ok(self, run: Run, model: str, usage: dict[str, Any] | None, finish: str | None,
                 hits: Sequence[SearchHit]) -> None:
        extra: dict[str, Any] = {"model": model}
        if usage:
            extra["usage"] = usage
        if finish:
            extra["finishReason"] = finish
        if hits:
            extra["recalled"] = recalled_refs(hits)
        recalled = [h.chunk_id for h in hits]
        try:
            msg = await self._append_assistant(run, extra)
        except Exception as exc:  # disk full: the client still learns what happened
            error = run_error(exc)
            self.publish(run, "chat.error",
                         {"error": event_error(error), "partial": "".join(run.partial)})
            log.warning("chat.run", outcome="storage_error", error=error.message)
            return
        params: dict[str, Any] = {"message": message_wire(msg), "recalled": recalled,
                                  **run.final_extra}
        if usage:
            params["usage"] = usage
        self.publish(run, "chat.final", params)
        self.log_run(run, "final", recalled=recalled)
        if run.session is not None:
            self.titler.after_reply(run.session, run.message, msg.content)
            self.compactor.after_run(run.user, run.session_key, run.session.model)
        self.episodes.after_run(run.user, run.session_key, run.memory.write_episodes)
        self.memory.nudge()

    async def failed(self, run: Run, model: str, error: GatewayError) -> None:
        partial = "".join(run.partial)
        try:
            await self._append_assistant(run,
                                         {"model": model, "failed": True, "error": error.message})
        except Exception as store_exc:
            log.warning("chat.partial_not_saved", error=str(store_exc))
        self.publish(run, "chat.error", {"error": event_error(error), "partial": partial})
        self.log_run(run, "error", code=error.code, status=getattr(error, "status", None),
                     retryable=error.retryable)

    async def aborted(self, run: Run, model: str) -> None:
        partial = "".join(run.partial)
        try:
            # Shielded: the write must land even though this task is being cancelled.
            await asyncio.shield(self._append_assistant(run, {"model": model, "aborted": True}))
        except Exception as exc:
            log.warning("chat.partial_not_saved", error=str(exc))
        self.publish(run, "chat.aborted", {"partial": partial})
        self.log_run(run, "aborted")

    async def _append_assistant(self, run: Run, extra: dict[str, Any]) -> Message:
        store = self.store
        if run.replaces is not None:
            extra[REPLACES_KEY] = run.replaces
        if run.continues is not None:
            extra[CONTINUES_KEY] = run.continues  # the same reply, longer: not another version

        def write() -> Message:
            msg = store.append_message(run.user, run.session_key, role="assistant",
                                       content="".join(run.partial), run_id=run.run_id, extra=extra)
            store.flush()  # the end of a run is a durability point under fsync="batch"
            return msg

        return await asyncio.to_thread(write)

    def publish(self, run: Run, method: str, fields: dict[str, Any]) -> None:
        self.hub.publish(run.user, run.session_key, method, {**run.next_event(), **fields})

    def publish_delta(self, run: Run, text: str) -> None:
        # The per-delta path of publish: one dict built once, not two merged.
        self.hub.publish(run.user, run.session_key, "chat.delta", run.next_delta(text))

    def log_run(self, run: Run, outcome: str, **fields: Any) -> None:
        log.info("chat.run", outcome=outcome, chars=sum(map(len, run.partial)), events=run.seq,
                 duration_s=round(time.monotonic() - run.started, 3), **fields)


def run_error(exc: Exception) -> GatewayError:
    """What a run failure says on the wire: the mapped error, or, for a bug, an internal
    error whose id matches the logged traceback (its text stays in the log)."""
    error = wire_error(exc)
    if error is None:
        error_id = new_error_id()
        log.error("chat.run_crash", error_id=error_id, exc_info=exc)
        error = InternalError(error_id)
    return error


def event_error(error: GatewayError) -> ErrorObject:
    # chat.error's error object adds ``retryable`` beside code and message (docs/protocol.md).
    obj = error.to_object()
    obj["retryable"] = error.retryable
    return obj
