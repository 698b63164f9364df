"""rpc.discover publishes every method's result schema, generated from the handler's result type,
and real replies match what it publishes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, NotRequired, TypedDict

from gateway.client import Client
from gateway.config import Config
from gateway.rpc.registry import result_schema
from tests.conftest import TOKEN, running
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.gateway.test_memory_methods import chat_config, search_until

_TYPES: dict[str, Any] = {"object": dict, "array": list, "string": str, "boolean": bool,
                          "null": type(None)}


def problems(value: Any, schema: dict[str, Any], at: str = "result") -> list[str]:
    """Where ``value`` breaks ``schema`` (the JSON Schema subset rpc.discover uses), strictly: an
    object whose schema lists properties may carry no key it does not list."""
    if "anyOf" in schema or "oneOf" in schema:
        options = schema.get("anyOf") or schema["oneOf"]
        fits = sum(not problems(value, option, at) for option in options)
        ok = fits >= 1 if "anyOf" in schema else fits == 1
        return [] if ok else [f"{at}: {value!r} fits {fits} of its {len(options)} options"]
    if "enum" in schema:
        return [] if value in schema["enum"] else [f"{at}: {value!r} not in {schema['enum']}"]
    kind = schema.get("type")
    if kind in ("integer", "number"):
        wanted: tuple[type, ...] = (int,) if kind == "integer" else (int, float)
        if isinstance(value, bool) or not isinstance(value, wanted):
            return [f"{at}: {value!r} is not {kind}"]
        return []
    if kind is not None and not isinstance(value, _TYPES[kind]):
        return [f"{at}: {type(value).__name__} is not {kind}"]
    found: list[str] = []
    if kind == "object":
        properties = schema.get("properties")
        found += [f"{at}: missing {key}" for key in schema.get("required", []) if key not in value]
        for key, item in value.items():
            if properties is not None and key in properties:
                found += problems(item, properties[key], f"{at}.{key}")
            elif "additionalProperties" in schema:
                found += problems(item, schema["additionalProperties"], f"{at}.{key}")
            elif properties is not None:
                found.append(f"{at}: {key} is not published")
    elif kind == "array":
        for i, item in enumerate(value):
            found += problems(item, schema["items"], f"{at}[{i}]")
    return found


async def _schemas(c: Client) -> dict[str, dict[str, Any]]:
    doc = await c.call("rpc.discover")
    return {m["name"]: m["result"]["schema"] for m in doc["methods"]}


async def test_every_method_publishes_an_object_result_with_properties(client: Client) -> None:
    """Each method's published result is an object with properties and its required members."""
    schemas = await _schemas(client)
    assert len(schemas) >= 23
    for name, schema in schemas.items():
        assert schema["type"] == "object", name
        assert schema["properties"], name
        assert schema["required"] and set(schema["required"]) <= set(schema["properties"]), name
    doc = await client.call("rpc.discover")
    assert problems(doc, schemas["rpc.discover"]) == []


async def test_replies_validate_against_their_published_schema(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """Replies of every kind of method, built the way clients get them, fit the published schema."""
    fake_openai.configure(reply="Rust is a fine choice.")
    cfg = chat_config(config_factory, fake_openai, embedder="openai")
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        schemas = await _schemas(c)
        replies: list[tuple[str, Any]] = []

        async def call(method: str, params: dict[str, Any] | None = None) -> Any:
            reply = await c.call(method, params)
            replies.append((method, reply))
            return reply

        await call("auth", {"token": TOKEN})
        await call("auth", {"code": (await call("auth.code"))["code"]})
        await call("gateway.health")
        await call("models.list")
        key = (await call("sessions.create", {"title": "langs"}))["sessionKey"]
        await call("sessions.create", {"title": "secret", "memory": False})
        await call("sessions.update", {"sessionKey": key, "systemPrompt": "Be brief."})
        await call("sessions.update", {"sessionKey": key, "temperature": 0.5, "maxTokens": 100})
        await call("sessions.get", {"sessionKey": key})
        await call("sessions.list", {"limit": 1})
        await call("sessions.watch")
        await call("sessions.import", {"data": '[{"id": "c-1", "title": "imported", "mapping": '
                   '{"a": {"message": {"author": {"role": "user"}, "content": {"content_type": '
                   '"text", "parts": ["hi"]}}}}}]'})
        run_id = (await call("chat.send", {"sessionKey": key, "message": "I like Rust",
                                           "idempotencyKey": "k1"}))["runId"]
        await call("chat.send",
                   {"sessionKey": key, "message": "I like Rust", "idempotencyKey": "k1"})
        while True:
            event = await c.next_event("chat.final")
            if event["params"]["runId"] == run_id:
                break
        # the edit's reply is cut
        fake_openai.script(Behaviour(), Behaviour(finish_reason="length"))
        for method, params in (("chat.regenerate", {"sessionKey": key}),
                               ("chat.edit", {"sessionKey": key, "text": "I like Go"}),
                               ("chat.continue", {"sessionKey": key})):
            run_id = (await call(method, params))["runId"]
            while (await c.next_event("chat.final"))["params"]["runId"] != run_id:
                pass
        history = await call("sessions.history", {"sessionKey": key})
        assert [m["role"] for m in history["messages"]] == ["user", "assistant"]
        edited = history["messages"][0]  # 2/2: the edit made it a second version (a marked history)
        await call("sessions.versions", {"sessionKey": key, "messageId": edited["id"]})
        await call("chat.choose", {"sessionKey": key, "messageId": edited["versions"]["ids"][0]})
        await call("sessions.history", {"sessionKey": key})
        await call("sessions.subscribe", {"sessionKey": key})
        await call("sessions.unsubscribe", {"sessionKey": key})
        await call("chat.abort", {"sessionKey": key})
        fact = (await call("memory.facts.add", {"text": "I have a dog called Rex"}))["fact"]
        await call("memory.facts.update", {"id": fact["id"], "text": "I have a dog called Max"})
        await call("memory.facts.list", {"includeInactive": True})
        await call("memory.facts.delete", {"id": fact["id"] + 1})
        await call("memory.episodes.list")
        await call("memory.reindex")
        # A hit with both legs: the vector leg may lag the keyword leg for a moment (the reindex
        # just queued re-embeds), so wait for it rather than read the first keyword-only hit.
        async with asyncio.timeout(30):
            while "vectorRank" not in (found := await search_until(
                    c, {"query": "Rust", "kinds": ["chunk", "episode"]}, timeout=30))["results"][0]:
                await asyncio.sleep(0.1)
        assert "vectorRank" in found["results"][0]
        replies.append(("memory.search", found))
        await call("memory.status")
        filed = (await call("sessions.create"))["sessionKey"]
        run_id = (await call("chat.send", {"sessionKey": filed, "message": "see file",
                                           "attachments": [{"name": "a.txt",
                                                            "mediaType": "text/plain",
                                                            "data": "aGVsbG8="}]}))["runId"]
        while (await c.next_event("chat.final"))["params"]["runId"] != run_id:
            pass
        sha = (await call("sessions.history",
                          {"sessionKey": filed}))["messages"][0]["attachments"][0]["sha256"]
        await call("sessions.attachment", {"sessionKey": filed, "sha256": sha})
        await call("memory.forget", {"sessionKey": key})
        await call("sessions.delete", {"sessionKey": key})
    assert {method for method, _ in replies} == set(schemas) - {"rpc.discover"}
    for method, reply in replies:
        assert problems(reply, schemas[method], method) == [], reply


class _Inner(TypedDict, total=False):
    a: int


class _Shape(TypedDict):
    name: str
    tags: list[str]
    inner: _Inner | None
    counts: dict[str, int]
    note: NotRequired[str]


def test_result_schema_follows_the_typed_dict() -> None:
    """NotRequired and total=False keys are left out of required (postponed annotations included);
    nested shapes, lists, dicts and optionals are published inline."""
    schema = result_schema(_Shape)
    assert schema["required"] == ["name", "tags", "inner", "counts"]
    assert schema["properties"]["tags"] == {"type": "array", "items": {"type": "string"}}
    assert schema["properties"]["counts"] == {"type": "object",
                                              "additionalProperties": {"type": "integer"}}
    inner = schema["properties"]["inner"]["oneOf"]
    assert inner == [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"type": "null"}]
