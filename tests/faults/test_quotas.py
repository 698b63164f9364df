"""Per-user quotas ([quotas]) and the free-disk floor: past a limit a call answers -32004
with retryAfterMs (or a storage error before the disk is full), and nothing is half done."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import cast

import orjson
import pytest

from gateway.client import Client
from gateway.config import Config
from gateway.errors import RateLimited
from gateway.rpc import Quotas
from sessions import SessionsConfig, SessionStore, StorageError
from tests.conftest import TOKEN, running
from tests.fake_openai import FakeOpenAI
from tests.faults.test_lanes import batch

USERS = [{"name": "alice", "token": "alice-token-0123456789"},
         {"name": "bob", "token": "bob-token-0123456789xx"}]


def two_users(config_factory: Callable[..., Config], **sections: dict[str, object]) -> Config:
    auth = {"users": USERS, "token": None}
    return config_factory(auth=auth, **sections)


async def test_session_creation_is_rate_limited_per_user(
    config_factory: Callable[..., Config]
) -> None:
    """Past quotas.sessions_per_minute, sessions.create answers -32004 with retryAfterMs and
    creates nothing; another user is not affected."""
    async with running(two_users(config_factory, quotas={"sessions_per_minute": 3})) as app, \
            Client.connect(app.url, USERS[0]["token"]) as alice, \
            Client.connect(app.url, USERS[1]["token"]) as bob:
        replies = [await alice.request("sessions.create") for _ in range(5)]
        assert [("result" in r) for r in replies] == [True, True, True, False, False]
        error = replies[3]["error"]
        assert (error["code"] == -32004 and error["data"]["retryAfterMs"] > 0
                and "quotas.sessions_per_minute" in error["message"])
        assert len((await alice.call("sessions.list"))["sessions"]) == 3
        assert "result" in await bob.request("sessions.create")


async def test_concurrent_runs_are_limited_per_user_and_overall(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """A send that would start a new concurrent run past quotas.max_runs_per_user or
    quotas.max_runs answers -32004 and appends nothing; a send to a session already running
    only queues and is accepted."""
    fake_openai.configure(reply="slow reply words", deltas=3, delta_delay_s=0.5)
    cfg = two_users(config_factory, quotas={"max_runs": 3, "max_runs_per_user": 2},
                    chat={"recall": False},
                    llm={"base_url": fake_openai.base_url, "api_key": "sk-t", "max_retries": 0})
    async with running(cfg) as app, \
            Client.connect(app.url, USERS[0]["token"]) as alice, \
            Client.connect(app.url, USERS[1]["token"]) as bob:
        a = [(await alice.call("sessions.create"))["sessionKey"] for _ in range(3)]
        b = [(await bob.call("sessions.create"))["sessionKey"] for _ in range(2)]
        assert "result" in await alice.request("chat.send", {"sessionKey": a[0], "message": "one"})
        assert "result" in await alice.request("chat.send", {"sessionKey": a[1], "message": "two"})
        assert "result" in await alice.request("chat.send", {"sessionKey": a[0],
                                                             "message": "queued"})
        per_user = await alice.request("chat.send", {"sessionKey": a[2], "message": "three"})
        assert (per_user["error"]["code"] == -32004
                and "max_runs_per_user" in per_user["error"]["message"])
        assert "result" in await bob.request("chat.send", {"sessionKey": b[0],
                                                           "message": "bob one"})
        overall = await bob.request("chat.send", {"sessionKey": b[1], "message": "bob two"})
        assert (overall["error"]["code"] == -32004
                and "quotas.max_runs" in overall["error"]["message"])
        assert overall["error"]["data"]["retryAfterMs"] > 0
        assert (await alice.call("sessions.get", {"sessionKey": a[2]}))["messageCount"] == 0
        assert (await bob.call("sessions.get", {"sessionKey": b[1]}))["messageCount"] == 0


async def test_searches_in_flight_are_limited_per_user(
    config_factory: Callable[..., Config]
) -> None:
    """Past quotas.max_searches_per_user memory.search calls running at once, the next one
    answers -32004 at once; the ones admitted are answered."""
    async with running(config_factory(quotas={"max_searches_per_user": 1})) as app, \
            Client.connect(app.url, TOKEN) as c:
        replies = await batch(c, *[("memory.search", {"query": f"anything {i}"}) for i in range(3)])
        codes = [r["error"]["code"] if "error" in r else "ok" for r in replies]
        assert codes[0] == "ok" and codes.count(-32004) >= 1, codes
        refused = next(r for r in replies if "error" in r)
        assert "max_searches_per_user" in refused["error"]["message"]


async def test_writes_stop_at_the_free_disk_floor(config_factory: Callable[..., Config]) -> None:
    """With less free disk than sessions.min_free_bytes, sessions.create answers a retryable
    storage error saying the disk is almost full, and no transcript is created."""
    async with running(config_factory(sessions={"min_free_bytes": 2**62})) as app, \
            Client.connect(app.url, TOKEN) as c:
        reply = await c.request("sessions.create")
        assert reply["error"]["code"] == -32603 and reply["error"]["data"] == {"retryable": True}
        assert ("disk almost full" in reply["error"]["message"]
                and "min_free_bytes" in reply["error"]["message"])
        assert not list((app.config.data_dir / "sessions").glob("*/*.jsonl"))


def test_appends_stop_at_the_free_disk_floor(tmp_path: Path) -> None:
    """An append below the free-disk floor raises StorageError (ENOSPC) and leaves the
    transcript exactly as it was."""
    with SessionStore(tmp_path) as store:
        key = store.create("alice").session_key
        store.append_message("alice", key, role="user", content="kept")
        path = store.transcript_path("alice", key)
    before = path.read_bytes()
    with SessionStore(tmp_path, SessionsConfig(min_free_bytes=2**62)) as store:
        with pytest.raises(StorageError) as info:
            store.append_message("alice", key, role="user", content="refused")
        assert "disk almost full" in info.value.message and info.value.errno == 28
    assert path.read_bytes() == before
    assert [orjson.loads(line)["content"] for line in before.splitlines()[1:]] == ["kept"]


async def test_session_updates_and_fact_adds_are_rate_limited_per_user(
    config_factory: Callable[..., Config]
) -> None:
    """Past quotas.updates_per_minute, sessions.update and memory.facts.add each answer -32004
    with retryAfterMs naming the key and change nothing; another user is not affected."""
    async with running(two_users(config_factory, quotas={"updates_per_minute": 3})) as app, \
            Client.connect(app.url, USERS[0]["token"]) as alice, \
            Client.connect(app.url, USERS[1]["token"]) as bob:
        key = (await alice.call("sessions.create"))["sessionKey"]
        store = cast(SessionStore, app.store)  # the file store: config_factory is SQLite's
        size = store.transcript_path("alice", key).stat().st_size
        prompt = "p" * 60_000
        replies = [await alice.request("sessions.update", {"sessionKey": key, "title": f"t{i}",
                                                           "systemPrompt": prompt})
                   for i in range(5)]
        assert [("result" in r) for r in replies] == [True, True, True, False, False]
        error = replies[3]["error"]
        assert error["code"] == -32004 and error["data"]["retryAfterMs"] > 0
        assert "quotas.updates_per_minute" in error["message"]
        assert (await alice.call("sessions.get", {"sessionKey": key}))["title"] == "t2"
        grown = store.transcript_path("alice", key).stat().st_size - size
        assert 3 * 60_000 < grown < 4 * 60_000  # three update lines, not five
        facts = [await alice.request("memory.facts.add", {"text": f"alice fact number {i}"})
                 for i in range(4)]
        assert [("result" in r) for r in facts] == [True, True, True, False]
        assert (facts[3]["error"]["code"] == -32004
                and "quotas.updates_per_minute" in facts[3]["error"]["message"])
        bob_key = (await bob.call("sessions.create"))["sessionKey"]
        assert "result" in await bob.request("sessions.update", {"sessionKey": bob_key,
                                                                 "title": "bob"})
        assert "result" in await bob.request("memory.facts.add", {"text": "bob fact"})


async def test_session_updates_stop_at_the_free_disk_floor(
    config_factory: Callable[..., Config]
) -> None:
    """With less free disk than sessions.min_free_bytes, sessions.update answers the retryable
    "disk almost full" storage error and the transcript and title stay as they were."""
    cfg = config_factory(sessions={"min_free_bytes": 2**62})
    with SessionStore(cfg.data_dir) as store:  # made while the disk was not "full"
        key = store.create("default", title="before").session_key
        path = store.transcript_path("default", key)
    before = path.read_bytes()
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        reply = await c.request("sessions.update", {"sessionKey": key, "title": "after",
                                                    "systemPrompt": "q" * 60_000})
        assert (reply["error"]["code"] == -32603
                and reply["error"]["data"] == {"retryable": True}), reply
        assert "disk almost full" in reply["error"]["message"]
        assert (await c.call("sessions.get", {"sessionKey": key}))["title"] == "before"
    assert path.read_bytes() == before


def test_pruning_buckets_keeps_a_partly_spent_bucket_of_a_faster_method() -> None:
    """Forgetting refilled buckets (past 10,000 of them) judges each by its own method's rate:
    a user's half-spent bucket of a 600-a-minute method survives a prune triggered by a
    60-a-minute method, so the user does not get a fresh burst, and a bucket made once the
    table is that large limits its user like any other."""
    quotas = Quotas(per_minute={"slow": (60, "quotas.slow"), "fast": (600, "quotas.fast")},
                    clock=lambda: 0.0)
    for _ in range(300):
        with quotas.admit("alice", "fast"):
            pass
    for i in range(10_001):  # a new bucket each: the last one prunes
        with quotas.admit(f"user{i}", "slow"):
            pass
    def burst(user: str, method: str) -> int:
        admitted = 0
        with contextlib.suppress(RateLimited):
            for _ in range(1_000):
                with quotas.admit(user, method):
                    admitted += 1
        return admitted

    assert burst("alice", "fast") == 300
    assert burst("newcomer", "slow") == 60  # a bucket made past the threshold holds too


async def test_chat_message_bytes_are_rate_limited_per_user(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """Past quotas.message_bytes_per_minute, chat.send answers -32004 with retryAfterMs naming
    the setting and appends nothing; a repeated idempotencyKey (nothing appended) takes nothing
    from the bucket, and another user is not affected (issue 22, N4)."""
    cfg = two_users(config_factory, quotas={"message_bytes_per_minute": 4096},
                    chat={"recall": False, "max_message_bytes": 2000},
                    llm={"base_url": fake_openai.base_url, "api_key": "sk-t", "max_retries": 0})
    async with running(cfg) as app, \
            Client.connect(app.url, USERS[0]["token"]) as alice, \
            Client.connect(app.url, USERS[1]["token"]) as bob:
        a = [(await alice.call("sessions.create"))["sessionKey"] for _ in range(3)]
        message = "m" * 1500
        first = {"sessionKey": a[0], "message": message, "idempotencyKey": "once"}
        assert "result" in await alice.request("chat.send", first)
        assert (await alice.call("chat.send", first)).get("duplicate") is True
        assert "result" in await alice.request("chat.send", {"sessionKey": a[1],
                                                             "message": message})
        over = await alice.request("chat.send", {"sessionKey": a[2], "message": message})
        error = over["error"]
        assert (error["code"] == -32004
                and "quotas.message_bytes_per_minute" in error["message"]), error
        assert error["data"]["retryAfterMs"] > 0
        assert (await alice.call("sessions.get", {"sessionKey": a[2]}))["messageCount"] == 0
        b = (await bob.call("sessions.create"))["sessionKey"]
        assert "result" in await bob.request("chat.send", {"sessionKey": b, "message": message})


async def test_fact_updates_are_rate_limited_per_user(
    config_factory: Callable[..., Config]
) -> None:
    """Past quotas.updates_per_minute, memory.facts.update answers -32004 with retryAfterMs naming
    the key and changes nothing (its own bucket, apart from memory.facts.add's); another user is
    not affected (issue 22, item 13)."""
    async with running(two_users(config_factory, quotas={"updates_per_minute": 3})) as app, \
            Client.connect(app.url, USERS[0]["token"]) as alice, \
            Client.connect(app.url, USERS[1]["token"]) as bob:
        fact = (await alice.call("memory.facts.add", {"text": "alice has a cat"}))["fact"]
        replies = []
        for i in range(4):
            reply = await alice.request("memory.facts.update", {"id": fact["id"],
                                                                "text": f"alice has {i + 2} cats"})
            replies.append(reply)
            if "result" in reply:
                fact = reply["result"]["fact"]
        assert [("result" in r) for r in replies] == [True, True, True, False]
        error = replies[3]["error"]
        assert error["code"] == -32004 and error["data"]["retryAfterMs"] > 0
        assert "quotas.updates_per_minute" in error["message"]
        facts = (await alice.call("memory.facts.list"))["facts"]
        assert [f["text"] for f in facts] == ["alice has 4 cats"]
        bob_fact = (await bob.call("memory.facts.add", {"text": "bob has a dog"}))["fact"]
        assert "result" in await bob.request("memory.facts.update", {"id": bob_fact["id"],
                                                                     "text": "bob has two dogs"})
