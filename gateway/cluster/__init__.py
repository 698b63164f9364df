"""Cross-node primitives on PostgreSQL, for several gateway nodes on one database
(docs/scaling.md): the session event bus (:class:`EventBus`, LISTEN/NOTIFY), the fenced
per-session run leases (:class:`RunLeases`, rows renewed by their node) and shared
``chat.send`` idempotency keys (:class:`IdempotencyKeys`). Their tables and migrations are in
:mod:`.schema`.

These modules import psycopg (the ``postgres`` extra); only the postgres backend imports them.
The primitives know nothing of the gateway's rooms (the bus delivers to anything with
``Hub.publish``'s signature); :mod:`.node` and :mod:`.runs` join them to the chat hub and runs.
"""

from __future__ import annotations

from .bus import CHANNEL, MAX_NOTIFY_BYTES, EventBus, LocalHub
from .idempotency import IdempotencyKeys
from .leases import HeldLease, Orphan, RunLeases, Taken
from .node import ClusterHub, ClusterNode
from .runs import ClusterRuns, LeaseTicket
from .schema import MIGRATION_LOCK, MIGRATIONS, connect, migrate

__all__ = [
    "CHANNEL",
    "ClusterHub",
    "ClusterNode",
    "ClusterRuns",
    "MAX_NOTIFY_BYTES",
    "MIGRATIONS",
    "MIGRATION_LOCK",
    "EventBus",
    "HeldLease",
    "IdempotencyKeys",
    "LeaseTicket",
    "LocalHub",
    "Orphan",
    "RunLeases",
    "Taken",
    "connect",
    "migrate",
]
