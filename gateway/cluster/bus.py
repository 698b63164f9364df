"""Session events across nodes over PostgreSQL LISTEN/NOTIFY.

``EventBus.publish(user, session_key, method, params)`` — the signature of the local
``Hub.publish`` — sends the event to every other node, whose listener hands it to its own hub.
A node ignores its own events (each bus has a ``node_id``): its hub got them directly.

* **Order.** Publishes leave one connection one after another (an asyncio lock, first come
  first served) and PostgreSQL delivers one session's notifications in commit order, so the
  events of a run arrive in the order they were sent.
* **Size.** A NOTIFY payload must stay under 8000 bytes. A bigger event (a ``chat.final`` with a
  long message) is written to ``recalld_events`` and its notify carries only the row id, in the
  same transaction, so the row is there when the notify arrives; rows older than ``retain_s``
  are deleted as new ones are written.
* **Loss.** After a lost connection the listener reconnects (every ``reconnect_delay_s``);
  events sent meanwhile are not replayed. Events carry ``seq``: a client that sees a gap reads
  ``sessions.history`` (docs/protocol.md). A publish that fails is logged, not raised: the
  store, not the bus, holds the truth.
* **Internal messages.** Besides events the channel carries a node's barrier pings (``b``, for
  itself alone) and lease releases (``l``, handed to ``on_released`` so a session's waiters on
  every node try again at once). A node ignores the other nodes' pings and anything that is not
  one of these: they are not errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import orjson
import psycopg
import structlog
from psycopg import sql
from psycopg.types.json import Jsonb

from .schema import connect, migrate

__all__ = ["CHANNEL", "MAX_NOTIFY_BYTES", "EventBus", "LocalHub"]

log = structlog.get_logger(__name__)

CHANNEL = "recalld_events"
# PostgreSQL refuses a payload of 8000 bytes or more; a little room is left for safety.
MAX_NOTIFY_BYTES = 7900

_Conn = psycopg.AsyncConnection[tuple[Any, ...]]


class LocalHub(Protocol):
    """What the bus delivers to: ``gateway.chat.hub.Hub`` fits."""

    def publish(self, user: str, session_key: str, method: str,
                params: Mapping[str, Any]) -> int: ...


def _dumps(value: object) -> str:
    return orjson.dumps(value).decode()


class EventBus:
    """One node's end of the bus: ``async with EventBus(dsn, hub) as bus: await bus.publish(…)``."""

    def __init__(
        self,
        dsn: str,
        hub: LocalHub,
        *,
        node_id: str | None = None,
        channel: str = CHANNEL,
        reconnect_delay_s: float = 1.0,
        connect_timeout_s: float = 10.0,
        retain_s: float = 300.0,
        max_notify_bytes: int = MAX_NOTIFY_BYTES,
        on_released: Callable[[str], None] | None = None,
    ) -> None:
        self.node_id = node_id or uuid.uuid4().hex
        self._dsn = dsn
        self._hub = hub
        self._channel = channel
        self._reconnect_delay_s = reconnect_delay_s
        self._connect_timeout_s = connect_timeout_s
        self._retain_s = retain_s
        self._max_notify_bytes = max_notify_bytes
        self._on_released = on_released
        self._conn: _Conn | None = None
        self._lock = asyncio.Lock()
        self._listener: asyncio.Task[None] | None = None
        self._listens = 0
        self._listening = asyncio.Condition()
        self.delivered = 0  # events from other nodes handed to the hub
        self._barriers: dict[str, asyncio.Future[None]] = {}

    async def __aenter__(self) -> EventBus:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Connect, apply migrations and LISTEN; returns once this node hears the channel, so
        every event published after it returns is received. Raises psycopg.Error when the
        server cannot be reached."""
        self._conn = await self._connect("publish")
        await migrate(self._conn)
        # The first LISTEN happens here, so a server that refuses it fails the start.
        first = await self._connect("listen")
        try:
            await self._listen_on(first)
        except BaseException:
            await first.close()
            raise
        self._listener = asyncio.create_task(self._listen_forever(first),
                                             name=f"event-bus-{self.node_id[:8]}")

    async def close(self) -> None:
        """Stop listening and close both connections; safe to call twice."""
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
            self._listener = None
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    async def wait_listening(self, generation: int) -> None:
        """Wait until the listener has (re)connected and issued LISTEN ``generation`` times."""
        async with self._listening:
            await self._listening.wait_for(lambda: self._listens >= generation)

    @property
    def listens(self) -> int:
        """How many times the listener has connected and issued LISTEN."""
        return self._listens

    async def publish(self, user: str, session_key: str, method: str,
                      params: Mapping[str, Any]) -> bool:
        """Send one event to the other nodes; False (logged) when the database refused it."""
        body = {"n": self.node_id, "u": user, "k": session_key, "m": method, "p": params}
        payload = _dumps(body)
        async with self._lock:
            for attempt in (1, 2):
                try:
                    conn = await self._publisher()
                    if len(payload.encode()) <= self._max_notify_bytes:
                        await conn.execute("SELECT pg_notify(%s, %s)", (self._channel, payload))
                    else:
                        await self._publish_large(conn, body)
                    return True
                except psycopg.Error as err:
                    log.warning("cluster.publish_failed", method=method, session=session_key,
                                attempt=attempt, error=str(err).strip())
                    await self._drop_publisher()
        return False

    async def barrier(self) -> bool:
        """Return once every event that other nodes committed before this call has been handed
        to the hub: a ping to this node's own listener, which PostgreSQL delivers after them
        (notifications arrive in commit order). False (logged) when the ping could not be sent."""
        token = uuid.uuid4().hex
        arrived = self._barriers[token] = asyncio.get_running_loop().create_future()
        try:
            async with self._lock:
                try:
                    conn = await self._publisher()
                    await conn.execute("SELECT pg_notify(%s, %s)",
                                       (self._channel, _dumps({"n": self.node_id, "b": token})))
                except psycopg.Error as err:
                    log.warning("cluster.barrier_failed", error=str(err).strip())
                    await self._drop_publisher()
                    return False
            await arrived
            return True
        finally:
            self._barriers.pop(token, None)

    async def _publish_large(self, conn: _Conn, body: Mapping[str, Any]) -> None:
        async with conn.transaction():
            cur = await conn.execute(
                "INSERT INTO recalld_events (node, payload) VALUES (%s, %s) RETURNING id",
                (self.node_id, Jsonb(body, dumps=_dumps)),
            )
            row = await cur.fetchone()
            assert row is not None
            await conn.execute("SELECT pg_notify(%s, %s)",
                               (self._channel, _dumps({"n": self.node_id, "id": row[0]})))
            await conn.execute(
                "DELETE FROM recalld_events WHERE created_at < now() - make_interval(secs => %s)",
                (self._retain_s,),
            )

    async def _connect(self, role: str) -> _Conn:
        return await connect(self._dsn, connect_timeout_s=self._connect_timeout_s,
                             application_name=f"recalld-bus-{role}-{self.node_id[:12]}")

    async def _publisher(self) -> _Conn:
        if self._conn is None or self._conn.closed:
            self._conn = await self._connect("publish")
        return self._conn

    async def _drop_publisher(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                await self._conn.close()
            self._conn = None

    async def _listen_on(self, conn: _Conn) -> None:
        await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        async with self._listening:
            self._listens += 1
            self._listening.notify_all()

    async def _listen_forever(self, first: _Conn) -> None:
        conn: _Conn | None = first
        while True:
            try:
                if conn is None:
                    conn = await self._connect("listen")
                    await self._listen_on(conn)
                async for note in conn.notifies():
                    await self._deliver(note.payload)
            except (psycopg.Error, OSError) as err:
                log.warning("cluster.listen_lost", error=str(err).strip(),
                            retry_in_s=self._reconnect_delay_s)
            finally:
                if conn is not None:
                    with contextlib.suppress(psycopg.Error):
                        await conn.close()
                    conn = None
            await asyncio.sleep(self._reconnect_delay_s)

    async def _deliver(self, payload: str) -> None:
        try:
            body = orjson.loads(payload)
        except orjson.JSONDecodeError:
            log.warning("cluster.event_unreadable", bytes=len(payload))
            return
        if not isinstance(body, dict):
            return
        if body.get("n") == self.node_id:
            arrived = self._barriers.get(str(body.get("b")))
            if arrived is not None and not arrived.done():
                arrived.set_result(None)
            return
        if "l" in body:
            if self._on_released is not None:
                self._on_released(str(body["l"]))
            return
        if "id" in body:
            loaded = await self._load_large(body["id"])
            if loaded is None:
                return
            body = loaded
        user, key, method, params = body.get("u"), body.get("k"), body.get("m"), body.get("p")
        if not (isinstance(user, str) and isinstance(key, str) and isinstance(method, str)
                and isinstance(params, dict)):
            return  # another node's barrier ping, or a message of a newer version: not for us
        try:
            self._hub.publish(user, key, method, params)
        except Exception:
            # A bad event must not stop the listener for every later one.
            log.exception("cluster.event_failed", method=body.get("m"))
            return
        self.delivered += 1

    async def _load_large(self, event_id: object) -> dict[str, Any] | None:
        async with self._lock:
            try:
                conn = await self._publisher()
                cur = await conn.execute("SELECT payload FROM recalld_events WHERE id = %s",
                                         (event_id,))
                row = await cur.fetchone()
            except psycopg.Error as err:
                log.warning("cluster.event_unreadable", id=event_id, error=str(err).strip())
                await self._drop_publisher()
                return None
        if row is None or not isinstance(row[0], dict):
            log.warning("cluster.event_gone", id=event_id)  # swept before it was read
            return None
        return row[0]
