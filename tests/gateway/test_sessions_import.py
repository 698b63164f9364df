"""`sessions.import`: a chat history sent over the WebSocket (what the web page's "Import chats"
does), against a real gateway on port 0 with a real client, parsed and written by the code
`recalld import` runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.cli.main import main
from gateway.client import Client, RpcError
from gateway.config import Config
from gateway.errors import Forbidden, InvalidParams, RateLimited
from gateway.importing import session_key_for
from tests.conftest import TOKEN, running
from tests.gateway.test_cli_import import chatgpt_export
from tests.gateway.test_memory_methods import search_until


def _transcripts(data_dir: Path, user: str = "default") -> dict[str, bytes]:
    folder = data_dir / "sessions" / user
    return {p.name: p.read_bytes() for p in folder.iterdir()} if folder.is_dir() else {}


async def test_a_chatgpt_export_becomes_sessions_announced_searchable_and_reimports_as_nothing(
    config_factory: Callable[..., Config],
) -> None:
    """The export's two conversations become the caller's sessions (the keys `recalld import`
    gives them, so the two never duplicate each other), each announced to a watching
    connection, their messages searchable; the same data again writes nothing."""
    cfg = config_factory(memory={"debounce_ms": 20})
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        await c.call("sessions.watch")
        data = json.dumps(chatgpt_export())
        checked = await c.call("sessions.import",
                               {"data": data, "name": "conversations.json", "dryRun": True})
        assert (checked["created"], checked["messages"], checked["dryRun"]) == (2, 5, True)
        assert _transcripts(cfg.data_dir) == {}
        reply = await c.call("sessions.import", {"data": data, "name": "conversations.json"})
        assert reply == {"format": "chatgpt", "conversations": 2, "created": 2, "resumed": 0,
                         "unchanged": 0, "empty": 0, "messages": 5, "leftOut": [],
                         "leftOutCount": 0, "dryRun": False}
        announced = [await c.next_event("sessions.created") for _ in range(2)]
        assert sorted(e["params"]["session"]["title"] for e in announced) == ["Bike", "Sourdough"]
        listed = {s["title"]: s for s in (await c.call("sessions.list"))["sessions"]}
        key = session_key_for("default", "chatgpt", "c-1")
        assert listed["Sourdough"]["sessionKey"] == key and listed["Sourdough"]["messageCount"] == 3
        history = await c.call("sessions.history", {"sessionKey": key})
        assert [m["content"] for m in history["messages"]] == [
            "my starter is called Bubbles", "Bubbles is a fine name", "feed it rye flour"]
        found = await search_until(c, {"query": "starter Bubbles"})
        assert found["results"][0]["sessionKey"] == key
        before = _transcripts(cfg.data_dir)
        again = await c.call("sessions.import", {"data": data})
        assert (again["created"], again["unchanged"], again["messages"]) == (0, 2, 0)
        assert _transcripts(cfg.data_dir) == before


async def test_a_part_of_an_export_sent_again_resumes_a_cut_import(
        config_factory: Callable[..., Config]) -> None:
    """A conversation whose session holds only its first messages (an import cut short) gets
    exactly the rest; a recalld JSONL transcript imports too."""
    cfg = config_factory()
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        export = chatgpt_export()
        cut = json.loads(json.dumps(export[1]))
        cut["mapping"]["x1"]["children"] = []
        cut["current_node"] = "x1"
        del cut["mapping"]["x2"]
        first = await c.call("sessions.import", {"data": json.dumps([cut])})
        assert (first["created"], first["messages"]) == (1, 1)
        rest = await c.call("sessions.import", {"data": json.dumps(export)})
        assert (rest["created"], rest["resumed"], rest["messages"]) == (1, 1, 4)
        # A transcript of this gateway, as `cat sessions/default/KEY.jsonl` gives it, imports as
        # a session of its own (its key derived from the transcript's).
        transcript = _transcripts(cfg.data_dir)[
            f"{session_key_for('default', 'chatgpt', 'c-2')}.jsonl"]
        moved = await c.call("sessions.import", {"data": transcript.decode(), "format": "jsonl"})
        assert (moved["format"], moved["created"], moved["messages"]) == ("jsonl", 1, 2)
        titles = sorted(s["title"] for s in (await c.call("sessions.list"))["sessions"])
        assert titles == ["Bike", "Bike", "Sourdough"]


@pytest.mark.parametrize(("params", "said"), [
    ({"data": "[{\"title\": \"x\", "}, "not valid JSON"),
    ({"data": "hello there"}, "nor recalld JSONL"),
    ({"data": "PK\u0003\u0004 the rest of a zip"}, "unzip it"),
    ({"data": json.dumps([{"title": "no mapping", "id": "c-9"}])}, "conversation 1: no 'mapping'"),
    ({"data": json.dumps(chatgpt_export()), "format": "jsonl"}, "line 1"),
    ({"data": "[]", "format": "xml"}, "must be one of"),
    ({"data": "[]", "sessionKey": "x"}, "unknown parameter"),
])
async def test_bad_input_is_refused_with_its_reason_and_writes_nothing(
    config_factory: Callable[..., Config], params: dict[str, Any], said: str,
) -> None:
    """Malformed JSON, an unknown format, a zip, a malformed conversation after a good one, a
    format that does not match and a misspelt parameter each answer -32602 naming what is
    wrong, and not one session is written."""
    cfg = config_factory()
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        if "conversation 1" in said:  # a good conversation before the bad one: still nothing
            params = {"data": json.dumps([chatgpt_export()[1], *json.loads(params["data"])])}
            said = "conversation 2: no 'mapping'"
        with pytest.raises(RpcError) as err:
            await c.call("sessions.import", params)
        assert err.value.code == InvalidParams.code
        assert said in err.value.message, err.value.message
        assert (await c.call("sessions.list"))["sessions"] == []
        assert _transcripts(cfg.data_dir) == {}


async def test_read_only_tokens_cannot_import_and_the_byte_quota_holds(
    config_factory: Callable[..., Config], tmp_path: Path,
) -> None:
    """A read-only client token gets -32005 (a dry run too); data past
    quotas.import_bytes_per_minute answers -32004 with retryAfterMs; rpc.discover publishes
    server.max_size as data's maxLength (what the page cuts its parts by)."""
    cfg = config_factory(server={"max_size": 65536}, quotas={"import_bytes_per_minute": 1024})
    async with running(cfg) as app:
        target = tmp_path / "phone.token"
        assert main(["--data-dir", str(cfg.data_dir), "token", "add", "phone", "--read-only",
                     "--file", str(target)]) == 0
        async with Client.connect(app.url, target.read_text().strip()) as ro:
            for dry_run in (False, True):
                with pytest.raises(RpcError) as err:
                    await ro.call("sessions.import",
                                  {"data": json.dumps(chatgpt_export()), "dryRun": dry_run})
                assert err.value.code == Forbidden.code and "read-only" in err.value.message
        async with Client.connect(app.url, TOKEN) as c:
            doc = await c.call("rpc.discover")
            [method] = [m for m in doc["methods"] if m["name"] == "sessions.import"]
            [data] = [p for p in method["params"] if p["name"] == "data"]
            assert data["schema"]["maxLength"] == 65536 and method["x-writes"] is True
            big = json.dumps([{**conv, "title": "x" * 20_000} for conv in chatgpt_export()])
            # one call always fits
            assert (await c.call("sessions.import", {"data": big}))["created"] == 2
            with pytest.raises(RpcError) as err:
                await c.call("sessions.import", {"data": big})
            assert err.value.code == RateLimited.code and err.value.data["retryAfterMs"] > 0
            assert "quotas.import_bytes_per_minute" in err.value.message
        assert len(_transcripts(cfg.data_dir)) == 2


async def test_import_on_each_storage_backend(
        backend_config_factory: Callable[..., Config]) -> None:
    """On SQLite + JSONL and on PostgreSQL alike: the sessions get the keys the import chooses
    (the store's own key factory still names every other new session), a second import writes
    nothing, and the messages are searchable."""
    cfg = backend_config_factory(memory={"debounce_ms": 20})
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        data = json.dumps(chatgpt_export())
        assert (await c.call("sessions.import", {"data": data}))["created"] == 2
        other = (await c.call("sessions.create", {"title": "typed by hand"}))["sessionKey"]
        keys = {s["sessionKey"] for s in (await c.call("sessions.list"))["sessions"]}
        imported = {session_key_for("default", "chatgpt", source) for source in ("c-1", "c-2")}
        assert keys == imported | {other} and other not in imported
        again = await c.call("sessions.import", {"data": data})
        assert (again["unchanged"], again["messages"]) == (2, 0)
        found = await search_until(c, {"query": "chain squeaks"})
        assert found["results"][0]["sessionKey"] == session_key_for("default", "chatgpt", "c-2")
