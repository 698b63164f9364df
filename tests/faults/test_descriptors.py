"""Descriptor exhaustion: connections never take the descriptors transcripts need, and a
batched fsync that could not open a file keeps it dirty until it is synced."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

from gateway.client import Client
from sessions import FileIO, SessionsConfig, SessionStore, StorageError
from tests.conftest import TOKEN
from tests.faults.helpers import FaultDaemon, daemon_env, open_fds

NOFILE = 400


async def test_a_connection_flood_leaves_descriptors_for_transcripts(tmp_path: Path) -> None:
    """Under a 400 open-file limit, 500 unauthenticated connections: the daemon lowers
    max_connections to fit (logged), refuses the rest, keeps creating sessions for a
    well-behaved client meanwhile, and logs no flood of accept errors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, hard))
    try:
        d = await FaultDaemon.start(tmp_path / "data", env=daemon_env(RECALLD_SERVER_RESERVED_FDS="64"))
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    opened: list[ClientConnection] = []
    try:
        async with Client.connect(d.url, TOKEN) as good:
            async def attacker() -> None:
                with contextlib.suppress(Exception):
                    opened.append(await connect(d.url, open_timeout=20, ping_interval=None))

            await asyncio.gather(*(attacker() for _ in range(500)))
            fds = open_fds(d.proc.pid)
            print(f"{len(opened)} of 500 attacker connections opened; daemon holds {fds} descriptors")
            assert len(opened) < 500
            for i in range(20):
                reply = await good.request("sessions.create", {"title": f"during {i}"})
                assert "result" in reply, reply
            assert (await good.call("gateway.health"))["status"] == "ok"
        lowered = d.events("server.max_connections_lowered")
        assert lowered and lowered[0]["effective"] <= NOFILE - 64
        accept_logs = [r for r in d.lines if "accept" in str(r.get("event", "")) or "accept" in str(r.get("message", ""))]
        assert len(accept_logs) <= 3, accept_logs[:5]
    finally:
        await asyncio.gather(*(ws.close() for ws in opened), return_exceptions=True)
        await d.akill()


def test_a_flush_that_cannot_open_a_file_keeps_it_dirty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fsync="batch": when a flush cannot open a written transcript (EMFILE), it reports a
    storage error and the next flush still syncs that transcript."""
    synced: list[str] = []

    def record(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        os.fsync(fd)

    store = SessionStore(tmp_path, SessionsConfig(fsync="batch"), file_io=FileIO(fsync=record))
    try:
        key = store.create("alice").session_key
        store.flush()
        store.append_message("alice", key, role="user", content="acknowledged")
        path = str(store.transcript_path("alice", key))
        synced.clear()
        real_open = os.open

        def no_descriptors(p: Any, *args: Any, **kwargs: Any) -> int:
            if str(p) == path:
                raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
            return real_open(p, *args, **kwargs)

        monkeypatch.setattr(os, "open", no_descriptors)
        with pytest.raises(StorageError):
            store.flush()
        monkeypatch.setattr(os, "open", real_open)
        assert path not in synced
        store.flush()
        assert path in synced
    finally:
        store.close()
