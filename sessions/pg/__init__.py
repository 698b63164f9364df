"""Sessions in PostgreSQL: :class:`PgSessionStore`, the same public API as
:class:`sessions.SessionStore` on two tables, for several gateway nodes on one database.

Importing this package imports psycopg (the ``postgres`` extra); the default install never
does. The schema, its migrations and the advisory lock they run under are in :mod:`.schema`;
what the memory indexer reads of the tables (and the change notifications) is :mod:`.feed`;
docs/sessions.md ("PostgreSQL") has the tables and what differs from the file store.
"""

from __future__ import annotations

from . import feed
from .feed import NOTIFY_CHANNEL
from .schema import MIGRATION_LOCK, MIGRATIONS, migrate
from .store import PgSessionStore

__all__ = ["MIGRATIONS", "MIGRATION_LOCK", "NOTIFY_CHANNEL", "PgSessionStore", "feed", "migrate"]
