"""The event bus between nodes: every other node's hub gets a node's events, in order, big
ones included; a node never hears itself; a listener whose connection dies comes back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import psycopg
import pytest

from gateway.cluster import EventBus

Event = tuple[str, str, str, dict[str, Any]]


class RecordingHub:
    """A local hub that keeps what it was handed and lets a test wait for a count."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._changed = asyncio.Event()

    def publish(self, user: str, session_key: str, method: str, params: Mapping[str, Any]) -> int:
        self.events.append((user, session_key, method, dict(params)))
        self._changed.set()
        return 1

    async def wait_for(self, count: int) -> list[Event]:
        # The timeout only stops a broken test from hanging; nothing is measured.
        async with asyncio.timeout(60):
            while len(self.events) < count:
                self._changed.clear()
                await self._changed.wait()
        return self.events


@pytest.fixture
async def nodes(
    pg_dsn: str
) -> AsyncIterator[tuple[EventBus, RecordingHub, EventBus, RecordingHub]]:
    hub_a, hub_b = RecordingHub(), RecordingHub()
    async with EventBus(pg_dsn, hub_a, reconnect_delay_s=0.2) as a, \
            EventBus(pg_dsn, hub_b, reconnect_delay_s=0.2) as b:
        yield a, hub_a, b, hub_b


async def test_events_reach_the_other_node_in_order_big_ones_too(
    nodes: tuple[EventBus, RecordingHub, EventBus, RecordingHub],
) -> None:
    """Node A's events, one of them far past NOTIFY's 8000-byte limit, reach node B's hub
    whole and in the order sent; A's own hub hears only B's event, never its own."""
    a, hub_a, b, hub_b = nodes
    key = "a" * 32
    long_reply = "word " * 10_000
    sent: list[Event] = [
        ("alice", key, "chat.delta", {"sessionKey": key, "runId": "r1", "seq": 0, "delta": "Hi"}),
        ("alice", key, "chat.final", {"sessionKey": key, "runId": "r1", "seq": 1,
                                      "message": {"role": "assistant", "content": long_reply}}),
        ("alice", key, "sessions.updated", {"sessionKey": key, "session": {"title": "é ✓"}}),
    ]
    for event in sent:
        assert await a.publish(*event)
    assert await hub_b.wait_for(3) == sent
    marker: Event = ("bob", "b" * 32, "sessions.deleted", {"sessionKey": "b" * 32})
    assert await b.publish(*marker)
    # A handles notifications in order, so once B's marker is in, any echo of A's own would be too.
    assert await hub_a.wait_for(1) == [marker]


async def test_the_listener_comes_back_after_its_connection_is_killed(
    nodes: tuple[EventBus, RecordingHub, EventBus, RecordingHub], pg_dsn: str,
) -> None:
    """When the server ends B's listening connection, B reconnects and LISTENs again, and
    events published after that reach it."""
    a, _, b, hub_b = nodes
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as admin:
        cur = await admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s",
            (f"recalld-bus-listen-{b.node_id[:12]}",))
        assert await cur.fetchone() == (1,)
    await b.wait_listening(2)
    event: Event = ("alice", "c" * 32, "chat.delta", {"seq": 7, "delta": "after"})
    assert await a.publish(*event)
    assert await hub_b.wait_for(1) == [event]


async def test_a_bus_that_cannot_reach_the_server_fails_to_start() -> None:
    """start() against a closed port raises the driver's error instead of waiting forever."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(psycopg.OperationalError):
        await EventBus(f"postgresql://u@127.0.0.1:{port}/db", RecordingHub(),
                       connect_timeout_s=2).start()


async def test_events_past_max_outbound_are_dropped_not_queued(pg_dsn: str) -> None:
    """A hub whose bus falls behind queues at most ``max_outbound`` events for it (the rest are
    dropped, so a stalled database cannot grow the node's memory); once the bus runs, the queued
    ones reach the other node in order and the dropped ones never do."""
    from gateway.cluster import ClusterHub

    hub, other = ClusterHub(max_outbound=100), RecordingHub()
    for seq in range(150):
        hub.publish("alice", "s1", "chat.delta", {"runId": "r", "seq": seq, "delta": "x"})
    a, b = EventBus(pg_dsn, RecordingHub(), node_id="a"), EventBus(pg_dsn, other, node_id="b")
    await a.start()
    await b.start()
    forward = asyncio.create_task(hub.forward(a))
    try:
        got = await other.wait_for(100)
        await asyncio.sleep(0.2)  # nothing beyond the hundred queued arrives
        assert [e[3]["seq"] for e in got] == list(range(100))
    finally:
        forward.cancel()
        await a.close()
        await b.close()


async def test_a_flooding_user_neither_delays_nor_drops_another_users_end(pg_dsn: str) -> None:
    """With bob's flood filling the node's outbound queue, alice's delta and chat.final still
    reach the other node, among the first events sent (users take turns), and bob's own
    chat.final is kept although his deltas past the limit are dropped."""
    from gateway.cluster import ClusterHub

    hub, other = ClusterHub(max_outbound=100), RecordingHub()
    for seq in range(300):
        hub.publish("bob", "s-bob", "chat.delta", {"runId": "rb", "seq": seq, "delta": "x"})
    hub.publish("bob", "s-bob", "chat.final", {"runId": "rb", "seq": 300, "message": {}})
    hub.publish("alice", "s-alice", "chat.delta", {"runId": "ra", "seq": 0, "delta": "hi"})
    hub.publish("alice", "s-alice", "chat.final", {"runId": "ra", "seq": 1, "message": {}})
    a, b = EventBus(pg_dsn, RecordingHub(), node_id="a"), EventBus(pg_dsn, other, node_id="b")
    await a.start()
    await b.start()
    forward = asyncio.create_task(hub.forward(a))
    try:
        async with asyncio.timeout(60):
            await hub.sent()
        assert await b.barrier()
        got = [(e[0], e[2]) for e in other.events]
        assert got.index(("alice", "chat.final")) < 5
        assert ("alice", "chat.delta") in got and got[-1] == ("bob", "chat.final")
        assert sum(1 for _, method in got if method == "chat.delta") <= 100  # the limit held
    finally:
        forward.cancel()
        await a.close()
        await b.close()
