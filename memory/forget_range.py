"""What ``memory.forget`` names (:class:`ForgetRange`), on either backend.

A plain value with no storage behind it, so :mod:`memory.protocols` and both backends
(:mod:`memory.forgetting` over SQLite, :mod:`memory.pg.service` over PostgreSQL) import it from
here rather than from an implementation.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ForgetRange"]


@dataclass(frozen=True, slots=True)
class ForgetRange:
    """What ``memory.forget`` names: a user, optionally one session and a time window [after, before)."""

    user: str
    session_key: str | None = None
    after_ms: int | None = None
    before_ms: int | None = None
