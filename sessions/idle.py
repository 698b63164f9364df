"""The checks of ``idle_sessions`` (the retention sweep's query), shared by both stores.

Both stores keep ``updatedAt`` as fixed-width millisecond strings (:mod:`sessions.models`), so
"updated before the cutoff" is a text comparison against one bound, made here so that the two
backends cannot draw the line a millisecond apart.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from .errors import InvalidSessionInput
from .keys import check_session_key, check_user
from .models import format_ts

__all__ = ["MAX_IDLE_PAGE", "idle_query"]

#: The largest ``limit`` of one ``idle_sessions`` page. Not ``max_page_size``: that bounds what
#: a client may ask for, and may be set as low as 1.
MAX_IDLE_PAGE = 1000

# Below every real pair: user names are never empty.
_START = ("", "")


def idle_query(cutoff: object, limit: object, after: object) -> tuple[str, int, tuple[str, str]]:
    """``(bound, limit, after)`` for the query ``updated_at < bound AND (user, key) > after``.

    The bound is ``cutoff`` (a datetime; naive means UTC) rounded *up* to the millisecond: a
    stored time is a whole millisecond, so ``stored < bound`` as text is exactly
    ``parse_ts(stored) < cutoff``. ``limit`` is from 1 to :data:`MAX_IDLE_PAGE`; ``after`` is the
    last pair of the previous page (None: from the start).
    """
    if not isinstance(cutoff, datetime):
        raise InvalidSessionInput("cutoff", "must be a datetime")
    try:
        bound = format_ts(cutoff + timedelta(microseconds=999))
    except OverflowError:
        raise InvalidSessionInput("cutoff", "is out of range") from None
    # bool is an int subclass; `limit=True` is a bug in the caller, not a page of 1.
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_IDLE_PAGE:
        raise InvalidSessionInput("limit", f"must be an integer from 1 to {MAX_IDLE_PAGE}")
    if after is None:
        return bound, limit, _START
    if not (isinstance(after, tuple) and len(after) == 2):
        raise InvalidSessionInput("after",
                                  "must be a (user, sessionKey) pair from the previous page")
    return bound, limit, (check_user(after[0]), check_session_key(after[1]))
