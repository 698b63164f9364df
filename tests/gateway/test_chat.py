"""chat.send / chat.abort end to end: real gateway, real openai SDK, loopback fake model."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from gateway.app import App, start_app
from gateway.client import Client, RpcError
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.fake_openai import Behaviour, FakeOpenAI

_seen: weakref.WeakKeyDictionary[Client, list[dict[str, Any]]] = weakref.WeakKeyDictionary()
TERMINAL = ("chat.final", "chat.error", "chat.aborted")


async def run_to_end(c: Client, run_id: str,
                     timeout: float = 10.0) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """This run's events up to its terminal one; other runs' events are kept for later calls."""
    seen = _seen.setdefault(c, [])
    async with asyncio.timeout(timeout):
        while True:
            events = [e for e in seen if e.get("params", {}).get("runId") == run_id]
            if events and events[-1]["method"] in TERMINAL:
                return events, events[-1]
            seen.append(await c.next_event())


def transcript(app: App, key: str) -> list[dict[str, Any]]:
    path = app.config.data_dir / "sessions" / "default" / f"{key}.jsonl"
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


async def test_full_flow_survives_restart(config_factory: Callable[..., Config],
                                          fake_openai: FakeOpenAI) -> None:
    """create → send → deltas → final → transcript lines → restart → history shows both messages."""
    fake_openai.configure(reply="Rust is a fine choice.")
    cfg = config_factory(llm={"base_url": fake_openai.base_url, "model": "fake-model",
                              "max_retries": 0})
    async with running(cfg) as app:
        async with Client.connect(app.url, TOKEN) as c:
            key = (await c.call("sessions.create",
                                {"title": "langs", "systemPrompt": "Be brief."}))["sessionKey"]
            started = await c.call("chat.send", {"sessionKey": key, "message": "I like Rust"})
            assert started["status"] == "started"
            events, final = await run_to_end(c, started["runId"])
        deltas = [e for e in events if e["method"] == "chat.delta"]
        assert "".join(d["params"]["delta"] for d in deltas) == "Rust is a fine choice."
        seqs = [e["params"]["seq"] for e in events]
        assert seqs == sorted(seqs) and seqs[0] == 0
        assert final["method"] == "chat.final"
        assert final["params"]["message"]["content"] == "Rust is a fine choice."
        lines = transcript(app, key)
        assert [line["type"] for line in lines] == ["session", "message", "message"]
        assert lines[1]["role"] == "user" and lines[1]["runId"] == started["runId"]
        assert lines[2]["role"] == "assistant" and lines[2]["model"] == "fake-model"
        sent = fake_openai.chat_requests[-1].json
        # The session's system prompt comes first; the memory tools' instructions follow it.
        assert sent["messages"][0]["role"] == "system"
        assert sent["messages"][0]["content"].startswith("Be brief.")
        assert sent["messages"][-1] == {"role": "user", "content": "I like Rust"}
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        history = await c.call("sessions.history", {"sessionKey": key})
        assert [m["role"] for m in history["messages"]] == ["user", "assistant"]
        assert history["messages"][1]["content"] == "Rust is a fine choice."


async def test_second_client_on_the_session_gets_the_events(chat_app: App) -> None:
    """A connection that subscribed to a session receives the runs another connection starts."""
    async with Client.connect(chat_app.url, TOKEN) as a, Client.connect(chat_app.url, TOKEN) as b:
        key = (await a.call("sessions.create"))["sessionKey"]
        await b.call("sessions.subscribe", {"sessionKey": key})
        run_id = (await a.call("chat.send", {"sessionKey": key, "message": "hello"}))["runId"]
        _, final_a = await run_to_end(a, run_id)
        _, final_b = await run_to_end(b, run_id)
        assert final_a["params"]["message"] == final_b["params"]["message"]


async def test_sends_to_one_session_run_in_arrival_order(chat_app: App,
                                                         fake_openai: FakeOpenAI) -> None:
    """Three quick sends to one session run one at a time, in order, each seeing only
    earlier turns."""
    fake_openai.configure(delta_delay_s=0.01)
    async with Client.connect(chat_app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        replies = await asyncio.gather(
            *(c.call("chat.send", {"sessionKey": key, "message": f"m{i}"}) for i in range(3)))
        finals = [(await run_to_end(c, r["runId"]))[1] for r in replies]
    assert [f["params"]["message"]["content"] for f in finals] == ["Echo: m0", "Echo: m1",
                                                                   "Echo: m2"]
    reqs = fake_openai.chat_requests
    assert [r.json["messages"][-1]["content"] for r in reqs] == ["m0", "m1", "m2"]
    assert "m2" not in orjson.dumps(reqs[1].json).decode()
    for earlier, later in zip(reqs, reqs[1:]):
        assert earlier.completed and later.received_at >= earlier.received_at


async def test_different_sessions_run_concurrently(chat_app: App, fake_openai: FakeOpenAI) -> None:
    """Runs of two sessions overlap in time instead of queueing behind each other."""
    fake_openai.configure(reply="one two three four five", delta_delay_s=0.1)
    async with Client.connect(chat_app.url, TOKEN) as c:
        keys = [(await c.call("sessions.create"))["sessionKey"] for _ in range(2)]
        runs = [await c.call("chat.send", {"sessionKey": k, "message": "go"}) for k in keys]
        await asyncio.sleep(0.2)
        assert (len(fake_openai.chat_requests) == 2
                and not any(r.completed for r in fake_openai.chat_requests))
        for r in runs:
            assert (await run_to_end(c, r["runId"]))[1]["method"] == "chat.final"


async def test_abort_stops_upstream_and_keeps_the_partial(chat_app: App,
                                                          fake_openai: FakeOpenAI) -> None:
    """chat.abort closes the upstream stream, emits chat.aborted and records the partial reply."""
    fake_openai.configure(reply=" ".join(f"w{i}" for i in range(200)), delta_delay_s=0.02)
    async with Client.connect(chat_app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        run_id = (await c.call("chat.send", {"sessionKey": key, "message": "talk"}))["runId"]
        await c.next_event("chat.delta")
        assert (await c.call("chat.abort", {"sessionKey": key}))["aborted"] is True
        _, last = await run_to_end(c, run_id)
        assert last["method"] == "chat.aborted" and last["params"]["partial"].startswith("w0")
        req = fake_openai.chat_requests[-1]
        await asyncio.wait_for(req.client_gone.wait(), 2)
        assert not req.completed
        assert (await c.call("chat.abort", {"sessionKey": key}))["aborted"] is False
    line = transcript(chat_app, key)[-1]
    assert line["aborted"] is True and line["content"] == last["params"]["partial"]


async def test_repeated_idempotency_key_returns_the_first_run(chat_app: App,
                                                              fake_openai: FakeOpenAI) -> None:
    """The same idempotencyKey twice yields one run and one user line."""
    async with Client.connect(chat_app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        params = {"sessionKey": key, "message": "once", "idempotencyKey": "k-1"}
        first, second = await asyncio.gather(c.call("chat.send", params),
                                             c.call("chat.send", params))
        assert first["runId"] == second["runId"]
        await run_to_end(c, first["runId"])
    assert len(fake_openai.chat_requests) == 1
    assert [line.get("role") for line in transcript(chat_app, key)] == [None, "user", "assistant"]


@pytest.mark.parametrize(
    ("behaviour", "status", "retryable"),
    [
        (Behaviour(status=401), 401, False),
        (Behaviour(status=429, retry_after=1), 429, True),
        (Behaviour(status=500), 500, True),
        (Behaviour(cut_after=3, reply="a b c d e f g"), None, True),
        (Behaviour(malformed_sse=True, malformed_after=2, reply="a b c d e f"), None, True),
        (Behaviour(hang=True), None, True),
    ],
    ids=["401", "429", "500", "cut", "malformed", "timeout"],
)
async def test_upstream_failures_become_chat_error(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI, behaviour: Behaviour,
    status: int | None, retryable: bool,
) -> None:
    """Each upstream failure gives chat.error -32010 with status/retryable, and the transcript
    stays valid."""
    fake_openai.script(behaviour)
    cfg = config_factory(llm={"base_url": fake_openai.base_url, "api_key": "sk-t", "timeout_s": 0.5,
                              "max_retries": 0})
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        run_id = (await c.call("chat.send", {"sessionKey": key, "message": "hi"}))["runId"]
        events, last = await run_to_end(c, run_id)
        assert last["method"] == "chat.error"
        err = last["params"]["error"]
        assert err["code"] == -32010 and err["retryable"] is retryable
        assert err["data"]["status"] == status
        assert "sk-t" not in orjson.dumps(last).decode()
        partial = "".join(e["params"]["delta"] for e in events if e["method"] == "chat.delta")
        line = transcript(app, key)[-1]
        assert line["role"] == "assistant" and line["failed"] is True and line["content"] == partial
        # the session still works afterwards
        run2 = (await c.call("chat.send", {"sessionKey": key, "message": "again"}))["runId"]
        assert (await run_to_end(c, run2))[1]["method"] == "chat.final"


async def test_connection_refused_is_retryable(config_factory: Callable[..., Config]) -> None:
    """A model endpoint that refuses connections gives chat.error retryable with no status."""
    cfg = config_factory(llm={"base_url": "http://127.0.0.1:9/v1", "max_retries": 0,
                              "timeout_s": 2.0})
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        run_id = (await c.call("chat.send", {"sessionKey": key, "message": "hi"}))["runId"]
        _, last = await run_to_end(c, run_id)
        assert last["method"] == "chat.error" and last["params"]["error"]["retryable"] is True


async def test_no_model_configured_is_32011(app: App, client: Client) -> None:
    """Without llm.base_url or an API key, chat.send answers -32011 naming the settings."""
    key = (await client.call("sessions.create"))["sessionKey"]
    with pytest.raises(RpcError) as info:
        await client.call("chat.send", {"sessionKey": key, "message": "hi"})
    assert info.value.code == -32011 and "OPENAI_BASE_URL" in info.value.message


async def test_oversized_and_empty_messages_are_refused(chat_app: App) -> None:
    """A message over chat.max_message_bytes or blank is -32602 on the message field,
    nothing written."""
    async with Client.connect(chat_app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        for message in ("x" * (256 * 1024 + 1), "   "):
            with pytest.raises(RpcError) as info:
                await c.call("chat.send", {"sessionKey": key, "message": message})
            assert info.value.code == -32602 and info.value.data["field"] == "message"
    assert len(transcript(chat_app, key)) == 1


async def test_another_users_session_is_not_found(config_factory: Callable[..., Config],
                                                  fake_openai: FakeOpenAI) -> None:
    """Bob cannot read, send to, subscribe to or delete Alice's session: -32002 like an
    unknown key."""
    users = [{"name": "alice", "token": "alice-token-0123456789"},
             {"name": "bob", "token": "bob-token-0123456789xx"}]
    cfg = config_factory(auth={"users": users, "token": None},
                         llm={"base_url": fake_openai.base_url})
    async with running(cfg) as app:
        async with Client.connect(app.url, users[0]["token"]) as alice, \
                Client.connect(app.url, users[1]["token"]) as bob:
            key = (await alice.call("sessions.create"))["sessionKey"]
            assert (await bob.call("sessions.list"))["sessions"] == []
            for method, extra in [("sessions.get", {}), ("sessions.history", {}),
                                  ("sessions.delete", {}), ("sessions.subscribe", {}),
                                  ("chat.send", {"message": "hi"}), ("chat.abort", {})]:
                with pytest.raises(RpcError) as info:
                    await bob.call(method, {"sessionKey": key, **extra})
                assert info.value.code == -32002, method
            with pytest.raises(RpcError) as unknown:
                await bob.call("sessions.get", {"sessionKey": "0" * 32})
            with pytest.raises(RpcError) as theirs:
                await bob.call("sessions.get", {"sessionKey": key})
            assert unknown.value.message == theirs.value.message


async def test_slow_consumer_is_dropped_and_the_run_completes(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """A client that never reads is closed 1008; the run finishes for others and is written down."""
    # Far more than loopback's kernel socket buffers (several MB) plus the outbox bound can
    # hold for a client that reads nothing, at a pace a reading client keeps up with.
    size = 16_000_000
    fake_openai.configure(reply="x" * size, deltas=4000, delta_delay_s=0.0005)
    cfg = config_factory(llm={"base_url": fake_openai.base_url},
                         limits={"max_outbox_bytes": 256 * 1024},
                         server={"write_limit": 4096, "close_timeout_s": 60.0},
                         sessions={"max_line_bytes": 32 * 1024 * 1024})
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as good:
        key = (await good.call("sessions.create"))["sessionKey"]
        async with connect(app.url, additional_headers={"Authorization": f"Bearer {TOKEN}"},
                           max_queue=1, max_size=None) as stalled:
            await stalled.send(orjson.dumps({"id": 1, "method": "sessions.subscribe",
                                             "params": {"sessionKey": key}}).decode())
            await asyncio.sleep(0.2)  # the reply sits unread in the stalled client's buffer
            stalled.transport.pause_reading()  # and from now on nothing more is read
            run_id = (await good.call("chat.send", {"sessionKey": key, "message": "go"}))["runId"]
            events, final = await run_to_end(good, run_id, timeout=60)
            assert (final["method"] == "chat.final"
                    and len(final["params"]["message"]["content"]) == size)
            # Reading again, the stalled client drains its backlog and finds the 1008 close.
            stalled.transport.resume_reading()
            with pytest.raises(ConnectionClosed):
                async with asyncio.timeout(30):
                    while True:
                        await stalled.recv()
            assert stalled.close_code == 1008 and stalled.close_reason == "slow consumer"
            async with asyncio.timeout(10):
                while len(app.server.connections) > 1:
                    await asyncio.sleep(0.05)
    assert transcript(app, key)[-1]["content"] == "x" * size


@pytest.mark.parametrize("errno_", [28, 5], ids=["ENOSPC", "EIO"])
async def test_disk_errors_on_append_answer_an_error_and_lose_nothing(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI, errno_: int
) -> None:
    """ENOSPC/EIO while appending: chat.send answers an error, the transcript stays valid, later
    sends work."""
    import os

    from sessions.fileio import FileIO

    failing = {"on": False}

    def write(fd: int, data: bytes) -> int:
        if failing["on"]:
            raise OSError(errno_, os.strerror(errno_))
        return os.write(fd, data)

    cfg = config_factory(llm={"base_url": fake_openai.base_url})
    app = await start_app(cfg, file_io=FileIO(write=write))
    try:
        async with Client.connect(app.url, TOKEN) as c:
            key = (await c.call("sessions.create"))["sessionKey"]
            first = (await c.call("chat.send", {"sessionKey": key, "message": "kept"}))["runId"]
            await run_to_end(c, first)
            failing["on"] = True
            with pytest.raises(RpcError) as info:
                await c.call("chat.send", {"sessionKey": key, "message": "lost?"})
            assert "storage error" in info.value.message and info.value.data["retryable"] is True
            assert (await c.call("gateway.health"))["status"] == "ok"
            failing["on"] = False
            again = (await c.call("chat.send", {"sessionKey": key, "message": "after"}))["runId"]
            await run_to_end(c, again)
            contents = [m["content"] for m in
                        (await c.call("sessions.history", {"sessionKey": key}))["messages"]]
        assert contents == ["kept", "Echo: kept", "after", "Echo: after"]
    finally:
        await app.close()
