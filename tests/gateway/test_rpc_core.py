"""The JSON-RPC core without a socket: plain bytes in, plain bytes out."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import Config
from gateway.errors import Conflict, InvalidParams
from gateway.methods import declare_methods
from gateway.rpc import Notification, Registry, RpcCore, bounded, parse_params


@dataclass(eq=False)
class Ctx:
    """A CallContext without a socket."""

    user: str | None = "default"
    address: str = "127.0.0.1"
    client: str | None = None
    read_only: bool = False

    @property
    def authenticated(self) -> bool:
        return self.user is not None

    @property
    def caller(self) -> str:
        assert self.user is not None
        return self.user

    def authenticate(self, user: str, client: str | None = None, read_only: bool = False) -> None:
        self.user = user

    def notify(self, note: Notification) -> None:
        pass


@dataclass(frozen=True, slots=True)
class EchoParams:
    text: str = bounded(max_len=10)
    times: int = bounded(1, min=1, max=3)


crashes: list[str] = []


def make_core(max_batch: int = 5) -> RpcCore:
    reg = Registry()
    declare_methods(reg, Config())  # every v1 method, declared without handlers

    async def echo(ctx: Any, p: EchoParams) -> dict[str, Any]:
        return {"text": p.text * p.times}

    async def boom(ctx: Any, p: EchoParams) -> None:
        raise RuntimeError("secret internals")

    async def busy(ctx: Any, p: EchoParams) -> None:
        raise Conflict("busy")

    reg.declare("test.echo", EchoParams, "echo", echo)
    reg.declare("test.boom", EchoParams, "crash", boom)
    reg.declare("test.busy", EchoParams, "conflict", busy)
    return RpcCore(reg, max_batch=max_batch, on_crash=lambda e, i, m: crashes.append(i))


async def ask(core: RpcCore, frame: Any, ctx: Ctx | None = None) -> Any:
    raw = frame if isinstance(frame, str | bytes) else orjson.dumps(frame)
    out = await core.handle(raw, ctx or Ctx())
    return None if out is None else orjson.loads(out.data)


async def test_request_without_jsonrpc_member_is_answered_with_it() -> None:
    """A wscat-style frame without "jsonrpc" is accepted and the reply carries "2.0"."""
    reply = await ask(make_core(), {"id": 1, "method": "test.echo", "params": {"text": "hi"}})
    assert reply == {"jsonrpc": "2.0", "id": 1, "result": {"text": "hi"}}


async def test_not_json_is_parse_error() -> None:
    """A frame that is not JSON gets -32700 with id null."""
    reply = await ask(make_core(), "{not json")
    assert reply["error"]["code"] == -32700 and reply["id"] is None


@pytest.mark.parametrize(
    "frame",
    [
        42,
        b"\"just a string\"",
        {"jsonrpc": "1.0", "id": 1, "method": "test.echo"},
        {"jsonrpc": "2.0", "id": {"x": 1}, "method": "test.echo"},
        {"jsonrpc": "2.0", "id": 1},
        {"jsonrpc": "2.0", "id": 1, "method": 5},
        {"jsonrpc": "2.0", "id": 1, "method": "test.echo", "params": "text"},
        {"jsonrpc": "2.0", "id": 1, "method": "test.echo", "extra": True},
    ],
)
async def test_malformed_requests_are_invalid_request(frame: Any) -> None:
    """Wrong shapes of request get -32600."""
    reply = await ask(make_core(), frame)
    assert reply["error"]["code"] == -32600


async def test_unknown_method() -> None:
    """An unknown method gets -32601 naming it."""
    reply = await ask(make_core(), {"id": 1, "method": "nope"})
    assert reply["error"]["code"] == -32601 and "nope" in reply["error"]["message"]


async def test_declared_but_unimplemented_method_is_method_not_found() -> None:
    """A v1 method whose body a later part supplies answers -32601 until it does."""
    reply = await ask(make_core(), {"id": 1, "method": "memory.status"})
    assert reply["error"]["code"] == -32601


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({}, "text"),
        ({"text": 5}, "text"),
        ({"text": "x" * 11}, "text"),
        ({"text": "ok", "times": 9}, "times"),
        ({"text": "ok", "times": True}, "times"),
        ({"text": "ok", "bogus": 1}, "bogus"),
    ],
)
async def test_invalid_params_name_the_field(params: dict[str, Any], field: str) -> None:
    """Bad params get -32602 whose data names the field and the reason."""
    reply = await ask(make_core(), {"id": 1, "method": "test.echo", "params": params})
    assert reply["error"]["code"] == -32602
    assert reply["error"]["data"]["field"] == field and reply["error"]["data"]["reason"]


async def test_crash_is_internal_error_with_id_and_no_traceback() -> None:
    """An unexpected exception becomes -32603 with an errorId matching the logged one."""
    reply = await ask(make_core(), {"id": 7, "method": "test.boom", "params": {"text": "x"}})
    assert reply["error"]["code"] == -32603
    assert reply["error"]["data"]["errorId"] == crashes[-1]
    assert "secret" not in orjson.dumps(reply).decode()


async def test_gateway_errors_keep_their_code() -> None:
    """A handler raising Conflict answers -32003."""
    reply = await ask(make_core(), {"id": 1, "method": "test.busy", "params": {"text": "x"}})
    assert reply["error"]["code"] == -32003


async def test_unauthenticated_calls_get_32001() -> None:
    """Before auth, every method except auth answers -32001."""
    reply = await ask(make_core(), {"id": 1, "method": "test.echo", "params": {"text": "x"}},
                      Ctx(None))
    assert reply["error"]["code"] == -32001
    reply = await ask(make_core(), {"id": 2, "method": "rpc.discover"}, Ctx(None))
    assert reply["error"]["code"] == -32001


async def test_notification_gets_no_reply_even_on_error() -> None:
    """A request without id is executed and never answered."""
    core = make_core()
    assert await ask(core, {"method": "test.echo", "params": {"text": "x"}}) is None
    assert await ask(core, {"method": "test.boom", "params": {"text": "x"}}) is None
    assert await ask(core, {"method": "nope"}) is None


async def test_batch_answers_requests_and_skips_notifications() -> None:
    """A batch returns one reply per request, none for notifications, errors in place."""
    reply = await ask(
        make_core(),
        [
            {"id": 1, "method": "test.echo", "params": {"text": "a"}},
            {"method": "test.echo", "params": {"text": "b"}},
            {"id": 2, "method": "nope"},
            7,
        ],
    )
    assert [r.get("id") for r in reply] == [1, 2, None]
    assert reply[0]["result"] == {"text": "a"}
    assert reply[1]["error"]["code"] == -32601 and reply[2]["error"]["code"] == -32600


async def test_batch_reply_is_an_error_when_any_entry_is() -> None:
    """Reply.is_error is True for a batch with one failing entry among good ones (not only the
    first), and False for a batch whose entries all succeed."""
    core = make_core()
    ok = {"method": "test.echo", "params": {"text": "a"}}
    mixed = [{"id": 1, **ok}, {"id": 2, "method": "test.busy", "params": {"text": "a"}},
             {"id": 3, **ok}]
    reply = await core.handle(orjson.dumps(mixed), Ctx())
    assert reply is not None and reply.is_error is True
    assert [("error" in r) for r in orjson.loads(reply.data)] == [False, True, False]
    clean = await core.handle(orjson.dumps([{"id": 1, **ok}, {"id": 2, **ok}]), Ctx())
    assert clean is not None and clean.is_error is False


async def test_batch_of_only_notifications_gets_nothing() -> None:
    """A batch of notifications is answered with nothing at all."""
    assert await ask(make_core(), [{"method": "test.echo", "params": {"text": "a"}}]) is None


async def test_empty_and_oversized_batches_are_invalid() -> None:
    """An empty batch and one over limits.max_batch are refused whole with -32600."""
    core = make_core(max_batch=5)
    assert (await ask(core, []))["error"]["code"] == -32600
    big = [{"id": i, "method": "test.echo", "params": {"text": "a"}} for i in range(6)]
    reply = await ask(core, big)
    assert isinstance(reply, dict) and reply["error"]["code"] == -32600
    assert "6" in reply["error"]["message"]


async def test_deeply_nested_json_is_a_parse_error() -> None:
    """Nesting past the decoder's limit is refused as -32700, not a crash."""
    reply = await ask(make_core(), "[" * 5000 + "]" * 5000)
    assert reply["error"]["code"] == -32700


def _is_well_formed(reply: Any) -> bool:
    if isinstance(reply, list):
        return bool(reply) and all(_is_well_formed(r) for r in reply)
    if not isinstance(reply, dict) or reply.get("jsonrpc") != "2.0" or "id" not in reply:
        return False
    if "result" in reply:
        return "error" not in reply
    err = reply.get("error")
    return (isinstance(err, dict) and isinstance(err.get("code"), int)
            and isinstance(err.get("message"), str))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: (st.lists(inner, max_size=4)
                   | st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20,
)
request_like = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.sampled_from(["2.0", "1.0", 2]),
        "id": st.one_of(st.integers(), st.text(max_size=5), st.none(), st.booleans()),
        "method": (st.sampled_from(["test.echo", "test.boom", "gateway.health", "nope", "auth"])
                   | st.text()),
        "params": json_values,
    },
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.binary(max_size=200))
async def test_arbitrary_bytes_always_get_a_well_formed_answer(payload: bytes) -> None:
    """Any bytes at all produce a well-formed JSON-RPC reply or nothing, never an exception."""
    out = await make_core().handle(payload, Ctx())
    assert out is None or _is_well_formed(orjson.loads(out.data))


@settings(max_examples=300)
@given(message=st.one_of(json_values, request_like, st.lists(request_like, max_size=8)))
async def test_arbitrary_json_always_gets_a_well_formed_answer(message: Any) -> None:
    """Any JSON value produces a well-formed reply, or nothing only for notifications."""
    out = await make_core(max_batch=6).handle(json.dumps(message), Ctx())
    if out is None:
        items = message if isinstance(message, list) else [message]
        assert all(isinstance(m, dict) and "id" not in m for m in items)
    else:
        assert _is_well_formed(orjson.loads(out.data))


async def test_published_bounds_are_the_configured_ones() -> None:
    """rpc.discover's limits come from the settings the store and memory enforce, and the
    validator refuses past the same values (sessions.max_page_size, memory.max_k)."""
    base = Config()
    cfg = dataclasses.replace(base, sessions=dataclasses.replace(base.sessions, max_page_size=120),
                              memory=dataclasses.replace(base.memory, max_k=20))
    reg = Registry()
    declare_methods(reg, cfg)
    doc = {m["name"]: {p["name"]: p["schema"] for p in m["params"]}
           for m in reg.openrpc("t")["methods"]}
    assert (doc["sessions.history"]["limit"]["maximum"] == 120
            == doc["sessions.list"]["limit"]["maximum"])
    assert doc["memory.search"]["k"]["oneOf"][0]["maximum"] == 20
    assert doc["chat.send"]["message"]["maxLength"] == cfg.chat.max_message_bytes
    with pytest.raises(InvalidParams, match="<= 120"):
        parse_params(reg.get("sessions.history"), {"sessionKey": "k", "limit": 121})
    with pytest.raises(InvalidParams, match="<= 20"):
        parse_params(reg.get("memory.search"), {"query": "q", "k": 21})
