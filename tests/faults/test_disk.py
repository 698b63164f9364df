"""The disk fails under the daemon: ENOSPC and EIO on transcript writes and fsyncs (the FileIO
seam), on the index database (an apsw VFS that fails writes), and a real full filesystem (a
tiny tmpfs, where it can be mounted). Acknowledged messages survive, refused ones leave no
trace, the daemon keeps serving, and the index converges once the disk is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import os
import random
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest

from gateway.app import start_app
from gateway.client import Client
from gateway.config import Config
from sessions import FileIO
from tests.conftest import TOKEN, running
from tests.fake_openai import FakeOpenAI
from tests.faults.helpers import Acked, check_index, check_transcripts, wait_synced

TERMINAL = ("chat.final", "chat.error", "chat.aborted")


def assert_storage_error(err: dict[str, Any]) -> None:
    """docs/protocol.md: a disk failure is -32603 "storage error: …" with data.retryable, and
    unlike a crash it carries no errorId (there is no traceback to look up)."""
    assert err["code"] == -32603 and err["message"].startswith("storage error: "), err
    assert err["data"] == {"retryable": True}, err


async def drain_runs(c: Client, run_ids: set[str],
                     timeout: float = 30) -> dict[str, dict[str, Any]]:
    ends: dict[str, dict[str, Any]] = {}
    async with asyncio.timeout(timeout):
        while len(ends) < len(run_ids):
            ev = await c.next_event(timeout=timeout)
            if ev["method"] in TERMINAL and ev["params"]["runId"] in run_ids:
                ends[ev["params"]["runId"]] = ev
    return ends


async def test_random_enospc_and_eio_on_transcript_writes_and_fsyncs(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """A third of all transcript writes and fsyncs fail (ENOSPC, EIO) while four clients chat
    (fsync="always"): every acked message is in its transcript exactly once, no refused one is,
    every refusal is a clean storage error (never a crash), transcripts stay whole, and once the
    disk is healthy the index matches them."""
    rng = random.Random(uuid.uuid4().int)
    failing = {"on": True}

    def flaky(call: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any) -> Any:
            if failing["on"] and rng.random() < 0.33:
                code = rng.choice([errno.ENOSPC, errno.EIO])
                raise OSError(code, os.strerror(code))
            return call(*args)
        return wrapped

    # Failed creates count against the session quota too; retried at this failure rate they
    # could pass 60 a minute, and the quota is not what this test is about.
    cfg = config_factory(llm={"base_url": fake_openai.base_url, "api_key": "sk-t",
                              "model": "fake-model"},
                         sessions={"fsync": "always"}, memory={"debounce_ms": 50},
                         quotas={"sessions_per_minute": 100_000})
    app = await start_app(cfg, file_io=FileIO(write=flaky(os.write), fsync=flaky(os.fsync)))
    acked, refused = Acked(), []
    try:
        async def client(n: int) -> None:
            async with Client.connect(app.url, TOKEN) as c:
                keys: list[str] = []
                runs: set[str] = set()
                while len(keys) < 2:
                    reply = await c.request("sessions.create")
                    if "result" in reply:
                        keys.append(reply["result"]["sessionKey"])
                    else:
                        assert_storage_error(reply["error"])
                for i in range(12):
                    key, text = keys[i % 2], f"client {n} message {i}"
                    reply = await c.request("chat.send", {"sessionKey": key, "message": text})
                    if "result" in reply:
                        acked.add(key, reply["result"]["runId"], text)
                        runs.add(reply["result"]["runId"])
                    else:
                        assert_storage_error(reply["error"])
                        refused.append(text)
                    assert (await c.call("gateway.health"))["status"] == "ok"
                for end in (await drain_runs(c, runs)).values():
                    if end["method"] == "chat.error":  # the assistant line could not be written
                        assert end["params"]["error"]["retryable"] is True

        await asyncio.gather(*(client(n) for n in range(4)))
        assert len(acked) > 5 and refused
        failing["on"] = False
        lines = check_transcripts(cfg.data_dir, acked)
        written = {m["content"] for transcript in lines.values() for m in transcript[1:]
                   if m["type"] == "message"}
        assert not written & set(refused)
        async with Client.connect(app.url, TOKEN) as c:
            await c.call("memory.reindex")
            await wait_synced(c)
        check_index(cfg.data_dir)
    finally:
        await app.close()


async def sync_cleanly(c: Client) -> None:
    """Queue a sync and wait until one has run since, without error."""
    before = (await c.call("memory.status"))["syncCount"]
    await c.call("memory.reindex")
    async with asyncio.timeout(15):
        while True:
            status = await c.call("memory.status")
            if (status["syncCount"] > before and not status["syncing"]
                    and status["lastError"] is None):
                return
            await asyncio.sleep(0.05)


# --- the index database -----------------------------------------------------------------------

class FaultyVFS(apsw.VFS):
    """The default VFS, with writes and syncs of memory.db* failing while ``error`` is set."""

    def __init__(self) -> None:
        self.error: type[apsw.Error] | None = None
        self.failures = 0
        self.base = apsw.vfs_names()[0]  # the real default, before this one replaces it
        super().__init__("recalld-faulty", self.base, makedefault=True)

    def xOpen(self, name: Any, flags: Any) -> apsw.VFSFile:
        return FaultyFile(self, name, flags)


class FaultyFile(apsw.VFSFile):
    def __init__(self, vfs: FaultyVFS, name: Any, flags: Any) -> None:
        self.vfs = vfs
        self.watched = "memory.db" in (name.filename() if isinstance(name, apsw.URIFilename)
                                       else str(name or ""))
        super().__init__(vfs.base, name, flags)

    def _check(self) -> None:
        if self.watched and self.vfs.error is not None:
            self.vfs.failures += 1
            raise self.vfs.error("injected disk fault")

    def xWrite(self, data: bytes, offset: int) -> None:
        self._check()
        super().xWrite(data, offset)

    def xSync(self, flags: int) -> None:
        self._check()
        super().xSync(flags)


@pytest.fixture
def faulty_vfs() -> Iterator[FaultyVFS]:
    vfs = FaultyVFS()
    try:
        yield vfs
    finally:
        with contextlib.suppress(Exception):
            vfs.unregister()


@pytest.mark.parametrize("error", [apsw.FullError, apsw.IOError],
                         ids=["SQLITE_FULL", "SQLITE_IOERR"])
async def test_index_write_failures_leave_the_daemon_serving(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI, faulty_vfs: FaultyVFS,
    error: type[apsw.Error]
) -> None:
    """memory.db refuses every write for a while: syncs fail and say so in memory.status, chat,
    sessions (delete included) and memory.search go on, nothing answers as a crash; once writes
    work again a reindex brings the index level with the transcripts."""
    cfg = config_factory(llm={"base_url": fake_openai.base_url, "api_key": "sk-t",
                              "model": "fake-model"},
                         memory={"debounce_ms": 50})
    acked = Acked()
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        first = (await c.call("chat.send", {"sessionKey": key,
                                            "message": "the otter collects stones"}))["runId"]
        acked.add(key, first, "the otter collects stones")
        await drain_runs(c, {first})
        await wait_synced(c)
        faulty_vfs.error = error
        runs = set()
        for i in range(3):
            run = (await c.call("chat.send", {"sessionKey": key,
                                              "message": f"the heron waits {i}"}))["runId"]
            acked.add(key, run, f"the heron waits {i}")
            runs.add(run)
        assert {e["method"] for e in (await drain_runs(c, runs)).values()} == {"chat.final"}
        async with asyncio.timeout(10):
            while (await c.call("memory.status"))["lastError"] is None:
                await asyncio.sleep(0.05)
        assert faulty_vfs.failures > 0
        hits = (await c.call("memory.search", {"query": "otter stones"}))["results"]
        assert len(hits) == 1
        reply = await c.request("memory.reindex", {"full": True})
        if "error" in reply:
            assert_storage_error(reply["error"])
        other = (await c.call("sessions.create"))["sessionKey"]
        assert (await c.call("sessions.delete", {"sessionKey": other})) == {"deleted": True}
        history = (await c.call("sessions.history", {"sessionKey": key}))["messages"]
        assert {"the heron waits 2", "Echo: the heron waits 2"} <= {m["content"] for m in history}
        faulty_vfs.error = None
        await sync_cleanly(c)
        assert len((await c.call("memory.search", {"query": "heron waits"}))["results"]) >= 1
    faulty_vfs.unregister()  # the checks below read the files through the real VFS
    check_transcripts(cfg.data_dir, acked)
    check_index(cfg.data_dir)


# --- a real full disk -------------------------------------------------------------------------

@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs",
                           str(mount_point)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): "
                    f"{done.stderr.strip()}; "
                    "the FileIO and VFS fault tests cover ENOSPC without it")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


async def test_full_filesystem_for_transcripts_and_index(
    tiny_tmpfs: Path, config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """The data dir on a 4 MiB tmpfs that fills up: sends are refused with a storage error and
    leave no trace, syncs fail without killing anything, reads keep working; after space is
    freed the same daemon takes messages again and its index converges."""
    cfg = config_factory(llm={"base_url": fake_openai.base_url, "api_key": "sk-t",
                              "model": "fake-model"},
                         memory={"debounce_ms": 50},
                         # No free-disk floor: this test is about the disk really filling up.
                         sessions={"min_free_bytes": 0})
    cfg = dataclasses.replace(cfg, data_dir=tiny_tmpfs / "data")
    acked = Acked()
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        run = (await c.call("chat.send", {"sessionKey": key,
                                          "message": "the badger digs at night"}))["runId"]
        acked.add(key, run, "the badger digs at night")
        await drain_runs(c, {run})
        await wait_synced(c)
        filler = tiny_tmpfs / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)
        refused = 0
        for i in range(5):
            reply = await c.request("chat.send", {"sessionKey": key,
                                                  "message": f"lost {i} " + "w" * 20000})
            if "result" in reply:
                acked.add(key, reply["result"]["runId"], f"lost {i} " + "w" * 20000)
                await drain_runs(c, {reply["result"]["runId"]})
            else:
                assert_storage_error(reply["error"])
                assert ("no space" in reply["error"]["message"]
                        or "disk full" in reply["error"]["message"])
                refused += 1
        assert refused > 0
        assert (await c.call("sessions.history", {"sessionKey": key}))["messages"][0][
            "content"] == "the badger digs at night"
        assert len((await c.call("memory.search", {"query": "badger"}))["results"]) == 1
        reply = await c.request("memory.reindex", {"full": True})
        if "error" in reply:
            assert_storage_error(reply["error"])
        await asyncio.sleep(0.3)
        assert (await c.call("gateway.health"))["status"] == "ok"
        filler.unlink()
        run = (await c.call("chat.send", {"sessionKey": key, "message": "space again"}))["runId"]
        acked.add(key, run, "space again")
        assert (await drain_runs(c, {run}))[run]["method"] == "chat.final"
        await sync_cleanly(c)
    lines = check_transcripts(cfg.data_dir, acked)
    assert all("lost" not in m["content"] for m in lines[("default", key)][1:]
               if m.get("role") == "user" and m["runId"] not in acked.by_session[("default", key)])
    check_index(cfg.data_dir)
