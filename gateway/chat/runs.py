"""Chat runs: one FIFO queue and worker per busy session, driven by ``chat.send``/``chat.abort``.

A run is: append the user message → build the prompt (system prompt, recalled memories,
recent history trimmed to a budget) → stream the model's reply as ``chat.delta`` events →
append the assistant message → ``chat.final``. The assistant line is written whether or not
anyone is still connected; an upstream failure writes the partial text marked ``failed`` and
emits ``chat.error``; an abort writes it marked ``aborted`` and emits ``chat.aborted``.

Ordering: :meth:`ChatRuns.submit` takes the session's append lock before its first
suspension point (and the ``chat.send`` handler awaits nothing before calling it), and
``asyncio.Lock`` wakes waiters in FIFO order, so user messages reach the transcript and the
run queue in arrival order. Each run executes in its own task so that ``chat.abort`` can
cancel exactly that run (which closes the upstream stream) without touching the worker.
Every event takes the run's next ``seq`` in one place (``_publish``), so a seq is spent only
on an event actually sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from typing import Any

import structlog

from gateway.chat.episodes import ModelSummarizer
from gateway.chat.gate import RunGate, close_soon, run_leased, ungate
from gateway.chat.hub import Hub
from gateway.chat.lanes import Attempt, Run, SessionLane
from gateway.chat.llm import ChatModel, Completion, TextDelta
from gateway.chat.memory_tools import MemoryTools
from gateway.chat.prompt import build_prompt, read_session
from gateway.config import ChatConfig
from gateway.errors import (
    Conflict,
    GatewayError,
    InternalError,
    NotConfigured,
    RateLimited,
    new_error_id,
    wire_error,
)
from gateway.wire import ErrorObject, LiveRun, message_wire
from memory import EpisodeWriter, Memory
from sessions import Message, Session, SessionStoreLike

__all__ = ["ChatRuns", "Run"]

log = structlog.get_logger("recalld.chat")

# While streaming, give connection writers a turn at least this often: the deltas published in
# between leave as one merged chat.delta (docs/protocol.md), a frame and a send() per connection
# saved each, and 8 ms is half a 60 Hz screen frame. A real model's deltas each await its socket.
_YIELD_EVERY_S = 0.008


class ChatRuns:
    """Every session's run queue; what ``chat.send``/``chat.abort`` and shutdown drive."""

    def __init__(self, config: ChatConfig, default_model: str, store: SessionStoreLike, hub: Hub,
                 model: ChatModel | None, memory: Memory | None, *,
                 max_runs: int | None = None, max_runs_per_user: int | None = None,
                 gate: RunGate | None = None) -> None:
        self.config = config
        self.gate = gate  # other nodes on one database (gateway.chat.gate); None on one node
        # Busy sessions (a run streaming or queued), all users / one user ([quotas]): each is
        # an upstream connection while it runs.
        self.max_runs = max_runs
        self.max_runs_per_user = max_runs_per_user
        self.default_model = default_model
        self.store = store
        self.hub = hub
        self.model = model
        self.memory = memory
        self.memory_tools = MemoryTools(memory, config.recall_k, config.max_tool_rounds)
        summarizer = (ModelSummarizer(model, memory.config.summary_model or default_model)
                      if model is not None and memory is not None else None)
        self.episodes = EpisodeWriter(memory, summarizer, store, config.timezone)
        self._lanes: dict[tuple[str, str], SessionLane] = {}
        self._idempotency: dict[tuple[str, str, str], Attempt] = {}
        self._closing = False

    async def submit(self, user: str, session_key: str, message: str,
                     idempotency_key: str | None, *, recall: bool = True) -> tuple[str, bool]:
        """Append the user message and queue its run; returns (runId, whether it is a
        duplicate of an earlier send with the same idempotency key)."""
        if self.model is None:
            raise NotConfigured(
                "no chat model is configured: set llm.base_url (or OPENAI_BASE_URL) for a local "
                "server such as Ollama, or llm.api_key (or OPENAI_API_KEY) for OpenAI"
            )
        if self._closing:
            raise Conflict("the gateway is shutting down")
        idem = (user, session_key, idempotency_key) if idempotency_key else None
        while idem is not None and (seen := self._idempotency.get(idem)) is not None:
            if seen.expires <= time.monotonic():
                break
            if seen.outcome.done():
                return seen.run_id, True
            # The first attempt is still appending: its outcome decides whether this one is a
            # duplicate or must be carried out itself (then the key is free; look again).
            await asyncio.shield(seen.outcome)
        run_id = secrets.token_hex(8)
        if idem is not None and self.gate is not None:
            owner = await self.gate.claim(user, session_key, idem[2], run_id, self.config.idempotency_ttl_s)
            if owner != run_id:
                return owner, True
        lane = self._lanes.get((user, session_key))
        try:
            if lane is None:
                # A send to a session already busy only queues: it adds no concurrent run.
                self._check_run_quota(user)
                lane = self._lanes[(user, session_key)] = SessionLane()
            if len(lane.queue) >= self.config.max_queued_runs:
                raise Conflict(f"session busy: {len(lane.queue)} runs already queued (chat.max_queued_runs)")
        except GatewayError:
            await asyncio.shield(ungate(self.gate, None, idem, run_id))  # a refused send claims no key
            raise
        run = Run(run_id, user, session_key, message, recall=recall)
        attempt: Attempt | None = None
        if idem is not None:
            # Recorded before the first await so a duplicate racing this one finds it.
            now = time.monotonic()
            attempt = Attempt(run.run_id, now + self.config.idempotency_ttl_s,
                               asyncio.get_running_loop().create_future())
            self._idempotency[idem] = attempt
            self._prune_idempotency(now)
        lane.submitters += 1
        try:
            async with lane.append_lock:
                # A run queued into an idle session starts at once, and nothing else appends
                # to its transcript before it does (a later send's message comes after its own,
                # where its history stops), so the prompt's read joins this thread hop: one
                # hop fewer before the model's first byte. (A sessions.update or memory.forget
                # landing in between is ordered after the run's read, as it would be a moment
                # later had the run read it itself.)
                idle = lane.current is None and not lane.queue and self.gate is None
                if self.gate is not None:  # live across nodes before its message exists
                    run.ticket = await self.gate.ticket(user, session_key, run.run_id)
                run.prefetched = await asyncio.to_thread(self._append_user, run, idle)
                lane.queue.append(run)
        except BaseException:
            if idem is not None and attempt is not None:
                if self._idempotency.get(idem) is attempt:
                    del self._idempotency[idem]
                attempt.outcome.set_result(False)
            await asyncio.shield(ungate(self.gate, run.ticket, idem, run.run_id))
            lane.submitters -= 1
            self._forget_if_idle(user, session_key, lane)
            raise
        lane.submitters -= 1
        if attempt is not None:
            attempt.outcome.set_result(True)
        if lane.worker is None or lane.worker.done():
            lane.worker = asyncio.create_task(self._work(user, session_key, lane))
        return run.run_id, False

    def _append_user(self, run: Run, read: bool) -> tuple[Session, list[Message]] | None:
        """Append the run's user message; with ``read``, then read what its prompt needs.
        Runs in a worker thread."""
        self.store.append_message(run.user, run.session_key, role="user", content=run.message,
                                  run_id=run.run_id)
        if not read:
            return None
        try:
            return read_session(self.config, self.store, run.user, run.session_key)
        except Exception:
            # The message is written and its run must be queued: the run reads again when it
            # starts and reports what fails then, as it would have without this read.
            return None

    def _check_run_quota(self, user: str) -> None:
        if self.max_runs is not None and len(self._lanes) >= self.max_runs:
            raise RateLimited(f"too many replies being generated ({len(self._lanes)}, quotas.max_runs); "
                              "retry later", 1000)
        if self.max_runs_per_user is not None:
            mine = sum(1 for lane_user, _ in self._lanes if lane_user == user)
            if mine >= self.max_runs_per_user:
                raise RateLimited(f"too many of your sessions are generating replies ({mine}, "
                                  "quotas.max_runs_per_user); wait for one to finish", 1000)

    def abort(self, user: str, session_key: str, run_id: str | None) -> bool:
        """Abort the running reply (``run_id`` None or its id) or drop a queued run."""
        lane = self._lanes.get((user, session_key))
        return lane is not None and self._abort_in(lane, run_id)

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
                close_soon(run.ticket)
                self._publish(run, "chat.aborted", {"partial": ""})
                return True
        return False

    def live_runs(self, user: str, session_key: str) -> list[LiveRun]:
        """The session's run that is streaming now, as ``{runId, seq, text}``: ``text`` is
        every delta published so far and ``seq`` the last event's (-1 before the first).

        Read-only and synchronous: ``sessions.subscribe`` attaches the connection and calls
        this with no await between, so every event the connection then receives has a higher
        seq. A run whose task is done has published its terminal event, so it is left out.
        """
        lane = self._lanes.get((user, session_key))
        run = lane.current if lane is not None else None
        if run is None or run.task is None or run.task.done():
            return []
        return [{"runId": run.run_id, "seq": run.seq - 1, "text": "".join(run.partial)}]

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
        await self.episodes.close()
        if self.model is not None:
            await self.model.close()

    # -- runs ----------------------------------------------------------------------------

    async def _work(self, user: str, session_key: str, lane: SessionLane) -> None:
        try:
            while lane.queue:
                run = lane.queue.popleft()
                lane.current = run
                run.task = asyncio.create_task(self._execute(run) if run.ticket is None else self._leased(run))
                await asyncio.wait([run.task])
                lane.current = None
        finally:
            lane.current = None
            self._forget_if_idle(user, session_key, lane)

    async def _leased(self, run: Run) -> None:
        assert run.ticket is not None
        await run_leased(run.ticket, lambda: self._execute(run),
                         aborted=lambda: self._finish_aborted(run, self.default_model),
                         failed=lambda exc: self._finish_failed(run, self.default_model, _run_error(exc)))

    def _forget_if_idle(self, user: str, session_key: str, lane: SessionLane) -> None:
        """Drop an idle lane so the map only holds sessions with work in flight."""
        if lane.queue or lane.current is not None or lane.submitters:
            return
        worker = lane.worker
        if worker is not None and not worker.done() and worker is not asyncio.current_task():
            return
        if self._lanes.get((user, session_key)) is lane:
            del self._lanes[(user, session_key)]

    async def _execute(self, run: Run) -> None:
        model = self.model
        assert model is not None  # submit() refuses runs without a model
        bound = structlog.contextvars.bound_contextvars(session=run.session_key, run=run.run_id)
        with bound:
            recalled: list[int] = []
            usage: dict[str, Any] | None = None
            finish: str | None = None
            model_name = self.default_model
            try:
                # What memory does for the run is decided once, when build_prompt has read the
                # session (RunMemory); the tools and the episode writer read that decision.
                read, run.prefetched = run.prefetched, None
                prompt = await build_prompt(self.config, self.store, self.memory, run.user, run.session_key,
                                            run.message, run.run_id, read, recall=run.recall,
                                            tools=model.supports_tools)
                run.memory = prompt.memory
                recalled = prompt.recalled
                model_name = prompt.session.model or model_name
                # aclosing: whatever ends the loop, the upstream stream is closed at once.
                yielded_at = 0.0
                tools = self.memory_tools.begin(run.user, run.session_key, run.run_id, prompt.memory,
                                                prompt.context)
                async with contextlib.aclosing(tools.stream(model, prompt.messages, model_name)) as events:
                    async for event in events:
                        if isinstance(event, TextDelta):
                            text = event.text
                            if text:
                                run.partial.append(text)
                                self._publish_delta(run, text)
                                # A stream already buffered in full never awaits the socket, so
                                # the outbox writers would send nothing until the run ends.
                                now = time.monotonic()
                                if now - yielded_at >= _YIELD_EVERY_S:
                                    yielded_at = now
                                    await asyncio.sleep(0)
                        elif isinstance(event, Completion):
                            usage, finish = event.usage, event.finish_reason
                            model_name = event.model or model_name
                run.final_extra = tools.final_fields()
            except asyncio.CancelledError:
                await self._finish_aborted(run, model_name)
                raise
            except Exception as exc:
                await self._finish_failed(run, model_name, _run_error(exc))
                return
            await self._finish_ok(run, model_name, usage, finish, recalled)

    async def _finish_ok(self, run: Run, model: str, usage: dict[str, Any] | None,
                         finish: str | None, recalled: list[int]) -> None:
        extra: dict[str, Any] = {"model": model}
        if usage:
            extra["usage"] = usage
        if finish:
            extra["finishReason"] = finish
        try:
            msg = await self._append_assistant(run, extra)
        except Exception as exc:  # disk full: the client still learns what happened
            error = _run_error(exc)
            self._publish(run, "chat.error", {"error": _event_error(error), "partial": "".join(run.partial)})
            log.warning("chat.run", outcome="storage_error", error=error.message)
            return
        params: dict[str, Any] = {"message": message_wire(msg), "recalled": recalled, **run.final_extra}
        if usage:
            params["usage"] = usage
        self._publish(run, "chat.final", params)
        self._log_run(run, "final", recalled=recalled)
        self.episodes.after_run(run.user, run.session_key, run.memory.write_episodes)
        if self.memory is not None:
            self.memory.nudge()

    async def _finish_failed(self, run: Run, model: str, error: GatewayError) -> None:
        partial = "".join(run.partial)
        try:
            await self._append_assistant(run, {"model": model, "failed": True, "error": error.message})
        except Exception as store_exc:
            log.warning("chat.partial_not_saved", error=str(store_exc))
        self._publish(run, "chat.error", {"error": _event_error(error), "partial": partial})
        self._log_run(run, "error", code=error.code, status=getattr(error, "status", None),
                      retryable=error.retryable)

    async def _finish_aborted(self, run: Run, model: str) -> None:
        partial = "".join(run.partial)
        try:
            # Shielded: the write must land even though this task is being cancelled.
            await asyncio.shield(self._append_assistant(run, {"model": model, "aborted": True}))
        except Exception as exc:
            log.warning("chat.partial_not_saved", error=str(exc))
        self._publish(run, "chat.aborted", {"partial": partial})
        self._log_run(run, "aborted")

    async def _append_assistant(self, run: Run, extra: dict[str, Any]) -> Message:
        store = self.store

        def write() -> Message:
            msg = store.append_message(run.user, run.session_key, role="assistant",
                                       content="".join(run.partial), run_id=run.run_id, extra=extra)
            store.flush()  # the end of a run is a durability point under fsync="batch"
            return msg

        return await asyncio.to_thread(write)

    def _publish(self, run: Run, method: str, fields: dict[str, Any]) -> None:
        self.hub.publish(run.user, run.session_key, method, {**run.next_event(), **fields})

    def _publish_delta(self, run: Run, text: str) -> None:
        # The per-delta path of _publish: one dict built once, not two merged.
        self.hub.publish(run.user, run.session_key, "chat.delta", run.next_delta(text))

    def _log_run(self, run: Run, outcome: str, **fields: Any) -> None:
        log.info("chat.run", outcome=outcome, chars=sum(map(len, run.partial)), events=run.seq,
                 duration_s=round(time.monotonic() - run.started, 3), **fields)

    def _prune_idempotency(self, now: float) -> None:
        if len(self._idempotency) > 1000:
            for key in [k for k, a in self._idempotency.items() if a.expires <= now and a.outcome.done()]:
                del self._idempotency[key]


def _run_error(exc: Exception) -> GatewayError:
    """What a run failure says on the wire: the mapped error, or, for a bug, an internal
    error whose id matches the logged traceback (its text stays in the log)."""
    error = wire_error(exc)
    if error is None:
        error_id = new_error_id()
        log.error("chat.run_crash", error_id=error_id, exc_info=exc)
        error = InternalError(error_id)
    return error


def _event_error(error: GatewayError) -> ErrorObject:
    # chat.error's error object adds ``retryable`` beside code and message (docs/protocol.md).
    obj = error.to_object()
    obj["retryable"] = error.retryable
    return obj
