"""Item 11 of issue 10: the indexer trusts neither directory names nor symlinks. A copy of
alice's transcript placed in bob's directory, and a symlink in bob's directory to a file
outside the data dir, are skipped and reported, never searchable by bob."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import orjson

from gateway.app import App
from gateway.client import Client
from gateway.config import Config
from memory import MemoryService
from tests.conftest import running
from tests.fake_openai import FakeOpenAI
from tests.gateway.test_memory_methods import say, search_until

ALICE = {"name": "alice", "token": "alice-token-0123456789abcdefghijkl"}
BOB = {"name": "bob", "token": "bob-token-0123456789abcdefghijklmno"}


def two_users(factory: Callable[..., Config], fake: FakeOpenAI, admin: str) -> Config:
    # The admin sees status for the whole index, skippedFiles included.
    return factory(auth={"users": [ALICE, BOB], "token": None, "admin": admin},
                   llm={"base_url": fake.base_url, "api_key": "sk-test", "model": "fake-model",
                        "max_retries": 0},
                   memory={"debounce_ms": 20})


async def synced_after(c: Client, before: int, timeout: float = 20.0) -> dict[str, Any]:
    """memory.status once a sync later than ``before`` finished and none runs."""
    async with asyncio.timeout(timeout):
        while True:
            status: dict[str, Any] = await c.call("memory.status")
            if status["syncCount"] > before and not status["syncing"]:
                return status
            await asyncio.sleep(0.05)


def outside_transcript(path: Path, user: str, key: str, text: str) -> None:
    """A well-formed transcript (header and one message) written by hand."""
    header = {"type": "session", "version": 1, "sessionKey": key, "user": user,
              "createdAt": "2026-11-20T09:00:00.000Z", "title": "planted"}
    message = {"type": "message", "id": "m" * 26, "role": "user", "content": text,
               "ts": "2026-11-20T09:00:01.000Z"}
    path.write_bytes(orjson.dumps(header) + b"\n" + orjson.dumps(message) + b"\n")


async def test_a_copy_in_another_users_directory_is_skipped(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """alice's transcript copied into sessions/bob/ (header user alice) is not indexed for bob,
    even by a full reindex; memory.status counts it as skipped; alice still finds her own."""
    cfg = two_users(config_factory, fake_openai, admin="bob")
    async with running(cfg) as app:
        async with Client.connect(app.url, ALICE["token"]) as alice, \
                Client.connect(app.url, BOB["token"]) as bob:
            key = (await alice.call("sessions.create"))["sessionKey"]
            await say(alice, key, "Alice's safe combination is 31-7-22, kept in the attic.")
            await search_until(alice, {"query": "safe combination attic"})
            sessions = cfg.data_dir / "sessions"
            (sessions / "bob").mkdir(mode=0o700, exist_ok=True)
            shutil.copy(sessions / "alice" / f"{key}.jsonl", sessions / "bob" / f"{key}.jsonl")
            before = (await bob.call("memory.status"))["syncCount"]
            await bob.call("memory.reindex", {"full": True})
            status = await synced_after(bob, before)
            assert (await bob.call("memory.search",
                                   {"query": "safe combination attic"}))["results"] == []
            assert status["skippedFiles"] >= 1
            assert (await alice.call("memory.search",
                                     {"query": "safe combination attic"}))["results"]


async def test_a_symlink_to_a_file_outside_is_skipped(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    """A symlink in sessions/bob/ to a transcript outside the data dir, reported by the file
    watcher or a nudge, is not followed: its text never becomes searchable by bob."""
    cfg = two_users(config_factory, fake_openai, admin="bob")
    outside = tmp_path / "outside.jsonl"
    key = "0123456789abcdef0123456789abcdef"
    outside_transcript(outside, "bob", key,
                       "The server room door code is 884422 and nobody should know.")
    async with running(cfg) as app:
        async with Client.connect(app.url, BOB["token"]) as bob:
            control = (await bob.call("sessions.create"))["sessionKey"]
            link = cfg.data_dir / "sessions" / "bob" / f"{key}.jsonl"
            link.symlink_to(outside)
            before = (await bob.call("memory.status"))["syncCount"]
            nudge_paths(app, link)
            await synced_after(bob, before)
            await say(bob, control, "A plain note about the server room.")
            await search_until(bob, {"query": "plain note server room"})
            hits = (await bob.call("memory.search", {"query": "door code 884422"}))["results"]
            assert [h for h in hits if "884422" in h["content"]] == []
            assert (await bob.call("memory.status"))["skippedFiles"] >= 1


def nudge_paths(app: App, *paths: Path) -> None:
    # What the watcher does when a file appears: mark the path for the next sync.
    assert app.memory is not None
    for path in paths:
        cast(MemoryService, app.memory.service).nudge(path)  # the SQLite service: it watches files
