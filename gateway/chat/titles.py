"""Session metadata changes and who hears of them; the model-written title after a first reply.

:func:`update_session` is the one path that changes a session's title or system prompt and
tells the user's watching connections (``sessions.updated``): ``sessions.update`` calls it, and
so does :class:`Titler` when it names a session. After a reply completes in a session still
titled ``DEFAULT_TITLE``, the titler asks the chat model for a few words in a task of its own
(the reply's ``chat.final`` never waits for it), bounded by ``chat.title_timeout_s``; when the
model fails, times out or answers nothing usable, the title is cut from the first message.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import structlog

from gateway.chat.hub import ALL_SESSIONS, Hub
from gateway.chat.llm import ChatModel
from gateway.config import ChatConfig
from gateway.wire import SessionWire, session_wire
from sessions import DEFAULT_TITLE, Session, SessionError, SessionStoreLike, plain_title

__all__ = ["TITLE_INSTRUCTION", "TITLE_MAX_CHARS", "Titler", "announce", "heuristic_title",
           "update_session"]

log = structlog.get_logger("recalld.chat")

# The system message of a title request; testkit's fake model recognises requests by it.
TITLE_INSTRUCTION = ("Write a short title (2 to 6 words) for the conversation below. Answer with "
                     "the title alone: no quotes, no final period.")
TITLE_MAX_CHARS = 60  # a sidebar line; the store's max_title_chars bounds it too
_EXCHANGE_CHARS = 2000  # of each message shown to the model: the start says what it is about


def announce(hub: Hub, user: str, session_key: str, method: str, fields: dict[str, Any]) -> None:
    """Tell every connection of the user that called ``sessions.watch``."""
    hub.publish(user, ALL_SESSIONS, method, {"sessionKey": session_key, **fields})


async def update_session(store: SessionStoreLike, hub: Hub, user: str, session_key: str, *,
                         title: str | None = None, system_prompt: str | None = None) -> SessionWire:
    session = await asyncio.to_thread(store.update, user, session_key, title=title,
                                      system_prompt=system_prompt)
    wire = session_wire(session)
    announce(hub, user, session_key, "sessions.updated", {"session": wire})
    return wire


# Markdown marks a title would show literally: links keep their text; emphasis, code and
# heading marks go (sidebars show titles as plain text).
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_MARKS = re.compile(r"(\*\*|__|\*|`|~~)|^#+\s*")


def plain(text: str) -> str:
    """``text`` without the markdown marks a title must not show."""
    return _MARKS.sub("", _LINK.sub(r"\1", text))


def heuristic_title(text: str, max_chars: int = TITLE_MAX_CHARS) -> str:
    """The first line of ``text`` as plain text, whitespace collapsed, cut at a word near
    ``max_chars``."""
    # plain_title: no control character (pasted terminal output's escapes) reaches the store,
    # which would refuse the title.
    line = plain_title(plain(next((ln for ln in text.splitlines() if ln.strip()), ""))) or ""
    if len(line) <= max_chars:
        return line or DEFAULT_TITLE
    cut = line[: max_chars - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > max_chars // 3 else cut).rstrip() + "…"


def clean_title(answer: str) -> str:
    """The model's answer as a title: its first line, without quotes, a label or a final period."""
    line = " ".join(next((ln for ln in answer.splitlines() if ln.strip()), "").split())
    if line.lower().startswith("title:"):
        line = line[6:].strip()
    line = plain(line).strip("\"'“”‘’ ").rstrip(".").strip()
    return heuristic_title(line) if line else ""


class Titler:
    """Names sessions after their first reply; every task it starts is tracked and ended by
    :meth:`close`."""

    def __init__(self, config: ChatConfig, store: SessionStoreLike, hub: Hub,
                 model: ChatModel | None, default_model: str) -> None:
        self.config = config
        self.default_model = default_model  # asked when the session names none
        self.store = store
        self.hub = hub
        self.model = model
        self._tasks: set[asyncio.Task[None]] = set()
        self._naming: set[tuple[str, str]] = set()

    def after_reply(self, session: Session, question: str, reply: str) -> None:
        """Start naming ``session`` (as the run read it) when its title is still the default."""
        user, session_key = session.user, session.session_key
        if (not self.config.auto_title or session.title != DEFAULT_TITLE
                or (user, session_key) in self._naming):
            return
        self._naming.add((user, session_key))
        model_name = session.model or self.default_model
        task = asyncio.create_task(self._name(user, session_key, model_name, question, reply))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _name(self, user: str, session_key: str, model_name: str, question: str,
                    reply: str) -> None:
        try:
            title = await self._ask(model_name, question, reply)
            source = "model"
            if not title:
                title, source = heuristic_title(question), "heuristic"
            # Read again just before writing: a rename meanwhile is the user's choice and wins.
            current = await asyncio.to_thread(self.store.get, user, session_key)
            if current.title != DEFAULT_TITLE or title == DEFAULT_TITLE:
                return
            await update_session(self.store, self.hub, user, session_key, title=title)
            log.info("chat.titled", session=session_key, source=source)
        except SessionError as exc:  # deleted meanwhile, or the disk refused the line
            log.warning("chat.title_not_saved", session=session_key, error=str(exc))
        finally:
            self._naming.discard((user, session_key))

    async def _ask(self, model_name: str, question: str, reply: str) -> str:
        if self.model is None:
            return ""
        exchange = f"User: {question[:_EXCHANGE_CHARS]}\n\nAssistant: {reply[:_EXCHANGE_CHARS]}"
        try:
            async with asyncio.timeout(self.config.title_timeout_s):
                answer = await self.model.complete(
                    [{"role": "system", "content": TITLE_INSTRUCTION},
                     {"role": "user", "content": exchange}],
                    model=model_name)
        except TimeoutError:
            log.info("chat.title_fallback", reason="timeout")
            return ""
        except Exception as exc:  # any model failure falls back to the heuristic
            log.info("chat.title_fallback", reason=type(exc).__name__)
            return ""
        return clean_title(answer)
