"""Compaction: what left a session's history window, summarised by the session's model.

The prompt holds the last ``chat.history_limit`` shown messages (fewer when they exceed the
token budget, :func:`gateway.chat.prompt.build_prompt`). After a run ends, off the reply's path,
:class:`Compactor` looks at the shown messages that have left that window and are not yet
covered by the session's summary; once there are at least ``chat.compaction_every`` of them it
asks the session's model, once, for an updated summary: the previous summary plus only those
messages (never everything again), bounded by ``chat.compaction_max_tokens``. The answer is kept
as the session's new summary line (``SessionStoreLike.append_summary``), which the next prompt
puts after the memory sections (``<conversation_summary>``).

Nothing here can fail or hold up a reply: the job runs in a task of its own, one per session at
a time, bounded by ``chat.compaction_timeout_s``; a failure is logged and the same messages are
tried at the next trigger. An incognito session is compacted too: the summary is its own model's
reading of its own transcript, kept in that transcript, never indexed or recalled elsewhere.
Each call is counted (:attr:`Compactor.calls`) and logged as one ``chat.compaction`` line.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass

import structlog

from gateway.chat.episodes import ModelSummarizer
from gateway.chat.llm import ChatModel
from gateway.chat.prompt import MESSAGE_OVERHEAD_TOKENS, message_tokens
from gateway.config import ChatConfig
from memory import CUT_MARK, SummarizerError, approx_tokens, trim_to_tokens
from sessions import ConversationSummary, Message, SessionError, SessionStoreLike, visible_messages

__all__ = ["COMPACTION_INSTRUCTION", "Compactor", "CompactionPlan", "plan_compaction"]

log = structlog.get_logger("recalld.chat")

# The system message of a summary request; testkit's fake model recognises requests by it.
COMPACTION_INSTRUCTION = (
    "You keep a running summary of one conversation between a user and an assistant. Rewrite the "
    "summary so far to also cover the new messages. Keep what may matter later: names, numbers, "
    "dates, codes, decisions, the user's requests, preferences and plans; drop small talk. Write "
    "plain sentences in the conversation's language and answer with the summary alone."
)
_PAGE = 100  # messages per history page read back to the previous summary
# How far back one job reads: a session imported with thousands of messages and no summary is
# caught up from the oldest messages within this many, a batch per run.
_MAX_SCAN = 5000


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """One summary call: the summary it updates and the messages it adds (oldest first)."""

    previous: ConversationSummary | None
    batch: list[Message]
    message_count: int  # the session's count when planned: a purge meanwhile lowers it

    @property
    def covered(self) -> int:
        return (self.previous.messages if self.previous is not None else 0) + len(self.batch)


def _shown(m: Message) -> bool:
    # What build_prompt leaves out of the history is no conversation to summarise either.
    return not m.extra.get("failed") and not (m.role == "assistant" and not m.content)


def _cost(m: Message) -> int:
    return message_tokens(m.content)


def _uncovered(store: SessionStoreLike, user: str, session_key: str,
               previous: ConversationSummary | None) -> list[Message]:
    """The session's messages after the previous summary's ``through`` (all when none), every
    line, superseded or not, oldest first: a suffix of the transcript, which
    ``visible_messages`` filters exactly."""
    found: list[Message] = []
    cursor: str | None = None
    while len(found) < _MAX_SCAN:
        page, cursor = store.history(user, session_key, limit=_PAGE, before=cursor)
        if previous is not None:
            at = next((i for i in range(len(page) - 1, -1, -1) if page[i].id == previous.through),
                      None)
            if at is not None:
                return page[at + 1:] + found
        found = page + found
        if cursor is None:
            break
    return found


def plan_compaction(config: ChatConfig, store: SessionStoreLike, user: str, session_key: str
                    ) -> CompactionPlan | None:
    """What to summarise now, or None when fewer than ``chat.compaction_every`` shown messages
    have left the window since the summary. Blocking: call it off the event loop."""
    session = store.get(user, session_key)
    previous = store.summary(user, session_key)
    shown = [m for m in visible_messages(_uncovered(store, user, session_key, previous))
             if _shown(m)]
    # The window as build_prompt fills it: the last history_limit messages within the budget
    # (the system prompt and a full summary spent first; recall's block is not known here).
    budget = (config.max_context_tokens - config.compaction_max_tokens
              - approx_tokens(session.system_prompt or ""))
    window = 0
    for m in reversed(shown[-config.history_limit:]):
        if window and _cost(m) > budget:
            break
        budget -= _cost(m)
        window += 1
    left = shown[: len(shown) - window]
    if len(left) < config.compaction_every:
        return None
    # One call's input stays within the prompt budget; what does not fit waits for the next run.
    batch: list[Message] = []
    spend = config.max_context_tokens - (approx_tokens(previous.content) if previous else 0)
    for m in left:
        if _cost(m) > spend:
            if not batch:  # one message larger than a call's input: its start stands for it,
                # or every later call would fail on it and nothing after it be summarised
                room = max(1, spend - MESSAGE_OVERHEAD_TOKENS)
                batch.append(dataclasses.replace(m, content=trim_to_tokens(m.content, room)))
            break
        spend -= _cost(m)
        batch.append(m)
    return CompactionPlan(previous, batch, session.message_count)


def summary_request(plan: CompactionPlan, max_tokens: int) -> list[dict[str, str]]:
    """The messages of one summary call: the instruction, then the summary so far and the new
    messages, one ``role: text`` paragraph each."""
    lines = "\n\n".join(f"{m.role}: {m.content}" for m in plan.batch)
    so_far = plan.previous.content if plan.previous is not None else "(none yet)"
    return [
        {"role": "system", "content": COMPACTION_INSTRUCTION},
        {"role": "user", "content": f"Keep the summary under {max_tokens * 3 // 4} words.\n\n"
                                    f"Summary so far:\n{so_far}\n\nNew messages:\n{lines}"},
    ]


class Compactor:
    """Starts a session's summary job after a run; every task it starts is tracked and ended by
    :meth:`close`. ``calls`` counts the summary calls made, ``failures`` those that failed."""

    def __init__(self, config: ChatConfig, store: SessionStoreLike, model: ChatModel | None,
                 default_model: str) -> None:
        self.config = config
        self.store = store
        self.model = model
        self.default_model = default_model  # asked when the session names none
        self.calls = 0
        self.failures = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._busy: set[tuple[str, str]] = set()

    @property
    def enabled(self) -> bool:
        return self.config.compaction and self.model is not None

    def after_run(self, user: str, session_key: str, session_model: str | None) -> None:
        """Look at the session in the background; at most one job per session at a time."""
        if not self.enabled or (user, session_key) in self._busy:
            return
        self._busy.add((user, session_key))
        task = asyncio.create_task(self._compact(user, session_key,
                                                 session_model or self.default_model))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def idle(self) -> None:
        """Wait for the jobs in flight (tests and benchmarks read the result after)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _compact(self, user: str, session_key: str, model_name: str) -> None:
        try:
            plan = await asyncio.to_thread(plan_compaction, self.config, self.store, user,
                                           session_key)
            if plan is None:
                return
            text = await self._ask(model_name, plan)
            if text:
                await asyncio.to_thread(self._keep, user, session_key, plan, text)
        except SessionError as exc:  # deleted meanwhile, or the disk refused the line
            log.warning("chat.compaction_not_saved", session=session_key, error=str(exc))
        finally:
            self._busy.discard((user, session_key))

    async def _ask(self, model_name: str, plan: CompactionPlan) -> str:
        assert self.model is not None
        self.calls += 1
        try:
            async with asyncio.timeout(self.config.compaction_timeout_s):
                answer = await ModelSummarizer(self.model, model_name).summarise(
                    summary_request(plan, self.config.compaction_max_tokens))
        except (SummarizerError, TimeoutError) as exc:
            self.failures += 1
            reason = "timeout" if isinstance(exc, TimeoutError) else str(exc)
            log.warning("chat.compaction", outcome="failed", error=reason, calls=self.calls)
            return ""
        # Within the bound, the cut mark included (memory's cut, the one recall's budget uses).
        budget = self.config.compaction_max_tokens - approx_tokens(CUT_MARK)
        text = trim_to_tokens(" ".join(answer.split()), budget)
        log.info("chat.compaction", outcome="ok" if text else "empty", messages=len(plan.batch),
                 covered=plan.covered, tokens=approx_tokens(text), calls=self.calls)
        return text

    def _keep(self, user: str, session_key: str, plan: CompactionPlan, text: str) -> None:
        """Append the summary unless a purge ran while the model wrote it (the count fell, or
        the summary it updates is gone): the text might hold what was forgotten."""
        session = self.store.get(user, session_key)
        current = self.store.summary(user, session_key)
        if session.message_count < plan.message_count or _id(current) != _id(plan.previous):
            log.info("chat.compaction_dropped", session=session_key, reason="transcript changed")
            return
        self.store.append_summary(user, session_key, content=text, through=plan.batch[-1].id,
                                  messages=plan.covered)


def _id(summary: ConversationSummary | None) -> str | None:
    return summary.id if summary is not None else None
