"""What a new user met running the CLI beside a daemon (issue 22, "found by a new user")."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gateway.cli.importer import import_conversations, session_key_for
from gateway.cli.importer_formats import Conversation, Turn
from gateway.client import Client
from sessions import SessionsConfig, SessionStore
from tests.conftest import TOKEN
from tests.daemon import Daemon
from tests.fake_openai import FakeOpenAI
from tests.faults.helpers import FaultDaemon


def _env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLD_", "OPENAI_"))}
    return {**base, **extra}


@pytest.fixture
def daemon(tmp_path: Path):  # type: ignore[no-untyped-def]
    d = Daemon(tmp_path / "data")
    yield d
    d.kill()


def test_a_closed_stdout_exits_quietly(daemon: Daemon) -> None:
    """`recalld call … | head` whose reader is gone prints nothing on stderr and exits as `cat`
    does (128 + SIGPIPE), not "cannot reach" with 1: the daemon was reached."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader left before the first byte
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "gateway", "--data-dir", str(daemon.data_dir), "call",
             "rpc.discover", "--url", daemon.url],
            stdout=write_end, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, timeout=60, env=_env(RECALLD_TOKEN=TOKEN))
    finally:
        os.close(write_end)
    assert proc.stderr == ""
    assert proc.returncode == 141


async def _cli(data_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "gateway", "--data-dir", str(data_dir), *args],
        capture_output=True, text=True, timeout=120, env=_env(**env), stdin=subprocess.DEVNULL)


async def test_cli_commands_beside_the_daemon_keep_its_embedder(
    tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    """A daemon embedding with an OpenAI-compatible endpoint set in its own environment only:
    `recalld import` and `recalld memory status` run from a shell without those variables pick
    another embedder, so they embed nothing (saying why) and neither they nor the daemon log an
    embedder change; the daemon's embedder stays the index's."""
    source = tmp_path / "source"
    with SessionStore(source, SessionsConfig(fsync="never")) as store:
        key = store.create("old", title="alpha").session_key
        store.append_message("old", key, role="user", content="my cat is called Bubbles")
    dump = tmp_path / "export.jsonl"
    dump.write_bytes((source / "sessions" / "old" / f"{key}.jsonl").read_bytes())
    data = tmp_path / "data"
    d = await FaultDaemon.start(data, env={"OPENAI_API_KEY": "sk-test",
                                           "OPENAI_BASE_URL": fake_openai.base_url,
                                           "RECALLD_MEMORY_EMBEDDER": "auto"})
    try:
        imported = await _cli(data, "import", str(dump), "--user", "bo",
                              RECALLD_MEMORY_EMBEDDER="auto")
        assert imported.returncode == 0, imported.stderr
        assert "memory.embedder.changed" not in imported.stderr
        assert "leaves new chunks to the daemon" in imported.stderr
        status = await _cli(data, "memory", "status", "--json", RECALLD_MEMORY_EMBEDDER="auto")
        assert status.returncode == 0, status.stderr
        assert "memory.embedder.changed" not in status.stderr
        async with Client.connect(d.url, TOKEN) as c:
            served = await c.call("memory.status")
        assert (served["provider"] == "openai"
                and served["vectorSearch"]["reason"] != "no embedder"), served
        assert not d.events("memory.embedder.changed")
    finally:
        await d.akill()


def test_an_import_skips_what_the_store_refuses_and_goes_on(tmp_path: Path) -> None:
    """A conversation whose title is too long keeps its messages under the default title, and a
    message too large for one transcript line becomes a placeholder naming the limit; the
    import goes on to the next conversation, reports both, and a resumed import (cut after the
    big message) lines up the same way and appends only the rest (issue 22, item 13)."""
    config = SessionsConfig(fsync="never", max_line_bytes=64 * 1024)
    turns = (Turn("user", "first words", "2024-02-01T10:00:00Z"),
             Turn("assistant", "B" * 100_000, "2024-02-01T10:00:01Z"),
             Turn("user", "after the big one", "2024-02-01T10:00:02Z"))
    long_title = Conversation("c-1", "T" * 1000, "2024-02-01T10:00:00Z", turns)
    next_one = Conversation("c-2", "fine", "2024-02-02T10:00:00Z", (Turn("user", "hello", None),))
    data = tmp_path / "data"
    cut = import_conversations(data, config, "default", "jsonl",
                               [replace(long_title, turns=turns[:2])])
    assert cut.messages == 2 and len(cut.skipped) == 2
    report = import_conversations(data, config, "default", "jsonl", [long_title, next_one])
    assert (report.created, report.resumed, report.messages) == (1, 1, 2)
    assert report.skipped == ()  # nothing new was refused: the big message was placed before
    with SessionStore(data, config) as store:
        first = store.get("default", session_key_for("default", "jsonl", "c-1"))
        assert first.title != long_title.title and first.message_count == 3
        page = store.history("default", first.session_key, limit=10)[0]
        assert [m.content for m in page][0::2] == ["first words", "after the big one"]
        assert "sessions.max_line_bytes" in page[1].content
        assert store.get("default", session_key_for("default", "jsonl", "c-2")).message_count == 1
    assert any("title left out" in line for line in cut.skipped)
    assert any("message 2 not imported" in line for line in cut.skipped)
