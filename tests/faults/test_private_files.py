"""Item 2 of issue 10: the data dir is 0700 and every file the daemon creates 0600 (the SQLite
WAL and SHM included), and an existing data dir others can read is reported at start."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.client import Client
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.daemon import Daemon
from tests.fake_openai import FakeOpenAI
from tests.gateway.test_memory_methods import chat_config, say, search_until


@pytest.fixture
def loose_umask() -> Iterator[None]:
    """The common login umask 022, under which files default to 0644; restored after."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    found = {str(root): stat.S_IMODE(os.lstat(root).st_mode)}
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = os.path.join(dirpath, name)
            found[os.path.relpath(path, root)] = stat.S_IMODE(os.lstat(path).st_mode)
    return found


@pytest.mark.usefixtures("loose_umask")
async def test_every_file_the_daemon_creates_is_private(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """Under umask 022, a fresh data dir after a chat and an index sync holds only 0700
    directories and 0600 files, memory.db-wal and sessions.db-wal among them."""
    cfg = chat_config(config_factory, fake_openai)
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create", {"title": "private"}))["sessionKey"]
        await say(c, key, "My bank PIN hint is the name of my first cat.")
        await search_until(c, {"query": "bank PIN hint"})
        modes = _modes(cfg.data_dir)
    assert ({"memory.db-wal", "sessions.db-wal", "memory.db", "sessions.db"}
            <= set(modes)), sorted(modes)
    assert f"sessions/default/{key}.jsonl" in modes
    exposed = {path: oct(mode) for path, mode in modes.items() if mode & 0o077}
    assert not exposed, f"readable by other users: {exposed}"
    assert modes[str(cfg.data_dir)] == 0o700


def test_an_exposed_data_dir_is_reported_at_start(tmp_path: Path) -> None:
    """A data dir that is 0755 with a 0644 file in it gets one start-up warning naming both
    and the chmod that fixes it; the daemon still starts."""
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)
    leaked = data / "notes.txt"
    leaked.write_text("left here by hand")
    os.chmod(leaked, 0o644)
    daemon = Daemon(data)
    try:
        warnings = [r for r in daemon.lines if r.get("event") == "datadir.exposed"]
    finally:
        daemon.stop()
    assert len(warnings) == 1, daemon.lines
    warning = warnings[0]
    assert warning["count"] == 2 and warning["level"] == "warning"
    assert (any(str(data) in p for p in warning["paths"])
            and any("notes.txt" in p for p in warning["paths"]))
    assert warning["fix"] == f"chmod -R go-rwx {data}"


def test_a_private_data_dir_gets_no_warning(tmp_path: Path) -> None:
    """A data dir the daemon made itself is private, so a restart warns about nothing."""
    data = tmp_path / "data"
    for _ in range(2):
        daemon = Daemon(data)
        daemon.stop()
        assert not [r for r in daemon.lines if r.get("event") == "datadir.exposed"]
