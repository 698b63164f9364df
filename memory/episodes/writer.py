"""Writing episodes: after a run, off the request path, a dated summary of the conversation.

:meth:`EpisodeWriter.after_run` returns at once; a tracked task checks the rules (the session's
cooldown in user turns and minutes, the user's daily cap) and, when they pass, queues a job in
the index (durable) and works it. A job asks the chat model — or ``memory.summary_model`` on
the same endpoint — for strict JSON ``{"summary", "theme", "same_theme"}`` (or ``{"skip":
true}``) about the messages since the session's last episode, with the user's latest episode
shown so the model can say it continues it. Then: a summary too close to a recent episode
(``episode_novelty_threshold``) is dropped; one continuing the latest episode within
``episode_merge_hours`` is merged into it; otherwise it is a new episode, dated in
``chat.timezone``. Any failure (the model, bad JSON, the index) is logged and the job retried
later with a doubling wait, up to ``episode_max_attempts``; :meth:`run` retries due jobs,
including those left by an earlier process.

The model is the gateway's: it hands the writer a :class:`Summarizer` (its chat model, asked
with ``memory.summary_model`` or the default model) and the sessions store it reads from.
Whether a run may lead to an episode is the run's :class:`~memory.context.RunMemory`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import zoneinfo
from datetime import datetime
from typing import Protocol

import orjson
import structlog

from memory.config import MemoryConfig
from memory.episodes.values import EpisodeDraft, EpisodeJob
from memory.errors import MemoryIndexError, SummarizerError
from memory.protocols import EpisodesMemory
from sessions import Message, SessionError, SessionStoreLike, parse_ts

__all__ = ["SUMMARY_INSTRUCTIONS", "EpisodeWriter", "Summarizer"]

log = structlog.get_logger("recalld.episodes")

SUMMARY_INSTRUCTIONS = (
    "You keep the episodic memory of an assistant. Summarise the conversation below in one or two "
    "sentences: what the user and the assistant discussed, decided or did. Write in the user's "
    "language, about \"the user\". Answer with one JSON object and nothing else: "
    '{"summary": "...", "theme": "a topic of two to four words", "same_theme": true or false}, '
    "where same_theme says whether this continues the previous episode shown (then write the "
    'summary of both together). If nothing worth remembering happened, answer {"skip": true}.'
)
_HISTORY = 200  # messages read back to find those since the last episode
_TRANSCRIPT_CHARS = 8000  # the newest part of them sent to the model
_SUMMARY_CHARS = 600
_THEME_CHARS = 80
_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


class Summarizer(Protocol):
    """What writes an episode's summary: the gateway's chat model, one reply not streamed."""

    async def summarise(self, messages: list[dict[str, str]]) -> str:
        """The reply to ``messages``; raises :class:`~memory.errors.SummarizerError` when the
        model cannot answer (the job is then retried)."""
        ...


class WriterMemory(Protocol):
    """What the writer uses of the memory service: its settings and its episodes."""

    @property
    def config(self) -> MemoryConfig: ...

    @property
    def episodes(self) -> EpisodesMemory: ...


class EpisodeWriter:
    def __init__(self, memory: WriterMemory | None, model: Summarizer | None,
                 store: SessionStoreLike, timezone: str) -> None:
        self.memory = memory
        self.model = model
        self.store = store
        self.tz = zoneinfo.ZoneInfo(timezone)
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()  # one job at a time: the rules read what the last one wrote

    @property
    def enabled(self) -> bool:
        return self.memory is not None and self.model is not None and self.memory.config.episodes

    def after_run(self, user: str, session_key: str, write: bool) -> None:
        """Consider an episode for the session, in the background; ``write`` is the run's
        ``RunMemory.write_episodes``."""
        if not (self.enabled and write):
            return
        task = asyncio.create_task(self._consider(user, session_key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def run(self) -> None:
        """Retry due jobs now and then (failed summaries, jobs of a previous process)."""
        if not self.enabled:
            return
        assert self.memory is not None
        interval = max(0.05, min(60.0, self.memory.config.episode_retry_s))
        while True:
            await self.work_due()
            await asyncio.sleep(interval)

    async def wait_idle(self) -> None:
        """Wait for the background work started so far (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # -- rules ---------------------------------------------------------------------------

    async def _consider(self, user: str, session_key: str) -> None:
        memory = self.memory
        assert memory is not None
        try:
            if await self._eligible(memory, user, session_key):
                await memory.episodes.enqueue(user, session_key)
                await self.work_due()
        except (MemoryIndexError, SessionError) as exc:
            log.warning("episode.check_failed", session=session_key, error=str(exc))

    async def _eligible(self, memory: WriterMemory, user: str, session_key: str) -> bool:
        cfg = memory.config
        last = await memory.episodes.last_of_session(user, session_key)
        new = await self._since(user, session_key, last.covered_ms if last else None)
        turns = sum(1 for m in new if m.role == "user")
        if turns < cfg.episode_cooldown_turns:
            return False
        now_ms = int(time.time() * 1000)
        if last is not None and now_ms - last.updated_ms < cfg.episode_cooldown_minutes * 60_000:
            return False
        local_midnight = datetime.now(self.tz).replace(hour=0, minute=0, second=0, microsecond=0)
        if await memory.episodes.count_since(user, int(local_midnight.timestamp() * 1000)) \
                >= cfg.episode_daily_cap:
            log.info("episode.capped", session=session_key, cap=cfg.episode_daily_cap)
            return False
        return True

    async def _since(self, user: str, session_key: str, after_ms: int | None) -> list[Message]:
        messages = await asyncio.to_thread(self.store.recent_messages, user, session_key, _HISTORY)
        out = [m for m in messages if m.content and not m.extra.get("failed")]
        if after_ms is not None:
            out = [m for m in out if _ms(m.ts) > after_ms]
        return out

    # -- jobs ----------------------------------------------------------------------------

    async def work_due(self) -> None:
        memory = self.memory
        assert memory is not None
        async with self._lock:
            for job in await memory.episodes.due():
                await self._work(memory, job)

    async def _work(self, memory: WriterMemory, job: EpisodeJob) -> None:
        cfg = memory.config
        bound = structlog.contextvars.bound_contextvars(session=job.session_key)
        with bound:
            try:
                outcome, ended = await self._summarise(memory, job)
            except asyncio.CancelledError:
                raise
            except (MemoryIndexError, SessionError, ValueError) as exc:
                # A summarizer's error already names what failed in the model.
                error = (str(exc) if isinstance(exc, SummarizerError)
                         else f"{type(exc).__name__}: {exc}")
                with contextlib.suppress(MemoryIndexError):
                    gave_up = await memory.episodes.job_failed(job, error, cfg.episode_retry_s,
                                                               cfg.episode_max_attempts)
                    (log.error if gave_up else log.warning)(
                        "episode.failed", attempt=job.attempts + 1, gave_up=gave_up, error=error)
                return
            if not ended:  # a written episode ended its job in the write's own transaction
                await memory.episodes.job_done(job.id)
            log.info("episode.done", outcome=outcome)

    async def _summarise(self, memory: WriterMemory, job: EpisodeJob) -> tuple[str, bool]:
        """What became of the job, and whether that already ended it (an episode written)."""
        cfg = memory.config
        model = self.model
        assert model is not None
        last = await memory.episodes.last_of_session(job.user, job.session_key)
        new = await self._since(job.user, job.session_key, last.covered_ms if last else None)
        if not new:
            return "nothing new", False
        now = datetime.now(self.tz)
        latest, _ = await memory.episodes.page(job.user, limit=1, before=None)
        window_ms = cfg.episode_merge_hours * 3_600_000
        previous = (latest[0]
                    if latest and now.timestamp() * 1000 - latest[0].updated_ms <= window_ms
                    else None)
        answer = await model.summarise(_request(new, previous.text if previous else None,
                                                previous.theme if previous else None))
        parsed = _parse(answer)
        if parsed is None:
            return "skipped by the model", False
        summary, theme, same = parsed
        vector = await memory.episodes.embed(summary)
        merge_into = previous.id if same and previous is not None else None
        if merge_into is None and vector is not None:
            closest = await memory.episodes.closest(job.user, vector)
            if closest is not None and closest[1] >= cfg.episode_novelty_threshold:
                log.info("episode.not_novel", like=closest[0].id, similarity=round(closest[1], 4))
                return "not novel", False
        covered = max(_ms(m.ts) for m in new)
        # The job ends with the write, so no reader sees the episode beside a job still pending.
        draft = EpisodeDraft(job.user, job.session_key, summary, theme, now, covered, vector,
                             job_id=job.id)
        episode = await memory.episodes.write(draft, merge_into)
        return (f"merged into {episode.id}" if merge_into is not None
                else f"wrote {episode.id}"), True


def _request(messages: list[Message], previous: str | None,
             theme: str | None) -> list[dict[str, str]]:
    lines = [f"{m.role} [{m.ts[:16]}]: {' '.join(m.content.split())}" for m in messages]
    text = "\n".join(lines)[-_TRANSCRIPT_CHARS:]
    context = (f"Previous episode (theme: {theme}): {previous}\n\n" if previous
               else "Previous episode: none\n\n")
    return [{"role": "system", "content": SUMMARY_INSTRUCTIONS},
            {"role": "user", "content": f"{context}Conversation:\n{text}"}]


def _parse(answer: str) -> tuple[str, str, bool] | None:
    """The summary, theme and same_theme of a strict JSON answer; None for a skip; ValueError
    for anything else (the job is retried)."""
    try:
        obj = orjson.loads(_FENCE.sub("", answer.strip()))
    except orjson.JSONDecodeError:
        raise ValueError(f"summary is not JSON: {answer[:80]!r}") from None
    if not isinstance(obj, dict):
        raise ValueError("summary is not a JSON object")
    if obj.get("skip") is True:
        return None
    summary, theme = obj.get("summary"), obj.get("theme")
    if not isinstance(summary, str) or not summary.strip() or len(summary) > _SUMMARY_CHARS:
        raise ValueError("summary must be a non-empty string of at most 600 characters")
    if not isinstance(theme, str) or not theme.strip() or len(theme) > _THEME_CHARS:
        raise ValueError("theme must be a non-empty string of at most 80 characters")
    return " ".join(summary.split()), " ".join(theme.split()), obj.get("same_theme") is True


def _ms(ts: str) -> int:
    return int(parse_ts(ts).timestamp() * 1000)
