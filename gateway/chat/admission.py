"""Admitting a send: which earlier send it repeats, and whether there is room for its run.

:class:`Admission` is the half of :class:`gateway.chat.runs.ChatRuns` before a run exists. An
idempotency key is looked up in this node's map (an attempt still appending is waited for:
its outcome says whether this send repeats it) and claimed through the :class:`RunGate`
(across nodes on postgres; the :class:`LoneGate` on a node alone); a new busy session counts
against ``quotas.max_runs`` and ``quotas.max_runs_per_user``, a queued run against
``chat.max_queued_runs``. A send refused or failed after its claim frees its key, so a retry
is carried out. What happens once admitted is :mod:`gateway.chat.execution`'s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection

from gateway.chat.gate import RunGate, RunTicket, ungate
from gateway.chat.lanes import Attempt, SessionLane
from gateway.config import ChatConfig
from gateway.errors import Conflict, RateLimited

__all__ = ["Admission", "IdemKey"]

# (user, session_key, idempotency key)
IdemKey = tuple[str, str, str]

# The map is pruned of expired, settled attempts once it holds more than this many.
_PRUNE_ABOVE = 1000


class Admission:
    def __init__(self, config: ChatConfig, gate: RunGate, *, max_runs: int | None,
                 max_runs_per_user: int | None) -> None:
        self.config = config
        self.gate = gate
        # Busy sessions (a run streaming or queued), all users / one user ([quotas]): each is
        # an upstream connection while it runs.
        self.max_runs = max_runs
        self.max_runs_per_user = max_runs_per_user
        self._attempts: dict[IdemKey, Attempt] = {}

    async def repeated(self, idem: IdemKey | None) -> str | None:
        """The run id of an earlier send on this node with the same key, or None."""
        while idem is not None and (seen := self._attempts.get(idem)) is not None:
            if seen.expires <= time.monotonic():
                break
            if seen.outcome.done():
                return seen.run_id
            # The first attempt is still appending: its outcome decides whether this one is a
            # duplicate or must be carried out itself (then the key is free; look again).
            await asyncio.shield(seen.outcome)
        return None

    async def claimed_by(self, idem: IdemKey | None, run_id: str) -> str | None:
        """The run id that owns ``idem`` across nodes when it is another than ``run_id``."""
        if idem is None:
            return None
        owner = await self.gate.claim(idem[0], idem[1], idem[2], run_id,
                                      self.config.idempotency_ttl_s)
        return owner if owner != run_id else None

    def attempt(self, idem: IdemKey | None, run_id: str) -> Attempt | None:
        """Record a send's attempt, before its first await so a duplicate racing it finds it."""
        if idem is None:
            return None
        now = time.monotonic()
        attempt = Attempt(run_id, now + self.config.idempotency_ttl_s,
                          asyncio.get_running_loop().create_future())
        self._attempts[idem] = attempt
        if len(self._attempts) > _PRUNE_ABOVE:
            for key in [k for k, a in self._attempts.items()
                        if a.expires <= now and a.outcome.done()]:
                del self._attempts[key]
        return attempt

    def check_room(self, busy: Collection[tuple[str, str]], lane: SessionLane | None,
                   user: str) -> None:
        """Refuse a send when its session would be one busy session too many (``lane`` None:
        the session is idle; ``busy``: the (user, session) pairs with work in flight), or its
        session's queue is full."""
        if lane is None:
            if self.max_runs is not None and len(busy) >= self.max_runs:
                raise RateLimited(f"too many replies being generated ({len(busy)}, "
                                  "quotas.max_runs); retry later", 1000)
            if self.max_runs_per_user is not None:
                mine = sum(1 for lane_user, _ in busy if lane_user == user)
                if mine >= self.max_runs_per_user:
                    raise RateLimited(f"too many of your sessions are generating replies ({mine}, "
                                      "quotas.max_runs_per_user); wait for one to finish", 1000)
        elif len(lane.queue) >= self.config.max_queued_runs:
            raise Conflict(
                f"session busy: {len(lane.queue)} runs already queued (chat.max_queued_runs)")

    def settle(self, idem: IdemKey | None, attempt: Attempt | None, *, appended: bool) -> None:
        """The attempt's outcome: appended (a repeat is a duplicate) or not (its key is free)."""
        if idem is None or attempt is None:
            return
        if not appended and self._attempts.get(idem) is attempt:
            del self._attempts[idem]
        attempt.outcome.set_result(appended)

    async def undo(self, ticket: RunTicket | None, idem: IdemKey | None, run_id: str) -> None:
        """A send refused or failed after its claim: close its ticket, free its key."""
        await asyncio.shield(ungate(self.gate, ticket, idem, run_id))
