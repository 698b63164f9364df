"""Executing one admitted run: its prompt, the model's stream, its end.

:class:`RunExecutor` is the half of :class:`gateway.chat.runs.ChatRuns` after admission: by
the time it has a run, the run's user message is appended (or, for a regenerate, found), its
idempotency key claimed and its place in the session's lane taken. It builds the prompt (the
session, recall, facts, episodes: :func:`gateway.chat.prompt.build_prompt`), streams the reply
through the memory tools as ``chat.delta`` events, and hands the end to
:class:`gateway.chat.finish.RunEnds` (the line, the terminal event, what follows a reply).
Cancelling the run's task (``chat.abort``) closes the upstream stream and ends it aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from gateway.chat.finish import RunEnds, run_error
from gateway.chat.gate import run_leased
from gateway.chat.lanes import Run
from gateway.chat.llm import ChatModel, Completion, SampledModel, Sampling, TextDelta
from gateway.chat.memory_tools import MemoryTools
from gateway.chat.prompt import build_prompt
from gateway.config import ChatConfig
from gateway.errors import NotConfigured
from memory import Memory, SearchHit
from sessions import AttachmentFiles, Session, SessionStoreLike

__all__ = ["ModelBounds", "RunExecutor"]

# While streaming, give connection writers a turn at least this often: the deltas published in
# between leave as one merged chat.delta (docs/protocol.md), a frame and a send() per connection
# saved each, and 8 ms is half a 60 Hz screen frame. A real model's deltas each await its socket.
_YIELD_EVERY_S = 0.008


class ModelBounds:
    """What the operator allows a run to go out with, checked at admission and again when the
    run starts (a session's model may leave the list while its run is queued)."""

    __slots__ = ("max_temperature", "max_tokens_limit", "models", "vision_models")

    def __init__(self, models: tuple[str, ...] | None, max_temperature: float | None,
                 max_tokens_limit: int | None, vision_models: tuple[str, ...]) -> None:
        # The models a run may go out on (LlmConfig.choices); None: any. Checked at every run,
        # not only at sessions.create: the operator may have taken a session's model off the list.
        self.models = models
        # llm.max_temperature / llm.max_tokens_limit, applied at every run: a session that chose
        # more before the operator lowered them goes out with the bound.
        self.max_temperature = max_temperature
        self.max_tokens_limit = max_tokens_limit
        # llm.vision_models: the models given images; an image for any other is refused at send.
        self.vision_models = vision_models

    def check_model(self, model: str | None) -> None:
        if model is not None and self.models is not None and model not in self.models:
            raise NotConfigured(f"this session's model {model!r} is no longer offered here "
                                f"(llm.models: {list(self.models)}); start a new session to go on")

    def sampling(self, session: Session) -> Sampling:
        """The session's temperature and max tokens within the operator's bounds now."""
        temperature, max_tokens = session.temperature, session.max_tokens
        if temperature is not None and self.max_temperature is not None:
            temperature = min(temperature, self.max_temperature)
        if max_tokens is not None and self.max_tokens_limit is not None:
            max_tokens = min(max_tokens, self.max_tokens_limit)
        return Sampling(temperature, max_tokens)


class RunExecutor:
    """Runs an admitted run to its end (see the module docstring)."""

    def __init__(self, config: ChatConfig, default_model: str, store: SessionStoreLike,
                 model: ChatModel | None, memory: Memory, ends: RunEnds, bounds: ModelBounds,
                 files: AttachmentFiles | None) -> None:
        self.config = config
        self.default_model = default_model
        self.store = store
        self.model = model
        self.memory = memory
        self.memory_tools = MemoryTools(memory, config.recall_k, config.max_tool_rounds)
        self.ends = ends
        self.bounds = bounds
        self.files = files

    async def leased(self, run: Run) -> None:
        """The run holding its session's lease across nodes (its ticket), then executed."""
        assert run.ticket is not None
        await run_leased(run.ticket, lambda: self.execute(run),
                         aborted=lambda: self.ends.aborted(run, self.default_model),
                         failed=lambda exc: self.ends.failed(run, self.default_model,
                                                             run_error(exc)))

    async def execute(self, run: Run) -> None:
        model = self.model
        assert model is not None  # admission refuses runs without a model
        bound = structlog.contextvars.bound_contextvars(session=run.session_key, run=run.run_id)
        with bound:
            hits: Sequence[SearchHit] = ()
            usage: dict[str, Any] | None = None
            finish: str | None = None
            model_name = self.default_model
            try:
                # What memory does for the run is decided once, when build_prompt has read the
                # session (RunMemory); the tools and the episode writer read that decision.
                read, run.prefetched = run.prefetched, None
                prompt = await build_prompt(self.config, self.store, self.memory, run.user,
                                            run.session_key, run.message, run.run_id, read,
                                            recall=run.recall, tools=model.supports_tools,
                                            own_id=run.answers,
                                            carry_on=("".join(run.partial) if run.continues
                                                      else None),
                                            images=self._images(run))
                run.memory, run.session = prompt.memory, prompt.session
                self.bounds.check_model(prompt.session.model)  # never sent upstream,
                                                               # even if queued before
                hits = prompt.context.chunks
                model_name = prompt.session.model or model_name
                # aclosing: whatever ends the loop, the upstream stream is closed at once.
                yielded_at = 0.0
                tools = self.memory_tools.begin(run.user, run.session_key, run.run_id,
                                                prompt.memory, prompt.context, prompt.shown)
                sampled = SampledModel(model, self.bounds.sampling(prompt.session))
                async with contextlib.aclosing(tools.stream(sampled, prompt.messages,
                                                            model_name)) as events:
                    async for event in events:
                        if isinstance(event, TextDelta):
                            text = event.text
                            if text:
                                run.partial.append(text)
                                self.ends.publish_delta(run, text)
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
                await self.ends.aborted(run, model_name)
                raise
            except Exception as exc:
                await self.ends.failed(run, model_name, run_error(exc))
                return
            await self.ends.ok(run, model_name, usage, finish, hits)

    def _images(self, run: Run) -> Callable[[Session], Callable[[str, str], bytes] | None]:
        """How the prompt reads the images of the run's session once it knows the session: only
        when its model takes them (llm.vision_models)."""
        files = self.files

        def reader(session: Session) -> Callable[[str, str], bytes] | None:
            if (files is None
                    or (session.model or self.default_model) not in self.bounds.vision_models):
                return None
            return lambda key, sha: files.get(run.user, key, sha)

        return reader
