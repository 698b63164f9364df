"""The one map from sessions' and memory's errors to JSON-RPC errors (gateway.errors.wire_error)."""

from __future__ import annotations

import errno
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import pytest

from gateway.app import App
from gateway.chat import ChatEvent
from gateway.client import Client
from gateway.errors import (
    Conflict,
    GatewayError,
    StorageFailed,
    UpstreamError,
    to_error_object,
    wire_error,
)
from gateway.rpc import Registry, RpcCore, bounded
from memory import (
    EmbedderError,
    FactNotFound,
    InvalidFact,
    InvalidSearch,
    MemoryIndexError,
    MemoryStorageError,
    MemoryUnavailable,
)
from sessions import (
    InvalidSessionInput,
    LineTooLarge,
    SessionError,
    SessionNotFound,
    StorageError,
    UnsafePath,
)
from tests.conftest import TOKEN
from tests.gateway.test_chat import run_to_end
from tests.gateway.test_rpc_core import Ctx

STORAGE = {"code": -32603, "data": {"retryable": True}}


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (SessionNotFound(), {"code": -32002, "message": "session not found"}),
        (InvalidSessionInput("title", "must be at most 200 characters"),
         {"code": -32602, "data": {"field": "title", "reason": "must be at most 200 characters"}}),
        (LineTooLarge(2_000_000, 1_048_576), {"code": -32602, "data": {"field": "message"}}),
        (StorageError("no space left on device", errno=errno.ENOSPC),
         {**STORAGE, "message": "storage error: no space left on device"}),
        (UnsafePath("the transcript"), {"code": -32603, "data": {"retryable": False}}),
        (InvalidSearch("k", "must be an integer from 1 to 50"),
         {"code": -32602, "data": {"field": "k", "reason": "must be an integer from 1 to 50"}}),
        (InvalidFact("text", "is 250 characters; the limit is 200"),
         {"code": -32602,
          "data": {"field": "text", "reason": "is 250 characters; the limit is 200"}}),
        (FactNotFound("fact 7 not found"), {"code": -32002, "message": "fact 7 not found"}),
        (EmbedderError("embeddings endpoint answered 503", retryable=True, status=503),
         {"code": -32010, "message": "embeddings endpoint answered 503",
          "data": {"status": 503, "retryable": True}}),
        (EmbedderError("embeddings endpoint answered 401", retryable=False, status=401),
         {"code": -32010, "data": {"status": 401, "retryable": False}}),
        (MemoryUnavailable("memory service is closed"), {"code": -32011}),
        (MemoryStorageError("disk I/O error"),
         {**STORAGE, "message": "storage error: disk I/O error"}),
        (MemoryIndexError("index failed"), STORAGE),
    ],
)
def test_library_errors_map_to_their_wire_error(exc: Exception, expected: dict[str, Any]) -> None:
    """Each row of the map: not-found, invalid params with the field, storage (retryable, no
    errorId), embedder failures as upstream errors keeping status and retryability."""
    obj: Mapping[str, Any] = to_error_object(exc)
    assert ({k: obj[k] for k in expected if k != "data"}
            == {k: v for k, v in expected.items() if k != "data"})
    if "data" in expected:
        assert {k: obj["data"][k] for k in expected["data"]} == expected["data"]
    assert "errorId" not in obj.get("data", {})


@pytest.mark.parametrize("exc", [RuntimeError("secret /home/x/.recalld"),
                                 SessionError("secret internals"), KeyError("secret")])
def test_unknown_errors_are_internal_without_their_text(exc: Exception) -> None:
    """Anything outside the map is a bug: -32603 with an errorId, and none of its text on
    the wire."""
    assert wire_error(exc) is None
    obj = to_error_object(exc, "abc123")
    assert obj == {"code": -32603, "message": "internal error", "data": {"errorId": "abc123"}}


def test_gateway_errors_are_themselves() -> None:
    """A GatewayError needs no mapping; storage and upstream errors say whether a retry may help."""
    err = Conflict("busy")
    assert wire_error(err) is err
    assert StorageFailed("x").retryable and UpstreamError("x", 503, True).retryable
    assert not GatewayError("x").retryable


@dataclass(frozen=True, slots=True)
class _NoParams:
    x: int = bounded(0)


async def test_storage_error_in_a_handler_is_not_logged_as_a_crash() -> None:
    """The core answers a storage error as such and never calls the crash hook for it."""
    crashes: list[str] = []
    reg = Registry()

    async def full(ctx: Any, p: _NoParams) -> None:
        raise StorageError("no space left on device", errno=errno.ENOSPC)

    reg.declare("test.full", _NoParams, "disk full", full)
    core = RpcCore(reg, on_crash=lambda e, i, m: crashes.append(i))
    reply = await core.handle(b'{"id":1,"method":"test.full"}', Ctx())
    assert reply is not None and reply.is_error
    error = orjson.loads(reply.data)["error"]
    assert error == {"code": -32603, "message": "storage error: no space left on device",
                     "data": {"retryable": True}}
    assert crashes == []


class _CrashingModel:
    name = "crash"

    async def stream(self, messages: list[dict[str, str]], *, model: str | None = None
                     ) -> AsyncGenerator[ChatEvent, None]:
        raise RuntimeError("secret: /srv/keys/sk-live-123")
        yield  # pragma: no cover - makes this an async generator

    async def close(self) -> None:
        pass


async def test_a_crashed_run_does_not_put_its_exception_text_on_the_wire(chat_app: App) -> None:
    """A bug inside a run ends it with chat.error -32603 and an errorId; the text stays in the log,
    and the transcript's failed line says only "internal error"."""
    chat_app.runs.model = _CrashingModel()  # type: ignore[assignment]  # only stream() is reached
    async with Client.connect(chat_app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        run_id = (await c.call("chat.send", {"sessionKey": key, "message": "hi"}))["runId"]
        _, last = await run_to_end(c, run_id)
    assert last["method"] == "chat.error"
    error = last["params"]["error"]
    assert error["code"] == -32603 and error["retryable"] is False and error["data"]["errorId"]
    assert "secret" not in orjson.dumps(last).decode()
    path = chat_app.config.data_dir / "sessions" / "default" / f"{key}.jsonl"
    assert b"secret" not in path.read_bytes()
