"""Chat runs: ``chat.send`` / ``chat.abort``, one FIFO worker per busy session.

A run is: append the user message → build the context (system prompt, recalled memories,
recent history trimmed to a budget) → stream the model's reply as ``chat.delta`` events →
append the assistant message → ``chat.final``. The assistant line is written whether or not
anyone is still connected; an upstream failure writes the partial text marked ``failed`` and
emits ``chat.error``; an abort writes it marked ``aborted`` and emits ``chat.aborted``.

Ordering: the handler takes the session's append lock before its first suspension point,
and ``asyncio.Lock`` wakes waiters in FIFO order, so user messages reach the transcript and
the run queue in arrival order. Each run executes in its own task so that ``chat.abort``
can cancel exactly that run (which closes the upstream stream) without touching the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from gateway import schemas
from gateway.context import build_messages
from gateway.errors import Conflict, InvalidParams, NotConfigured, UpstreamError, to_error_object
from gateway.llm import ChatModel, Completion, TextDelta, create_chat_model

if TYPE_CHECKING:
    from gateway.app import App
    from gateway.server import Connection

__all__ = ["ChatManager", "attach_chat"]

log = structlog.get_logger("recalld.chat")

_YIELD_EVERY_S = 0.002  # while streaming, give connection writers a turn at least this often


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

    def next_seq(self) -> int:
        seq = self.seq
        self.seq += 1
        return seq

    def base(self) -> dict[str, Any]:
        return {"sessionKey": self.session_key, "runId": self.run_id, "seq": self.next_seq()}


@dataclass(eq=False)
class SessionLane:
    """The queue of runs of one session, drained by one worker task."""

    append_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    queue: deque[Run] = field(default_factory=deque)
    current: Run | None = None
    worker: asyncio.Task[None] | None = None


class ChatManager:
    def __init__(self, app: App, model: ChatModel | None) -> None:
        self.app = app
        self.model = model
        self.config = app.config.chat
        self._lanes: dict[tuple[str, str], SessionLane] = {}
        self._idempotency: dict[tuple[str, str, str], tuple[str, float]] = {}
        self._closing = False

    # -- handlers ------------------------------------------------------------------------

    async def send(self, conn: Connection, p: schemas.ChatSendParams) -> dict[str, Any]:
        user = conn.caller
        size = len(p.message.encode())
        if size > self.config.max_message_bytes:
            raise InvalidParams(
                "message", f"is {size} bytes; the limit is {self.config.max_message_bytes} (chat.max_message_bytes)"
            )
        if not p.message.strip():
            raise InvalidParams("message", "must not be empty")
        if self.model is None:
            raise NotConfigured(
                "no chat model is configured: set llm.base_url (or OPENAI_BASE_URL) for a local "
                "server such as Ollama, or llm.api_key (or OPENAI_API_KEY) for OpenAI"
            )
        if self._closing:
            raise Conflict("the gateway is shutting down")
        now = time.monotonic()
        idem = (user, p.session_key, p.idempotency_key) if p.idempotency_key else None
        if idem is not None:
            seen = self._idempotency.get(idem)
            if seen is not None and seen[1] > now:
                self.app.hub.attach(conn, user, p.session_key)
                return {"runId": seen[0], "status": "started", "duplicate": True}
        lane = self._lanes.setdefault((user, p.session_key), SessionLane())
        if len(lane.queue) >= self.config.max_queued_runs:
            raise Conflict(f"session busy: {len(lane.queue)} runs already queued (chat.max_queued_runs)")
        run = Run(secrets.token_hex(8), user, p.session_key, p.message)
        if idem is not None:
            # Recorded before the first await so a duplicate racing this one sees it.
            self._idempotency[idem] = (run.run_id, now + self.config.idempotency_ttl_s)
            self._prune_idempotency(now)
        try:
            async with lane.append_lock:
                await asyncio.to_thread(
                    self.app.store.append_message, user, p.session_key,
                    role="user", content=p.message, run_id=run.run_id,
                )
                lane.queue.append(run)
        except BaseException:
            if idem is not None:
                self._idempotency.pop(idem, None)
            self._forget_if_idle(user, p.session_key, lane)
            raise
        self.app.hub.attach(conn, user, p.session_key)
        if lane.worker is None or lane.worker.done():
            lane.worker = asyncio.create_task(self._work(user, p.session_key, lane))
        return {"runId": run.run_id, "status": "started"}

    async def abort(self, conn: Connection, p: schemas.ChatAbortParams) -> dict[str, Any]:
        user = conn.caller
        await asyncio.to_thread(self.app.store.get, user, p.session_key)  # -32002 if not ours
        lane = self._lanes.get((user, p.session_key))
        if lane is None:
            return {"aborted": False}
        return {"aborted": self._abort_in(lane, p.run_id)}

    async def abort_session(self, user: str, session_key: str) -> None:
        lane = self._lanes.get((user, session_key))
        if lane is None:
            return
        for run in list(lane.queue):
            self._abort_in(lane, run.run_id)
        self._abort_in(lane, None)
        if lane.worker is not None:
            await asyncio.gather(lane.worker, return_exceptions=True)

    def _abort_in(self, lane: SessionLane, run_id: str | None) -> bool:
        current = lane.current
        if current is not None and run_id in (None, current.run_id):
            if current.task is not None and not current.task.done():
                current.abort_requested = True
                current.task.cancel()
                return True
            return False
        for run in lane.queue:
            if run.run_id == run_id:
                lane.queue.remove(run)
                self._publish(run, "chat.aborted", {**run.base(), "partial": ""})
                return True
        return False

    async def drain(self, grace_s: float) -> None:
        """Shutdown: refuse new sends, let runs finish within ``grace_s``, abort the rest."""
        self._closing = True
        workers = [lane.worker for lane in self._lanes.values() if lane.worker and not lane.worker.done()]
        if workers:
            _, pending = await asyncio.wait(workers, timeout=grace_s)
            if pending:
                log.warning("chat.drain_timeout", aborting=len(pending))
                for lane in list(self._lanes.values()):
                    for run in list(lane.queue):
                        self._abort_in(lane, run.run_id)
                    self._abort_in(lane, None)
                await asyncio.gather(*pending, return_exceptions=True)
        if self.model is not None:
            await self.model.close()

    # -- runs ----------------------------------------------------------------------------

    async def _work(self, user: str, session_key: str, lane: SessionLane) -> None:
        try:
            while lane.queue:
                run = lane.queue.popleft()
                lane.current = run
                run.task = asyncio.create_task(self._execute(run))
                await asyncio.wait([run.task])
                lane.current = None
        finally:
            lane.current = None
            self._forget_if_idle(user, session_key, lane)

    def _forget_if_idle(self, user: str, session_key: str, lane: SessionLane) -> None:
        """Drop an idle lane so the map only holds sessions with work in flight."""
        if lane.queue or lane.current is not None or lane.append_lock.locked():
            return
        worker = lane.worker
        if worker is not None and not worker.done() and worker is not asyncio.current_task():
            return
        if self._lanes.get((user, session_key)) is lane:
            del self._lanes[(user, session_key)]

    async def _execute(self, run: Run) -> None:
        assert self.model is not None
        bound = structlog.contextvars.bound_contextvars(session=run.session_key, run=run.run_id)
        with bound:
            recalled: list[str] = []
            usage: dict[str, Any] | None = None
            finish: str | None = None
            model_name = self.app.config.llm.model
            try:
                messages, recalled, session = await build_messages(
                    self.app, run.user, run.session_key, run.message, run.run_id
                )
                model_name = session.model or model_name
                # aclosing: whatever ends the loop, the upstream stream is closed at once.
                yielded_at = 0.0
                async with contextlib.aclosing(self.model.stream(messages, model=model_name)) as events:
                    async for event in events:
                        if isinstance(event, TextDelta):
                            if event.text:
                                run.partial.append(event.text)
                                self._publish(run, "chat.delta", {**run.base(), "delta": event.text})
                                # A stream already buffered in full never awaits the socket, so
                                # the outbox writers would send nothing until the run ends
                                # (first delta ≈ whole run, bench/README.md); let them run.
                                now = time.monotonic()
                                if now - yielded_at >= _YIELD_EVERY_S:
                                    yielded_at = now
                                    await asyncio.sleep(0)
                        elif isinstance(event, Completion):
                            usage, finish = event.usage, event.finish_reason
                            model_name = event.model or model_name
            except asyncio.CancelledError:
                await self._finish_aborted(run, model_name)
                raise
            except UpstreamError as exc:
                await self._finish_failed(run, model_name, exc)
                return
            except Exception as exc:
                log.exception("chat.run_crash")
                await self._finish_failed(run, model_name, UpstreamError(f"run failed: {exc}", None, False))
                return
            await self._finish_ok(run, model_name, usage, finish, recalled)

    async def _finish_ok(self, run: Run, model: str, usage: dict[str, Any] | None,
                         finish: str | None, recalled: list[str]) -> None:
        extra: dict[str, Any] = {"model": model}
        if usage:
            extra["usage"] = usage
        if finish:
            extra["finishReason"] = finish
        try:
            msg = await self._append_assistant(run, extra)
        except Exception as exc:  # disk full: the client still learns what happened
            self._publish(run, "chat.error", {**run.base(), "error": _error_obj(exc, retryable=True),
                                              "partial": "".join(run.partial)})
            log.warning("chat.run", outcome="storage_error", error=str(exc))
            return
        params: dict[str, Any] = {**run.base(), "message": msg.to_wire(), "recalled": recalled}
        if usage:
            params["usage"] = usage
        self._publish(run, "chat.final", params)
        self._log_run(run, "final", recalled=recalled)
        if self.app.memory is not None:
            self.app.memory.nudge()

    async def _finish_failed(self, run: Run, model: str, exc: UpstreamError) -> None:
        partial = "".join(run.partial)
        try:
            await self._append_assistant(run, {"model": model, "failed": True, "error": exc.message})
        except Exception as store_exc:
            log.warning("chat.partial_not_saved", error=str(store_exc))
        self._publish(run, "chat.error", {**run.base(), "error": exc.to_object() | {"retryable": exc.retryable},
                                          "partial": partial})
        self._log_run(run, "error", status=exc.status, retryable=exc.retryable)

    async def _finish_aborted(self, run: Run, model: str) -> None:
        partial = "".join(run.partial)
        try:
            # Shielded: the write must land even though this task is being cancelled.
            await asyncio.shield(self._append_assistant(run, {"model": model, "aborted": True}))
        except Exception as exc:
            log.warning("chat.partial_not_saved", error=str(exc))
        self._publish(run, "chat.aborted", {**run.base(), "partial": partial})
        self._log_run(run, "aborted")

    async def _append_assistant(self, run: Run, extra: dict[str, Any]) -> Any:
        store = self.app.store

        def write() -> Any:
            msg = store.append_message(run.user, run.session_key, role="assistant",
                                       content="".join(run.partial), run_id=run.run_id, extra=extra)
            store.flush()  # the end of a run is a durability point under fsync="batch"
            return msg

        return await asyncio.to_thread(write)

    def _publish(self, run: Run, method: str, params: dict[str, Any]) -> None:
        self.app.hub.publish(run.user, run.session_key, method, params)

    def _log_run(self, run: Run, outcome: str, **fields: Any) -> None:
        log.info("chat.run", outcome=outcome, chars=sum(map(len, run.partial)), events=run.seq,
                 duration_s=round(time.monotonic() - run.started, 3), **fields)

    def _prune_idempotency(self, now: float) -> None:
        if len(self._idempotency) > 1000:
            for key in [k for k, (_, exp) in self._idempotency.items() if exp <= now]:
                del self._idempotency[key]


def _error_obj(exc: BaseException, *, retryable: bool) -> dict[str, Any]:
    return to_error_object(exc) | {"retryable": retryable}


def attach_chat(app: App) -> None:
    llm = app.config.llm
    model = create_chat_model(
        base_url=llm.base_url, api_key=llm.api_key, model=llm.model,
        timeout_s=llm.timeout_s, connect_timeout_s=llm.connect_timeout_s, max_retries=llm.max_retries,
    )
    manager = ChatManager(app, model)
    app.chat = manager
    app.registry.implement("chat.send", manager.send)
    app.registry.implement("chat.abort", manager.abort)
