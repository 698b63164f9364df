"""Cross-node primitives on PostgreSQL, for several gateway nodes on one database
(docs/scaling.md): the session event bus (:class:`EventBus`, LISTEN/NOTIFY), the per-session
run lease (:class:`SessionLeases`, advisory locks) and shared ``chat.send`` idempotency keys
(:class:`IdempotencyKeys`). Their tables and migrations are in :mod:`.schema`.

These modules import psycopg (the ``postgres`` extra); only the postgres backend imports them.
They know nothing of the gateway's rooms: the bus delivers to anything with ``Hub.publish``'s
signature.
"""

from __future__ import annotations

from .bus import CHANNEL, MAX_NOTIFY_BYTES, EventBus, LocalHub
from .idempotency import IdempotencyKeys
from .leases import LEASE_CLASS, Lease, SessionLeases, lease_key
from .schema import MIGRATION_LOCK, MIGRATIONS, connect, migrate

__all__ = [
    "CHANNEL",
    "LEASE_CLASS",
    "MAX_NOTIFY_BYTES",
    "MIGRATIONS",
    "MIGRATION_LOCK",
    "EventBus",
    "IdempotencyKeys",
    "Lease",
    "LocalHub",
    "SessionLeases",
    "connect",
    "lease_key",
    "migrate",
]
