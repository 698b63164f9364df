"""Issue 22, item 8 (t12b), over the real gateway: a link planted in bob's part of the data dir
(as a transcript, or as his whole directory) makes sessions.history, sessions.get and chat.send
answer a clear storage error (-32603, not retryable); the file it points at is never returned
and keeps every byte."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.client import Client, RpcError
from gateway.config import Config
from tests.conftest import running
from tests.fake_openai import FakeOpenAI
from tests.faults.test_indexer_trust import BOB, outside_transcript, two_users

KEY = "0123456789abcdef0123456789abcdef"
SECRET = "The vault code is 884422 and nobody should know."


async def refused(c: Client, method: str, params: dict[str, object]) -> RpcError:
    with pytest.raises(RpcError) as info:
        await c.call(method, params)
    return info.value


def assert_link_refused(err: RpcError) -> None:
    assert err.code == -32603
    assert "symbolic link" in err.message and "884422" not in err.message
    assert err.data == {"retryable": False}


async def test_a_linked_transcript_is_neither_read_nor_appended_to(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    """sessions/bob/<key>.jsonl → a transcript outside the data dir: history, get and chat.send
    are refused; the outside file is unchanged and the daemon goes on serving bob."""
    cfg = two_users(config_factory, fake_openai, admin="bob")
    outside = tmp_path / "outside.jsonl"
    outside_transcript(outside, "bob", KEY, SECRET)
    before = outside.read_bytes()
    async with running(cfg) as app, Client.connect(app.url, BOB["token"]) as bob:
        own = (await bob.call("sessions.create"))["sessionKey"]
        (cfg.data_dir / "sessions" / "bob" / f"{KEY}.jsonl").symlink_to(outside)
        assert_link_refused(await refused(bob, "sessions.history", {"sessionKey": KEY}))
        assert_link_refused(await refused(bob, "sessions.get", {"sessionKey": KEY}))
        assert_link_refused(await refused(bob, "chat.send", {"sessionKey": KEY,
                                                             "message": "append me"}))
        assert KEY not in [s["sessionKey"] for s in (await bob.call("sessions.list"))["sessions"]]
        assert (await bob.call("sessions.history", {"sessionKey": own}))["messages"] == []
    assert outside.read_bytes() == before


async def test_a_linked_user_directory_is_refused(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    """sessions/bob → a directory outside holding bob's transcript: history and chat.send are
    refused, and nothing is read from or written into that directory."""
    cfg = two_users(config_factory, fake_openai, admin="bob")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    outside = elsewhere / f"{KEY}.jsonl"
    outside_transcript(outside, "bob", KEY, SECRET)
    before = outside.read_bytes()
    async with running(cfg) as app, Client.connect(app.url, BOB["token"]) as bob:
        (cfg.data_dir / "sessions" / "bob").symlink_to(elsewhere, target_is_directory=True)
        assert_link_refused(await refused(bob, "sessions.history", {"sessionKey": KEY}))
        assert_link_refused(await refused(bob, "chat.send", {"sessionKey": KEY,
                                                             "message": "append me"}))
        assert_link_refused(await refused(bob, "sessions.create", {}))
    assert outside.read_bytes() == before
    assert [p.name for p in elsewhere.iterdir()] == [outside.name]
