"""Client tokens: `recalld token add/list/revoke`, seen by a running daemon, read-only enforced."""

from __future__ import annotations

import json
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from websockets.exceptions import InvalidStatus

from gateway.cli.main import main
from gateway.client import Client, RpcError
from gateway.config import Config
from gateway.errors import Forbidden
from tests.conftest import TOKEN, running
from tests.fake_openai import FakeOpenAI
from tests.gateway.test_memory_methods import say, search_until


def _cli(data_dir: Path, *args: str) -> int:
    return main(["--data-dir", str(data_dir), "token", *args])


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_add_list_revoke_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`token add` writes the token 0600 into a 0700 folder it makes (or prints it once),
    keeps only its hash, `list` shows name/access/created and never a token, `revoke` removes it."""
    data = tmp_path / "data"
    target = tmp_path / "home" / "agents" / "claude.token"
    assert _cli(data, "add", "claude", "--read-only", "--file", str(target)) == 0
    out = capsys.readouterr()
    token = target.read_text().strip()
    assert len(token) >= 32 and token not in out.out + out.err
    assert _mode(target) == 0o600 and _mode(target.parent) == 0o700
    assert _cli(data, "add", "phone") == 0
    shown = capsys.readouterr()
    phone = shown.out.strip()
    assert len(phone) >= 32 and "shown once" in shown.err
    kept = (data / "clients.json").read_text()
    assert _mode(data / "clients.json") == 0o600
    assert token not in kept and phone not in kept and len(json.loads(kept)["tokens"]) == 2
    assert _cli(data, "add", "phone") == 1 and "already has a token" in capsys.readouterr().err
    assert _cli(data, "list") == 0
    listed = capsys.readouterr().out
    assert ("claude" in listed and "read-only" in listed and "phone" in listed
            and "read-write" in listed)
    assert token not in listed and phone not in listed
    assert _cli(data, "revoke", "phone") == 0
    capsys.readouterr()
    assert _cli(data, "list") == 0
    assert "phone" not in capsys.readouterr().out
    assert (_cli(data, "revoke", "phone") == 1
            and "no client named 'phone'" in capsys.readouterr().err)


def test_add_refuses_a_symlinked_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A --file that is a symbolic link is refused and no token is added."""
    data = tmp_path / "data"
    link = tmp_path / "claude.token"
    link.symlink_to(tmp_path / "elsewhere")
    assert _cli(data, "add", "claude", "--file", str(link)) == 2
    assert "symbolic link" in capsys.readouterr().err
    assert not (tmp_path / "elsewhere").exists()
    assert _cli(data, "list") == 0 and "claude" not in capsys.readouterr().out


async def test_running_daemon_sees_added_and_revoked_tokens(config_factory: Callable[..., Config],
                                                           tmp_path: Path) -> None:
    """A token added while the daemon runs signs in at once (header and auth method), and once
    revoked is refused at the upgrade (401) and by `auth`, without a restart."""
    cfg = config_factory()
    async with running(cfg) as app:
        target = tmp_path / "phone.token"
        assert _cli(cfg.data_dir, "add", "phone", "--file", str(target)) == 0
        token = target.read_text().strip()
        async with Client.connect(app.url, token) as c:
            assert (await c.call("gateway.health"))["status"] == "ok"
        assert _cli(cfg.data_dir, "revoke", "phone") == 0
        with pytest.raises(InvalidStatus) as refused:
            async with Client.connect(app.url, token):
                pass
        assert refused.value.response.status_code == 401
        async with Client.connect(app.url, None) as anon:
            with pytest.raises(RpcError) as err:
                await anon.call("auth", {"token": token})
            assert err.value.code == -32001


async def test_read_only_token_reads_but_never_writes(config_factory: Callable[..., Config],
                                                      tmp_path: Path,
                                                      fake_openai: FakeOpenAI) -> None:
    """A read-only client token can search and list, but memory.facts.add, chat.send,
    memory.forget and sessions.create answer -32005 naming the client, and nothing is written."""
    cfg = config_factory(llm={"base_url": fake_openai.base_url, "api_key": "sk-test",
                              "model": "fake-model", "max_retries": 0}, memory={"debounce_ms": 20})
    async with running(cfg) as app:
        target = tmp_path / "claude.token"
        assert _cli(cfg.data_dir, "add", "claude", "--read-only", "--file", str(target)) == 0
        ro = target.read_text().strip()
        async with Client.connect(app.url, TOKEN) as owner:
            key = (await owner.call("sessions.create", {}))["sessionKey"]
            await say(owner, key, "My favourite mountain is Ben Nevis.")
            await search_until(owner, {"query": "favourite mountain"})
        async with Client.connect(app.url, ro) as c:
            found = await c.call("memory.search", {"query": "favourite mountain"})
            assert found["results"]
            assert (await c.call("memory.facts.list"))["facts"] == []
            assert [s["sessionKey"] for s in (await c.call("sessions.list"))["sessions"]] == [key]
            for method, params in (("memory.facts.add", {"text": "I like tea"}),
                                   ("chat.send", {"sessionKey": key, "message": "hello"}),
                                   ("memory.forget", {"sessionKey": key}),
                                   ("sessions.create", {}),
                                   ("auth.code", {})):
                with pytest.raises(RpcError) as err:
                    await c.call(method, params)
                assert err.value.code == Forbidden.code, method
                assert "read-only" in err.value.message and "'claude'" in err.value.message
            assert (await c.call("memory.facts.list"))["facts"] == []
            assert len((await c.call("sessions.list"))["sessions"]) == 1


async def test_fact_saved_through_a_client_token_names_it(config_factory: Callable[..., Config],
                                                         tmp_path: Path) -> None:
    """memory.facts.list shows `client` = the token's name for a fact added through a client
    token (also signed in with the auth method), and null for one added with the user's own."""
    cfg = config_factory()
    async with running(cfg) as app:
        target = tmp_path / "claude.token"
        assert _cli(cfg.data_dir, "add", "claude", "--file", str(target)) == 0
        async with Client.connect(app.url, None) as agent:
            await agent.call("auth", {"token": target.read_text().strip()})
            added = await agent.call("memory.facts.add", {"text": "My cat is called Miso"})
            assert added["fact"]["client"] == "claude"
        async with Client.connect(app.url, TOKEN) as owner:
            await owner.call("memory.facts.add", {"text": "I live in Leeds"})
            facts = {f["text"]: f["client"]
                     for f in (await owner.call("memory.facts.list"))["facts"]}
        assert facts == {"My cat is called Miso": "claude", "I live in Leeds": None}
