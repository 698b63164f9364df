"""What chat runs ask of the other gateway nodes on one database (docs/scaling.md).

:class:`ChatRuns` always holds a :class:`RunGate`: ``gateway.cluster.ClusterRuns`` on the
postgres backend, :class:`LoneGate` on a node alone (every key its own, no lease: the node's
lanes already order its runs). Kept here as Protocols so ``gateway/chat`` never imports the
driver.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Protocol

__all__ = ["LoneGate", "RunGate", "RunTicket", "close_soon", "run_leased", "ungate"]

# Tickets being closed in the background: a task nobody references may be collected mid-way.
_closing: set[asyncio.Task[None]] = set()


class RunTicket(Protocol):
    """One run's place across nodes, taken before its user message is appended (so other
    nodes see the run as live from the moment its message exists) and closed after it."""

    async def hold(self) -> None:
        """Wait, in append order across nodes, until this run may execute alone."""

    async def close(self) -> None:
        """Release the run's lease and its liveness; safe to call twice."""


class RunGate(Protocol):
    """Cross-node idempotency keys and run tickets."""

    async def claim(self, user: str, session_key: str, key: str, run_id: str, ttl_s: float) -> str:
        """The run id that owns ``key`` now: ``run_id`` if this send is the first."""

    async def release(self, user: str, session_key: str, key: str, run_id: str) -> None:
        """Free ``key`` whose run never started (its append failed)."""

    async def ticket(self, user: str, session_key: str, run_id: str) -> RunTicket | None:
        """A ticket for a run about to be appended; None when the run needs no lease."""


class LoneGate:
    """The :class:`RunGate` of a node alone: an idempotency key is this node's to decide (its
    own map in ``ChatRuns``), and a run needs no lease beside its session's lane."""

    async def claim(self, user: str, session_key: str, key: str, run_id: str, ttl_s: float) -> str:
        return run_id

    async def release(self, user: str, session_key: str, key: str, run_id: str) -> None:
        return None

    async def ticket(self, user: str, session_key: str, run_id: str) -> RunTicket | None:
        return None


async def run_leased(ticket: RunTicket, execute: Callable[[], Awaitable[None]], *,
                     aborted: Callable[[], Awaitable[None]],
                     failed: Callable[[Exception], Awaitable[None]]) -> None:
    """``execute()`` holding the session's lease; an abort while waiting for the lease ends the
    run through ``aborted()``, a database failure through ``failed(exc)``. The ticket is
    closed after, whatever happened."""
    try:
        try:
            await ticket.hold()
        except asyncio.CancelledError:
            await aborted()
            raise
        except Exception as exc:
            await failed(exc)
            return
        await execute()
    finally:
        await asyncio.shield(ticket.close())


async def ungate(gate: RunGate, ticket: RunTicket | None, idem: tuple[str, str, str] | None,
                 run_id: str) -> None:
    """Undo a send whose append failed: close its ticket, free its idempotency key so a retry
    is carried out (as on one node)."""
    if ticket is not None:
        await ticket.close()
    if idem is not None:
        user, session_key, key = idem
        with contextlib.suppress(Exception):  # the key expires by itself if this fails too
            await gate.release(user, session_key, key, run_id)


def close_soon(ticket: RunTicket | None) -> None:
    """Close the ticket of a run dropped from its queue, from synchronous code."""
    if ticket is not None:
        task = asyncio.create_task(ticket.close())
        _closing.add(task)
        task.add_done_callback(_closing.discard)
