"""What a transcript shows once edits and regenerations are applied: superseded messages hidden.

The transcript is append-only, so replacing a message is one more line: a message whose
``replaces`` names an earlier message's id supersedes that message and every message after it
up to itself (docs/sessions.md, "Superseded messages"). A regenerated reply replaces the reply
before it; an edited user message replaces the old message and the reply that followed it. A
hidden message's own ``replaces`` still counts, so a second edit hides the first one's range too.

Whether a message is shown depends only on the lines after it, so filtering any suffix of a
transcript (``recent_messages``) is exact. A history page is not a suffix: :func:`visible_history`
reads on past a page whose oldest message sits inside a hidden range, and ends every page where
no range is open, so its cursor always resumes in a clean state. Both stores implement
``history``, so this works over either without a line of backend code.
"""

from __future__ import annotations

from collections.abc import Sequence

from .models import Message
from .protocol import SessionStoreLike

__all__ = ["CONTINUES_KEY", "REPLACES_KEY", "replaced_id", "retarget", "visible_history",
           "visible_messages"]

# The line key (in ``Message.extra``) naming the message a new one supersedes.
REPLACES_KEY = "replaces"
# Beside ``replaces`` on a reply ``chat.continue`` wrote: it is the reply it names, carried on
# past the length limit (its text starts with that reply's), not another version of it.
CONTINUES_KEY = "continues"


def replaced_id(message: Message) -> str | None:
    """The id this message supersedes, or None."""
    value = message.extra.get(REPLACES_KEY)
    return value if isinstance(value, str) else None


def retarget(order: Sequence[str], removed: set[str],
             targets: dict[str, str]) -> dict[str, str | None]:
    """What a purge must do to the ``replaces`` of the messages it keeps: a kept message whose
    target is removed would otherwise hide every message before it (its range never closes).

    ``order``: the transcript's message ids, oldest first; ``removed``: those the purge takes;
    ``targets``: kept message id → the id its ``replaces`` names. Answers kept id → the new
    target, the first kept message of the range it hid (so what it hid stays hidden), or None
    when nothing of that range is left (the key goes). Ranges whose target is kept are absent.
    """
    where = {mid: i for i, mid in enumerate(order)}
    out: dict[str, str | None] = {}
    for mid, target in targets.items():
        if target not in removed or target not in where or mid not in where:
            continue
        between = order[where[target] + 1:where[mid]]
        out[mid] = next((m for m in between if m not in removed), None)
    return out


class _Hider:
    """Walks messages newest first and says which are shown; ``open`` while a range is hidden."""

    def __init__(self) -> None:
        self.pending: set[str] = set()

    @property
    def open(self) -> bool:
        return bool(self.pending)

    def shown(self, message: Message) -> bool:
        hidden = bool(self.pending)
        self.pending.discard(message.id)
        target = replaced_id(message)
        if target is not None and target != message.id:
            self.pending.add(target)
        return not hidden


def visible_messages(messages: Sequence[Message]) -> list[Message]:
    """The shown messages of a transcript's suffix (oldest first in and out)."""
    hider = _Hider()
    shown = [m for m in reversed(messages) if hider.shown(m)]
    shown.reverse()
    return shown


def visible_history(store: SessionStoreLike, user: str, session_key: str, *, limit: int,
                    before: str | None = None) -> tuple[list[Message], str | None]:
    """Like ``store.history`` with superseded messages left out: at most ``limit`` shown
    messages, oldest first, and the cursor of the next (older) page.

    A page may hold fewer than ``limit`` messages (those hidden are not replaced by older
    ones), but holds at least one while any is left. Blocking: call it off the event loop.
    """
    hider = _Hider()
    shown: list[Message] = []  # newest first
    cursor = before
    while True:
        page, nxt = store.history(user, session_key, limit=limit, before=cursor)
        # Reading on only to close a range that the shown messages opened: end this page where
        # it closes, so the next cursor resumes where nothing is hidden (read again, shorter).
        closing = bool(shown)
        for i in range(len(page) - 1, -1, -1):
            if hider.shown(page[i]):
                shown.append(page[i])
            elif closing and not hider.open:
                if i > 0:
                    _, nxt = store.history(user, session_key, limit=len(page) - i, before=cursor)
                break
        if nxt is None or (shown and not hider.open):
            shown.reverse()
            return shown, nxt
        cursor = nxt
