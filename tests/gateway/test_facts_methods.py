"""memory.facts.* over the gateway: the user's own control of remembered facts."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gateway.client import Client, RpcError
from gateway.config import Config
from tests.conftest import TOKEN, running

USERS = [{"name": "alice", "token": "alice-token-0123456789"},
         {"name": "bob", "token": "bob-token-0123456789xx"}]


async def test_facts_methods_are_discoverable(config_factory: Callable[..., Config]) -> None:
    """rpc.discover lists the four facts methods with the text bound from memory.facts_max_chars."""
    async with running(config_factory(memory={"facts_max_chars": 150})) as app, \
            Client.connect(app.url, TOKEN) as c:
        doc = await c.call("rpc.discover")
        methods = {m["name"]: m for m in doc["methods"]}
        for name in ("memory.facts.list", "memory.facts.add", "memory.facts.update",
                     "memory.facts.delete"):
            assert name in methods
        text = next(p for p in methods["memory.facts.add"]["params"] if p["name"] == "text")
        assert text["schema"]["maxLength"] == 150


async def test_add_list_update_delete_round_trip(
        backend_config_factory: Callable[..., Config]) -> None:
    """A fact added, corrected and deleted over RPC: the list shows each state, pages
    follow next."""
    async with running(backend_config_factory()) as app, Client.connect(app.url, TOKEN) as c:
        first = await c.call("memory.facts.add", {"text": "I have a dog called Rex"})
        assert first["action"] == "added"
        dup = await c.call("memory.facts.add", {"text": "i have a dog called rex."})
        assert dup["action"] == "unchanged" and dup["fact"]["id"] == first["fact"]["id"]
        fixed = await c.call("memory.facts.update",
                             {"id": first["fact"]["id"], "text": "I have a dog called Max"})
        assert fixed["action"] == "replaced" and fixed["fact"]["replaces"] == first["fact"]["id"]
        await c.call("memory.facts.add", {"text": "I live by the sea"})
        page = await c.call("memory.facts.list", {"limit": 1})
        assert [f["text"] for f in page["facts"]] == ["I live by the sea"] and "next" in page
        rest = await c.call("memory.facts.list", {"limit": 5, "before": page["next"]})
        assert ([f["text"] for f in rest["facts"]] == ["I have a dog called Max"]
                and "next" not in rest)
        everything = await c.call("memory.facts.list", {"includeInactive": True})
        assert len(everything["facts"]) == 3
        assert (await c.call("memory.facts.delete", {"id": fixed["fact"]["id"]})
                == {"deleted": True, "id": fixed["fact"]["id"]})
        assert ([f["text"] for f in (await c.call("memory.facts.list"))["facts"]]
                == ["I live by the sea"])


async def test_facts_are_per_user_and_bad_input_is_refused(
        backend_config_factory: Callable[..., Config]) -> None:
    """Another user's fact id answers -32002; too-long or empty text answers -32602 and
    saves nothing."""
    cfg = backend_config_factory(auth={"users": USERS, "token": None},
                                 memory={"facts_max_chars": 40})
    async with running(cfg) as app:
        async with Client.connect(app.url, USERS[0]["token"]) as alice, \
                Client.connect(app.url, USERS[1]["token"]) as bob:
            fact = (await alice.call("memory.facts.add",
                                     {"text": "My PIN hint is the cat"}))["fact"]
            assert (await bob.call("memory.facts.list"))["facts"] == []
            for method, params in (("memory.facts.delete", {"id": fact["id"]}),
                                   ("memory.facts.update", {"id": fact["id"], "text": "mine now"})):
                with pytest.raises(RpcError) as info:
                    await bob.call(method, params)
                assert info.value.code == -32002
            for text in ("x" * 41, "   "):
                with pytest.raises(RpcError) as info:
                    await alice.call("memory.facts.add", {"text": text})
                assert info.value.code == -32602 and info.value.data["field"] == "text"
            assert len((await alice.call("memory.facts.list"))["facts"]) == 1
