"""Faults under real ``recalld serve`` nodes on one PostgreSQL, against the fenced run leases:
a database restart mid-run leaves one writer per run, a killed node's run is ended without a
new message, a stopped node lets its session go and writes nothing once resumed, a healthy run
logs no error on the other node, and queued runs hold no database connection.

Nodes run with memory off and a short lease (``cluster.lease_ttl_s``) where a test waits for
one to expire; every bound below is generous, nothing is timed."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gateway.client import Client, RpcError
from testkit.postgres import PostgresServer, PostgresUnavailable, start_postgres
from tests.cluster.test_nodes import eventually, final_of, history, node_env
from tests.conftest import TOKEN
from tests.fake_openai import FakeOpenAI
from tests.faults.helpers import FaultDaemon

pytestmark = pytest.mark.slow

TERMINAL = ("chat.final", "chat.error", "chat.aborted")
# A lease that expires soon after its node stops, renewed often enough to survive a slow renew.
SHORT_LEASE = {"RECALLD_CLUSTER_LEASE_TTL_S": "3", "RECALLD_CLUSTER_LEASE_RENEW_S": "0.5"}
LONG_REPLY = "word " * 400


@asynccontextmanager
async def started(tmp_path: Path, fake: FakeOpenAI, dsn: str, n: int = 2,
                  env: dict[str, str] | None = None) -> AsyncIterator[list[FaultDaemon]]:
    """``n`` nodes on ``dsn`` with ``env`` added; killed (and resumed first, if stopped) after."""
    daemons = await asyncio.gather(*(FaultDaemon.start(tmp_path / name,
                                                       env={**node_env(fake, dsn), **(env or {})})
                                     for name in "abc"[:n]), return_exceptions=True)
    up = [d for d in daemons if isinstance(d, FaultDaemon)]
    try:
        for d in daemons:
            if isinstance(d, BaseException):
                raise d
        yield up
    finally:
        for d in up:
            if d.proc.poll() is None:
                os.kill(d.proc.pid, signal.SIGCONT)
        await asyncio.gather(*(d.akill() for d in up), return_exceptions=True)


def drained(c: Client) -> list[dict[str, Any]]:
    """The events that reached ``c`` and were not read yet."""
    out = []
    while not c.events.empty():
        out.append(c.events.get_nowait())
    return out


def terminals(events: list[dict[str, Any]], run_id: str) -> list[str]:
    return [e["method"] for e in events
            if e.get("method") in TERMINAL and e["params"].get("runId") == run_id]


def assistant_lines(msgs: list[dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    return [m for m in msgs if m["role"] == "assistant" and m.get("runId") == run_id]


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A server of this test's own, which it may restart."""
    try:
        server = start_postgres()
    except PostgresUnavailable as exc:
        pytest.skip(f"no PostgreSQL for this run: {exc}")
    try:
        restart(server, "fast")  # durable commits (see restart)
        yield server
    finally:
        server.stop()


def restart(server: PostgresServer, mode: str) -> None:
    """Stop the server (``-m fast``: connections told; ``immediate``: a crash) and start it again
    on its port (``pg_ctl restart`` would keep the log on a pipe never closed). Commits are
    synchronous from then on, as in production: the throwaway default (``synchronous_commit=off``)
    loses the last commits in a crash, which no lease can make up for."""
    data = str(server.datadir)
    server._run("pg_ctl", "stop", "-D", data, "-m", mode, "-w", "-t", "60")
    server._run("pg_ctl", "start", "-D", data, "-w", "-t", "60", "-l", f"{data}/server.log", "-o",
                f"-p {server.port} -c listen_addresses=127.0.0.1 -k {data} -c fsync=off "
                "-c synchronous_commit=on -c max_connections=200")


async def send_until_answered(c: Client, params: dict[str, Any],
                              timeout: float = 60) -> dict[str, Any]:
    """``chat.send``, again while the node's pools reconnect after a database restart."""
    async with asyncio.timeout(timeout):
        while True:
            try:
                return dict(await c.call("chat.send", params))
            except RpcError:
                await asyncio.sleep(0.5)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_a_database_restart_mid_run_leaves_one_writer(
        tmp_path: Path, fake_openai: FakeOpenAI, own_postgres: PostgresServer, mode: str) -> None:
    """PostgreSQL restarted while B streams a reply, then a send to that session through A:
    each run has at most one assistant line, and no client sees two terminal events for a run."""
    dsn = own_postgres.create_database("recalld")
    async with started(tmp_path, fake_openai, dsn) as (a, b):
        async with Client.connect(a.url, TOKEN) as ca, Client.connect(b.url, TOKEN) as cb:
            key = (await ca.call("sessions.create", {}))["sessionKey"]
            await ca.call("sessions.subscribe", {"sessionKey": key})
            await cb.call("sessions.subscribe", {"sessionKey": key})
            fake_openai.configure(reply=LONG_REPLY, delta_delay_s=0.05)  # about 20 s
            first = await cb.call("chat.send", {"sessionKey": key,
                                                "message": "tell me a long story"})
            await cb.next_event("chat.delta", timeout=30)
            await asyncio.to_thread(restart, own_postgres, mode)
            fake_openai.configure(reply="short answer", delta_delay_s=0.0)
            second = await send_until_answered(ca, {"sessionKey": key, "message": "are you there?"})
            runs = [first["runId"], second["runId"]]
            # What this test is about: the second send arrived while the first still streamed.
            assert not assistant_lines(await history(ca, key), first["runId"])

            async def both_ended() -> bool:
                # B's run is over when B says so (its chat.run line), whatever it wrote.
                over = any(r.get("run") == first["runId"] for r in b.events("chat.run"))
                msgs = await history(ca, key)
                return over and all(assistant_lines(msgs, r) for r in runs)

            await eventually(both_ended, 90)
            await asyncio.sleep(3)  # room for a second writer or a late terminal event to show
            msgs = await history(ca, key)
            for c in (ca, cb):
                events = drained(c)
                for r in runs:
                    assert len(terminals(events, r)) <= 1, (r, terminals(events, r))
        for r in runs:
            assert len(assistant_lines(msgs, r)) == 1, msgs


async def test_a_killed_nodes_run_is_ended_with_no_new_message(
        tmp_path: Path, fake_openai: FakeOpenAI, pg_dsn: str) -> None:
    """kill -9 of B mid-reply: a client on A gets chat.error (retryable) for that run without
    sending anything, and the run's line holds the partial B checkpointed, marked failed."""
    async with started(tmp_path, fake_openai, pg_dsn, env=SHORT_LEASE) as (a, b):
        async with Client.connect(a.url, TOKEN) as ca:
            key = (await ca.call("sessions.create", {}))["sessionKey"]
            await ca.call("sessions.subscribe", {"sessionKey": key})
            fake_openai.configure(reply=LONG_REPLY, delta_delay_s=0.05)
            async with Client.connect(b.url, TOKEN) as cb:
                killed = await cb.call("chat.send", {"sessionKey": key,
                                                     "message": "tell me a long story"})
                await ca.next_event("chat.delta", timeout=30)
                await asyncio.sleep(2)  # a few renews: B has checkpointed some of the reply
                os.kill(b.proc.pid, signal.SIGKILL)
            ended = await final_of(ca, killed["runId"], timeout=60)
            assert ended["method"] == "chat.error"
            assert ended["params"]["error"]["retryable"] is True
            (line,) = assistant_lines(await history(ca, key), killed["runId"])
            assert line.get("failed") is True
            assert line["content"] and LONG_REPLY.startswith(line["content"])
            assert ended["params"]["partial"] == line["content"]


async def test_a_stopped_node_lets_its_session_go_and_adds_nothing_once_resumed(
        tmp_path: Path, fake_openai: FakeOpenAI, pg_dsn: str) -> None:
    """SIGSTOP of B mid-run: the session's next send through A completes; after SIGCONT, B
    writes nothing more to the session and its run sends no more events."""
    async with started(tmp_path, fake_openai, pg_dsn, env=SHORT_LEASE) as (a, b):
        async with Client.connect(a.url, TOKEN) as ca:
            key = (await ca.call("sessions.create", {}))["sessionKey"]
            await ca.call("sessions.subscribe", {"sessionKey": key})
            fake_openai.configure(reply=LONG_REPLY, delta_delay_s=0.05)
            async with Client.connect(b.url, TOKEN) as cb:
                stopped = await cb.call("chat.send", {"sessionKey": key,
                                                      "message": "tell me a long story"})
                await ca.next_event("chat.delta", timeout=30)
                os.kill(b.proc.pid, signal.SIGSTOP)
                try:
                    fake_openai.configure(reply="short answer", delta_delay_s=0.0)
                    run = await ca.call("chat.send", {"sessionKey": key,
                                                      "message": "are you there?"})
                    ended = await final_of(ca, stopped["runId"], timeout=60)
                    assert ended["method"] == "chat.error"
                    final = await final_of(ca, run["runId"], timeout=60)
                    assert final["method"] == "chat.final"
                    before = await history(ca, key)
                    drained(ca)
                finally:
                    os.kill(b.proc.pid, signal.SIGCONT)
                await asyncio.sleep(6)  # B's loop runs again: its stream, its renew, its end
            assert await history(ca, key) == before
            late = [e for e in drained(ca) if e["params"].get("runId") == stopped["runId"]]
            assert late == []
            assert [m["role"] for m in before] == ["user", "user", "assistant", "assistant"]


async def test_runs_through_one_node_log_no_error_on_the_other(
        tmp_path: Path, fake_openai: FakeOpenAI, pg_dsn: str) -> None:
    """4 runs through A, watched through B: no error-level log line on either node."""
    async with started(tmp_path, fake_openai, pg_dsn) as (a, b):
        async with Client.connect(a.url, TOKEN) as ca, Client.connect(b.url, TOKEN) as cb:
            key = (await ca.call("sessions.create", {}))["sessionKey"]
            await cb.call("sessions.subscribe", {"sessionKey": key})
            for i in range(4):
                run = await ca.call("chat.send", {"sessionKey": key, "message": f"message {i}"})
                await final_of(ca, run["runId"])
                await final_of(cb, run["runId"])
            await asyncio.sleep(1)
        errors = [r for d in (a, b) for r in list(d.lines)
                  if r.get("level") in ("error", "critical")]
        assert errors == []


async def test_queued_runs_hold_no_database_connection(
        tmp_path: Path, fake_openai: FakeOpenAI, pg_dsn: str) -> None:
    """208 runs queued on one node (the review's H3 load, over 4 sessions): the database's
    connections stay within the two nodes' pools, far fewer than the queued runs, and a send
    through the other node is answered meanwhile."""
    queued, sessions = 208, 4
    env = {"RECALLD_STORAGE_POOL_SIZE": "4", "RECALLD_QUOTAS_MAX_RUNS": "1000",
           "RECALLD_QUOTAS_MAX_RUNS_PER_USER": "1000", "RECALLD_CHAT_MAX_QUEUED_RUNS": "64",
           "RECALLD_QUOTAS_MESSAGE_BYTES_PER_MINUTE": "100000000"}
    async with started(tmp_path, fake_openai, pg_dsn, n=2, env=env) as (a, b):
        async with Client.connect(a.url, TOKEN) as ca, Client.connect(b.url, TOKEN) as cb:
            keys = [(await ca.call("sessions.create", {}))["sessionKey"] for _ in range(sessions)]
            fake_openai.configure(reply=LONG_REPLY, delta_delay_s=0.05)
            for i in range(queued):
                await ca.call("chat.send", {"sessionKey": keys[i % sessions],
                                            "message": f"message {i}"})
            await ca.next_event("chat.delta", timeout=30)
            async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as admin:
                cur = await admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
                row = await cur.fetchone()
            other = (await cb.call("sessions.create", {}))["sessionKey"]
            answered = await cb.request("chat.send", {"sessionKey": other, "message": "and mine?"})
            assert "result" in answered, answered
            assert row is not None
            # Per node the sessions pool (4), the cluster pool (4), the bus (2), the readiness
            # check (1); this connection; slack. Before run leases were rows: one per queued run.
            assert row[0] <= 25, row[0]
