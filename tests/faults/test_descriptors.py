"""Descriptor exhaustion: connections never take the descriptors transcripts need, a
batched fsync that could not open a file keeps it dirty until it is synced, and the daemon's
flush loop outlives failed passes."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import resource
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs
from websockets.asyncio.client import ClientConnection, connect

import gateway.app
from gateway.app import start_app
from gateway.client import Client
from gateway.config import Config
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
        d = await FaultDaemon.start(tmp_path / "data",
                                    env=daemon_env(RECALLD_SERVER_RESERVED_FDS="64"))
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
            print(f"{len(opened)} of 500 attacker connections opened; daemon holds {fds} "
                  "descriptors")
            assert len(opened) < 500
            for i in range(20):
                reply = await good.request("sessions.create", {"title": f"during {i}"})
                assert "result" in reply, reply
            assert (await good.call("gateway.health"))["status"] == "ok"
        lowered = d.events("server.max_connections_lowered")
        assert lowered and lowered[0]["effective"] <= NOFILE - 64
        accept_logs = [r for r in d.lines if "accept" in str(r.get("event", ""))
                       or "accept" in str(r.get("message", ""))]
        assert len(accept_logs) <= 3, accept_logs[:5]
    finally:
        await asyncio.gather(*(ws.close() for ws in opened), return_exceptions=True)
        await d.akill()


def test_a_flush_that_cannot_open_a_file_keeps_it_dirty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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


async def test_the_flush_loop_outlives_failed_passes(config_factory: Callable[..., Config],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """fsync="batch": passes of the daemon's flush loop that fail (EMFILE opening a transcript)
    do not end the loop: the transcript it could not open is synced once it can be, a session
    created afterwards is synced too, and the repeated failure is logged once, not per pass."""
    synced: list[str] = []

    def record(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        os.fsync(fd)

    cfg = config_factory(sessions={"fsync": "batch", "fsync_interval_s": 0.05})
    app = await start_app(cfg, file_io=FileIO(fsync=record))
    try:
        tries: list[str] = []
        real_open = os.open

        def no_descriptors(p: Any, flags: int, *args: Any, **kwargs: Any) -> int:
            # Only the flush's read-only opens of transcripts fail, as under a descriptor flood.
            if str(p).endswith(".jsonl") and flags == os.O_RDONLY | os.O_CLOEXEC:
                tries.append(str(p))
                raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
            return real_open(p, flags, *args, **kwargs)

        with capture_logs() as logs:
            # A fresh proxy: a logger cached under another configuration would bypass capture.
            monkeypatch.setattr(gateway.app, "log", structlog.get_logger("recalld.app"))
            async with Client.connect(app.url, TOKEN) as c:
                monkeypatch.setattr(os, "open", no_descriptors)
                first = (await c.call("sessions.create"))["sessionKey"]
                async with asyncio.timeout(30):
                    while sum(first in p for p in tries) < 3:  # three passes failed to open it
                        await asyncio.sleep(0.01)
                monkeypatch.setattr(os, "open", real_open)
                assert not any(first in p for p in synced)
                second = (await c.call("sessions.create"))["sessionKey"]
                async with asyncio.timeout(30):
                    while not (any(first in p for p in synced)
                               and any(second in p for p in synced)):
                        await asyncio.sleep(0.01)
        assert len([e for e in logs if e["event"] == "sessions.flush_failed"]) == 1, logs
    finally:
        await app.close()
