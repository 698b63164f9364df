"""Versions of a message (regenerate, edit, continue, choose), read from the append-only lines.

A line whose ``replaces`` names ``X`` (docs/sessions.md, "Superseded messages") is a new
*version* of the place ``X`` holds in the conversation: a regenerated reply is another version
of the reply it replaces, an edited user message another version of that message (the branch
after the old one stays in the transcript). Two kinds of line are the same version again, not
a new one: a reply ``chat.continue`` wrote (``continues``: the cut reply, longer) and a copy
``chat.choose`` wrote (``restores``: the version it makes current again).

Choosing is append-only too: :meth:`Versions.restore` answers the lines to append, a copy of
the chosen version (``replaces`` naming the version shown now, so it and what followed it are
hidden by the one rule of :mod:`sessions.supersede`) and copies of the branch that followed the
chosen version when it was last shown. Everything that follows the visible history (the
model's context, ``sessions.history``, the memory index) then sees the chosen branch, and no
reader needs to know about versions.

Pure functions over messages, so both stores share them (:func:`read_all` pages either's
``history``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .models import Message
from .protocol import SessionStoreLike
from .supersede import CONTINUES_KEY, REPLACES_KEY, replaced_id, visible_messages

__all__ = ["RESTORES_KEY", "Restore", "Versions", "read_all"]

# On a line chat.choose wrote: the id of the version (or branch message) it is a copy of.
RESTORES_KEY = "restores"
# Keys a copy does not take over from the line it copies: its own supersession is new.
_NOT_COPIED = frozenset({REPLACES_KEY, CONTINUES_KEY, RESTORES_KEY})
_PAGE = 200  # the default sessions.max_page_size; history pages only, any size works


def read_all(store: SessionStoreLike, user: str, session_key: str) -> list[Message]:
    """Every message line of a session, superseded or not, oldest first (blocking)."""
    out: list[Message] = []
    cursor: str | None = None
    while True:
        page, cursor = store.history(user, session_key, limit=_PAGE, before=cursor)
        out = page + out
        if cursor is None:
            return out


@dataclass(frozen=True, slots=True)
class Restore:
    """One line :meth:`Versions.restore` asks to append."""

    role: str
    content: str
    name: str | None
    extra: dict[str, Any]


class Versions:
    """The versions of every message of one transcript (``messages``: all lines, oldest first)."""

    def __init__(self, messages: Sequence[Message]) -> None:
        self.messages = list(messages)
        self.pos = {m.id: i for i, m in enumerate(self.messages)}
        self.by_id = {m.id: m for m in self.messages}
        # version id → its place (the id of the first version there); place → its versions.
        self.place: dict[str, str] = {}
        self.members: dict[str, list[str]] = {}
        for m in self.messages:
            if self.canon(m.id) != m.id:
                continue  # a continuation or a copy: a form of an earlier version
            target = replaced_id(m)
            place = (self.place.get(self.canon(target), m.id)
                     if target in self.pos and target != m.id else m.id)
            self.place[m.id] = place
            self.members.setdefault(place, []).append(m.id)

    def canon(self, mid: str | None) -> str:
        """The version a line is a form of: itself, or what it continues or restores."""
        seen: set[str] = set()
        while mid is not None and mid in self.by_id and mid not in seen:
            seen.add(mid)
            extra = self.by_id[mid].extra
            nxt = extra.get(RESTORES_KEY) or extra.get(CONTINUES_KEY)
            if not isinstance(nxt, str) or nxt not in self.by_id:
                return mid
            mid = nxt
        return mid or ""

    def of(self, mid: str) -> list[str]:
        """The version ids of the place ``mid`` (any form of a version) holds, oldest first."""
        version = self.canon(mid)
        return self.members.get(self.place.get(version, version), [version])

    def latest(self, version: str) -> Message:
        """The newest line that is a form of ``version`` (a continued reply's whole text)."""
        return next(m for m in reversed(self.messages) if self.canon(m.id) == version)

    def mark(self, mid: str) -> tuple[int, int, list[str]] | None:
        """``(index from 1, count, version ids)`` when the place of ``mid`` has several versions."""
        ids = self.of(mid)
        if len(ids) < 2:
            return None
        return ids.index(self.canon(mid)) + 1, len(ids), ids

    def restore(self, chosen: str) -> list[Restore] | None:
        """The lines that make version ``chosen`` (any form of it) and its branch current
        again; ``[]`` when it is current already, None when no version of its place is shown."""
        version = self.canon(chosen)
        ids = self.of(version)
        shown = visible_messages(self.messages)
        current = next((m for m in shown if self.canon(m.id) in ids), None)
        if current is None:
            return None
        if self.canon(current.id) == version:
            return []
        last = self.latest(version)
        p = self.pos[last.id]
        # The line that hid it: the first later one whose range starts at or before it.
        end = next((j for j in range(p + 1, len(self.messages))
                    if (t := replaced_id(self.messages[j])) in self.pos and self.pos[t] <= p),
                   len(self.messages))
        branch = [m for m in visible_messages(self.messages[:end]) if self.pos[m.id] > p]
        out = [self._copy(last, version, {REPLACES_KEY: current.id})]
        out += [self._copy(m, self.canon(m.id), {}) for m in branch]
        return out

    @staticmethod
    def _copy(m: Message, version: str, extra: dict[str, Any]) -> Restore:
        kept = {k: v for k, v in m.extra.items() if k not in _NOT_COPIED}
        return Restore(m.role, m.content, m.name, {**kept, **extra, RESTORES_KEY: version})
