"""What ``memory.forget`` names (:class:`ForgetRange`) and where retention cuts
(:func:`retention_cutoff_ms`), on either backend.

A plain value with no storage behind it, so :mod:`memory.protocols` and both backends
(:mod:`memory.sqlite.forgetting` over SQLite, :mod:`memory.pg.service` over PostgreSQL) import it
from here rather than from an implementation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["ForgetRange", "retention_cutoff_ms"]

_DAY_MS = 86_400_000


@dataclass(frozen=True, slots=True)
class ForgetRange:
    """What ``memory.forget`` names: a user, optionally one session and a time window [after,
    before)."""

    user: str
    session_key: str | None = None
    after_ms: int | None = None
    before_ms: int | None = None


def retention_cutoff_ms(retention_days: int, now_ms: int | None = None) -> int | None:
    """Chunks whose newest message is older than this are dropped; None when retention is off."""
    if retention_days <= 0:
        return None
    return (now_ms if now_ms is not None else int(time.time() * 1000)) - retention_days * _DAY_MS
