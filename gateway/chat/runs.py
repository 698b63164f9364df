"""Chat runs: one FIFO queue and worker per busy session, driven by ``chat.send``/``chat.abort``
and, into an idle session, ``chat.regenerate``/``chat.edit``.

A run is: append the user message (none for a regenerate) → build the prompt (system prompt,
recalled memories, recent shown history trimmed to a budget) → stream the model's reply as
``chat.delta`` events → append the assistant message → ``chat.final``. How a run ends (its
line and terminal event, whether or not anyone is still connected) is
:mod:`gateway.chat.finish`'s.

Ordering: :meth:`ChatRuns.submit` takes the session's append lock before its first
suspension point (and the ``chat.send`` handler awaits nothing before calling it), and
``asyncio.Lock`` wakes waiters in FIFO order, so user messages reach the transcript and the
run queue in arrival order. Each run executes in its own task so that ``chat.abort`` can
cancel exactly that run (which closes the upstream stream) without touching the worker.
Every event takes the run's next ``seq`` in one place (``RunEnds.publish``).

Two halves meet here: :class:`~gateway.chat.admission.Admission` decides whether a send is a
repeat and whether there is room for its run (idempotency, quotas, the cluster gate);
:class:`~gateway.chat.execution.RunExecutor` runs an admitted run (prompt, stream, end). This
module holds what lies between: the lanes, what each kind of send appends, aborts, shutdown.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from gateway.chat.admission import Admission, IdemKey
from gateway.chat.attachments import Upload, line_meta, pdf_text
from gateway.chat.compaction import Compactor
from gateway.chat.episodes import ModelSummarizer
from gateway.chat.execution import ModelBounds, RunExecutor
from gateway.chat.finish import RunEnds
from gateway.chat.gate import LoneGate, RunGate, close_soon
from gateway.chat.hub import Hub
from gateway.chat.lanes import Attempt, Run, SessionLane
from gateway.chat.llm import ChatModel
from gateway.chat.memory_tools import MemoryTools
from gateway.chat.prompt import SessionRead, read_session
from gateway.chat.titles import Titler
from gateway.config import ChatConfig
from gateway.errors import Conflict, GatewayError, InvalidParams, NotConfigured
from gateway.wire import LiveRun
from memory import EpisodeWriter, Memory
from sessions import (
    REPLACES_KEY,
    AttachmentFiles,
    Message,
    SessionStoreLike,
    Versions,
    read_all,
    visible_history,
)

__all__ = ["ChatRuns", "Run"]

log = structlog.get_logger("recalld.chat")

# What a run's prompt was read from when it was queued into an idle session (see _enqueue).
Prefetched = SessionRead | None


class ChatRuns:
    """Every session's run queue; what ``chat.send``/``chat.abort`` and shutdown drive."""

    def __init__(self, config: ChatConfig, default_model: str, store: SessionStoreLike, hub: Hub,
                 model: ChatModel | None, memory: Memory, *,
                 max_runs: int | None = None, max_runs_per_user: int | None = None,
                 gate: RunGate | None = None, models: tuple[str, ...] | None = None,
                 max_temperature: float | None = None, max_tokens_limit: int | None = None,
                 vision_models: tuple[str, ...] = ()) -> None:
        self.config = config
        # Where chat.send's files are kept: the store's (files beside the transcripts, or a
        # PostgreSQL table); None for a store without any, which refuses attachments.
        found = getattr(store, "attachments", None)
        self.files: AttachmentFiles | None = found if isinstance(found, AttachmentFiles) else None
        self.bounds = ModelBounds(models, max_temperature, max_tokens_limit, vision_models)
        # Other nodes on one database (gateway.chat.gate); a node alone has the LoneGate.
        self.admission = Admission(config, gate if gate is not None else LoneGate(),
                                   max_runs=max_runs, max_runs_per_user=max_runs_per_user)
        self.default_model = default_model
        self.store = store
        self.hub = hub
        self.memory = memory
        summarizer = (ModelSummarizer(model, memory.config.summary_model or default_model)
                      if model is not None and memory.config.enabled else None)
        self.episodes = EpisodeWriter(memory, summarizer, store, config.timezone)
        self.titler = Titler(config, store, hub, model, default_model)
        self.compactor = Compactor(config, store, model, default_model)
        self.ends = RunEnds(store, hub, memory, self.episodes, self.titler, self.compactor)
        self.executor = RunExecutor(config, default_model, store, model, memory, self.ends,
                                    self.bounds, self.files)
        self._lanes: dict[tuple[str, str], SessionLane] = {}
        self._closing = False

    @property
    def model(self) -> ChatModel | None:
        """The chat model runs go out on (None: none configured, and sends are refused)."""
        return self.executor.model

    @model.setter
    def model(self, model: ChatModel | None) -> None:
        self.executor.model = model

    @property
    def gate(self) -> RunGate:
        """What this node asks of the others (admission's): the cluster's, or the LoneGate."""
        return self.admission.gate

    @property
    def memory_tools(self) -> MemoryTools:
        return self.executor.memory_tools

    async def submit(self, user: str, session_key: str, message: str,
                     idempotency_key: str | None, *, recall: bool = True,
                     uploads: Sequence[Upload] = ()) -> tuple[str, bool]:
        """Append the user message and queue its run; returns (runId, whether it is a
        duplicate of an earlier send with the same idempotency key)."""
        self._check_open()
        idem: IdemKey | None = (user, session_key, idempotency_key) if idempotency_key else None
        if (earlier := await self.admission.repeated(idem)) is not None:
            return earlier, True
        run_id = secrets.token_hex(8)
        if (owner := await self.admission.claimed_by(idem, run_id)) is not None:
            return owner, True
        lane = await self._lane(user, session_key, idem, run_id)
        run = Run(run_id, user, session_key, message, recall=recall, uploads=tuple(uploads))
        attempt = self.admission.attempt(idem, run.run_id)
        await self._enqueue(lane, run, lambda read: self._prepare_send(run, read), idem, attempt)
        return run.run_id, False

    async def resend(self, user: str, session_key: str, text: str | None, *, recall: bool = True,
                     carry_on: bool = False, edits: str | None = None) -> str:
        """``chat.regenerate`` (``text`` None: answer the last user message again, the new reply
        superseding the last one), ``chat.edit`` (append ``text`` superseding the last user
        message and its reply, then answer it) or, with ``carry_on``, ``chat.continue`` (the
        last reply, cut at the length limit, written on). ``edits``: the id of the shown user
        message an edit replaces (default the last): what followed it leaves the shown history.
        Only into an idle session; returns the runId."""
        self._check_open()
        if (user, session_key) in self._lanes:
            raise Conflict("session busy: a reply is being written; wait for it or chat.abort it")
        run_id = secrets.token_hex(8)
        lane = await self._lane(user, session_key, None, run_id)
        run = Run(run_id, user, session_key, text or "", recall=recall)
        await self._enqueue(lane, run,
                            lambda read: self._prepare_resend(run, text, read, carry_on, edits),
                            None, None)
        return run.run_id

    async def choose(self, user: str, session_key: str, message_id: str) -> list[Message]:
        """``chat.choose``: append the lines that make version ``message_id`` of a message (and
        the branch that followed it) the shown one again (``sessions.Versions.restore``); the
        lines appended, none when it is shown already. Only into an idle session, and holding
        its append lock, so a send arriving meanwhile is written after these lines."""
        if (user, session_key) in self._lanes:
            raise Conflict("session busy: a reply is being written; wait for it or chat.abort it")
        lane = self._lanes[(user, session_key)] = SessionLane()
        lane.submitters += 1
        try:
            async with lane.append_lock:
                written = await asyncio.to_thread(self._restore, user, session_key, message_id)
        finally:
            lane.submitters -= 1
            self._forget_if_idle(user, session_key, lane)
        if written:
            self.memory.nudge()  # the index follows the shown branch
                                 # (a new ``replaces`` re-cuts it)
        return written

    def _restore(self, user: str, session_key: str, message_id: str) -> list[Message]:
        marks = Versions(read_all(self.store, user, session_key))
        if message_id not in marks.by_id:
            raise InvalidParams("messageId", "is not a message of this session")
        lines = marks.restore(message_id)
        if lines is None:
            raise Conflict("nothing to choose: no version of that message is shown now")
        written = [self.store.append_message(user, session_key, role=r.role, content=r.content,
                                             name=r.name, extra=r.extra) for r in lines]
        if written:
            self.store.flush()
        return written

    def _check_open(self) -> None:
        if self.model is None:
            raise NotConfigured(
                "no chat model is configured: set llm.base_url (or OPENAI_BASE_URL) for a local "
                "server such as Ollama, or llm.api_key (or OPENAI_API_KEY) for OpenAI"
            )
        if self._closing:
            raise Conflict("the gateway is shutting down")

    async def _lane(self, user: str, session_key: str, idem: IdemKey | None,
                    run_id: str) -> SessionLane:
        lane = self._lanes.get((user, session_key))
        try:
            # A send to a session already busy only queues: it adds no concurrent run.
            self.admission.check_room(self._lanes.keys(), lane, user)
        except GatewayError:
            await self.admission.undo(None, idem, run_id)  # a refused send claims no key
            raise
        if lane is None:
            lane = self._lanes[(user, session_key)] = SessionLane()
        return lane

    async def _enqueue(self, lane: SessionLane, run: Run, prepare: Callable[[bool], Prefetched],
                       idem: IdemKey | None, attempt: Attempt | None) -> None:
        """Write what the run answers (``prepare``, in a worker thread) and queue the run."""
        user, session_key = run.user, run.session_key
        lane.submitters += 1
        try:
            async with lane.append_lock:
                # A run queued into an idle session starts at once, and nothing else appends
                # to its transcript before it does (a later send's message comes after its own,
                # where its history stops), so the prompt's read joins this thread hop: one
                # hop fewer before the model's first byte. (A sessions.update or memory.forget
                # landing in between is ordered after the run's read, as it would be a moment
                # later had the run read it itself.)
                # Live across nodes before its message exists (no ticket on a node alone).
                run.ticket = await self.gate.ticket(user, session_key, run.run_id)
                idle = lane.current is None and not lane.queue and run.ticket is None
                run.prefetched = await asyncio.to_thread(prepare, idle)
                lane.queue.append(run)
        except BaseException:
            self.admission.settle(idem, attempt, appended=False)
            await self.admission.undo(run.ticket, idem, run.run_id)
            lane.submitters -= 1
            self._forget_if_idle(user, session_key, lane)
            raise
        lane.submitters -= 1
        self.admission.settle(idem, attempt, appended=True)
        if lane.worker is None or lane.worker.done():
            lane.worker = asyncio.create_task(self._work(user, session_key, lane))

    def _prepare_send(self, run: Run, read: bool) -> Prefetched:
        """A chat.send's message appended (see _append_user), unless its session's model is no
        longer offered: then nothing is. Runs in a worker thread."""
        model = self.store.get(run.user, run.session_key).model
        self.bounds.check_model(model)
        extra = self._store_uploads(run, model or self.default_model) if run.uploads else None
        return self._append_user(run, read, extra)

    def _store_uploads(self, run: Run, model: str) -> dict[str, Any]:
        """Check the run's attachments against the session (its backend, its model), read
        PDFs' text and store each file; the line's ``attachments`` metadata. Worker thread."""
        files = self.files
        if files is None:
            raise InvalidParams("attachments", "are not kept by this gateway's session store")
        vision = self.bounds.vision_models
        if any(u.kind == "image" for u in run.uploads) and model not in vision:
            raise InvalidParams("attachments", f"this model ({model}) does not take images; the "
                                f"models that do are llm.vision_models ({list(vision)})")
        uploads = [pdf_text(i, u, self.config) if u.kind == "pdf" else u
                   for i, u in enumerate(run.uploads)]
        return {"attachments": [line_meta(u, files.put(run.user, run.session_key, u.data))
                                for u in uploads]}

    def _append_user(self, run: Run, read: bool, extra: dict[str, Any] | None = None) -> Prefetched:
        """Append the run's user message; with ``read``, then read what its prompt needs.
        Runs in a worker thread."""
        self.store.append_message(run.user, run.session_key, role="user", content=run.message,
                                  run_id=run.run_id, extra=extra)
        if not read:
            return None
        try:
            return read_session(self.config, self.store, run.user, run.session_key)
        except Exception:
            # The message is written and its run must be queued: the run reads again when it
            # starts and reports what fails then, as it would have without this read.
            return None

    def _prepare_resend(self, run: Run, text: str | None, read: bool, carry_on: bool = False,
                        edits: str | None = None) -> Prefetched:
        """Find what a regenerate, an edit or a continue replaces in the shown messages and, for
        an edit, append the new user line. Runs in a worker thread."""
        self.bounds.check_model(self.store.get(run.user, run.session_key).model)
        # The shown messages back to the last user message, however much was superseded between.
        recent: list[Message] = []
        cursor: str | None = None
        while not any(m.role == "user" and edits in (None, m.id) for m in recent):
            page, cursor = visible_history(self.store, run.user, run.session_key, limit=4,
                                           before=cursor)
            recent = page + recent
            if cursor is None:
                break
        last_user = next((m for m in reversed(recent) if m.role == "user"), None)
        if text is not None:
            # An earlier one forks: its replaces hides it and all after it (they stay browsable
            # as the other version of that message, sessions.versions).
            edited = last_user if edits is None else next(
                (m for m in recent if m.role == "user" and m.id == edits), None)
            if edited is None:
                raise Conflict("nothing to edit: "
                               + ("the session has no message of yours" if edits is None
                                  else "that id is not a shown message of yours"))
            extra: dict[str, Any] = {REPLACES_KEY: edited.id}
            if "attachments" in edited.extra:  # an edit changes the text; the files stay attached
                extra["attachments"] = edited.extra["attachments"]
            return self._append_user(run, read, extra)
        if not recent or recent[-1].role != "assistant" or last_user is None:
            what = "continue" if carry_on else "regenerate"
            raise Conflict(f"nothing to {what}: the session's last message is not a reply")
        reply = recent[-1]
        if carry_on:
            if reply.extra.get("finishReason") != "length":
                raise Conflict(
                    "nothing to continue: the last reply did not stop at the length limit")
            # The new line holds the whole reply (append-only: it supersedes the cut one), so
            # the run's text so far starts with it; only the new text streams as chat.delta.
            run.continues = reply.id
            run.partial.append(reply.content)
        run.message, run.answers, run.replaces = last_user.content, last_user.id, reply.id
        return read_session(self.config, self.store, run.user, run.session_key) if read else None

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
                self.ends.publish(run, "chat.aborted", {"partial": ""})
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
        workers = [lane.worker for lane in self._lanes.values()
                   if lane.worker and not lane.worker.done()]
        if workers:
            _, pending = await asyncio.wait(workers, timeout=grace_s)
            if pending:
                log.warning("chat.drain_timeout", aborting=len(pending))
                for lane in list(self._lanes.values()):
                    for run in list(lane.queue):
                        self._abort_in(lane, run.run_id)
                    self._abort_in(lane, None)
                await asyncio.gather(*pending, return_exceptions=True)
        await self.titler.close()
        await self.compactor.close()
        await self.episodes.close()
        if self.model is not None:
            await self.model.close()

    # -- runs ----------------------------------------------------------------------------

    async def _work(self, user: str, session_key: str, lane: SessionLane) -> None:
        try:
            while lane.queue:
                run = lane.queue.popleft()
                lane.current = run
                work = (self.executor.execute(run) if run.ticket is None
                        else self.executor.leased(run))
                run.task = asyncio.create_task(work)
                await asyncio.wait([run.task])
                lane.current = None
        finally:
            lane.current = None
            self._forget_if_idle(user, session_key, lane)

    def _forget_if_idle(self, user: str, session_key: str, lane: SessionLane) -> None:
        """Drop an idle lane so the map only holds sessions with work in flight."""
        if lane.queue or lane.current is not None or lane.submitters:
            return
        worker = lane.worker
        if worker is not None and not worker.done() and worker is not asyncio.current_task():
            return
        if self._lanes.get((user, session_key)) is lane:
            del self._lanes[(user, session_key)]
