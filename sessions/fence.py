"""The fence a run's appends carry on PostgreSQL: the session's run lease and its token.

No psycopg here (``sessions`` exports it); the check is :class:`~sessions.pg.PgSessionStore`'s.

Several nodes share one database; a run executes holding its session's lease, a row of
``recalld_run_leases`` (the cluster's table, ``gateway.cluster.schema``) with a fencing token
that grows with each new holder. While :data:`RUN_FENCE` holds a :class:`RunFence` for a
session, :meth:`PgSessionStore.append_message` on that session writes only if that lease row
still carries the token and has not expired — checked under a share lock on the row, in the
append's own transaction, so a node taking the lease over (an update of that row) is ordered
either wholly before the append (which is then refused) or wholly after it (and sees its line).
A refused append raises :class:`LeaseLost` and marks the fence ``lost``.

A context variable, not an argument: it is set once in the run's task when the lease is taken,
and ``asyncio.to_thread`` carries it into every worker thread that writes for the run, through
whatever wraps the store. Appends to other sessions (or with no fence) are not checked.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from .errors import StorageError

__all__ = ["RUN_FENCE", "LeaseLost", "RunFence"]


@dataclass(slots=True, eq=False)
class RunFence:
    """The lease a run holds on ``session_key``; ``lost`` once an append was refused (or the
    node learnt the lease was taken over)."""

    session_key: str
    token: int
    lost: bool = False


RUN_FENCE: ContextVar[RunFence | None] = ContextVar("recalld_run_fence", default=None)


class LeaseLost(StorageError):
    """The run's lease on its session was taken over (the run outlived it): nothing written."""

    def __init__(self) -> None:
        super().__init__("this reply's lease on its session expired and another node took it over")
