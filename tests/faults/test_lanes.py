"""A session's run queue under failing appends: FIFO holds, aborts find their run, and an
idempotent retry never answers for a send that did not happen."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Callable
from typing import Any

import orjson

from gateway.app import start_app
from gateway.client import Client
from gateway.config import Config
from sessions import FileIO
from tests.conftest import TOKEN
from tests.fake_openai import FakeOpenAI

BOOM = "this append fails on the disk"


def failing_write(marker: bytes, times: int | None = None) -> Callable[[int, bytes], int]:
    """``os.write`` that raises EIO for lines holding ``marker`` (``times`` times, or always)."""
    left = {"n": times}

    def write(fd: int, data: bytes) -> int:
        if marker in data and (left["n"] is None or left["n"] > 0):
            if left["n"] is not None:
                left["n"] -= 1
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return os.write(fd, data)

    return write


def chat_config(config_factory: Callable[..., Config], fake: FakeOpenAI, **sections: Any) -> Config:
    return config_factory(llm={"base_url": fake.base_url, "api_key": "sk-t", "model": "fake-model",
                               "max_retries": 0}, chat={"recall": False}, **sections)


async def batch(c: Client, *calls: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Send one batch frame; its replies in request order (they arrive among the events)."""
    ids = [f"b{i}" for i in range(len(calls))]
    await c.ws.send(orjson.dumps([{"jsonrpc": "2.0", "id": i, "method": m, "params": p}
                                  for i, (m, p) in zip(ids, calls, strict=True)]), text=True)
    got: dict[str, dict[str, Any]] = {}
    held: list[dict[str, Any]] = []
    async with asyncio.timeout(10):
        while len(got) < len(ids):
            item = await c.events.get()
            if item.get("id") in ids:
                got[item["id"]] = item
            else:
                held.append(item)
    for item in held:  # chat events that arrived meanwhile go back, in order
        c.events.put_nowait(item)
    return [got[i] for i in ids]


async def test_failed_append_while_another_send_waits_keeps_one_fifo_lane(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """An append that fails while a second chat.send waits for the session's lock does not
    orphan the session's queue: the waiting run stays abortable, and the next send queues
    behind it instead of streaming in parallel."""
    fake_openai.configure(reply="one two three four five six seven eight", deltas=8,
                          delta_delay_s=0.15)
    app = await start_app(chat_config(config_factory, fake_openai),
                          file_io=FileIO(write=failing_write(BOOM.encode())))
    try:
        async with Client.connect(app.url, TOKEN) as c:
            key = (await c.call("sessions.create"))["sessionKey"]
            failed, first = await batch(c, ("chat.send", {"sessionKey": key, "message": BOOM}),
                                        ("chat.send", {"sessionKey": key, "message": "first"}))
            assert (failed["error"]["code"] == -32603
                    and "storage error" in failed["error"]["message"])
            first_id = first["result"]["runId"]
            await c.next_event("chat.delta")
            second_id = (await c.call("chat.send", {"sessionKey": key,
                                                    "message": "second"}))["runId"]
            assert (await c.call("chat.abort", {"sessionKey": key,
                                                "runId": first_id}))["aborted"] is True
            order: list[tuple[str, str]] = []
            async with asyncio.timeout(20):
                while ("chat.final", second_id) not in order:
                    ev = await c.next_event()
                    order.append((ev["method"], ev["params"]["runId"]))
            assert ("chat.aborted", first_id) in order
            first_end = order.index(("chat.aborted", first_id))
            assert all(run != second_id for _, run in order[:first_end]), order
    finally:
        await app.close()


async def test_a_message_that_escapes_past_the_line_limit_is_refused_up_front(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """chat.send measures the message as it will be written (JSON-escaped): 200,000 control
    characters, 200 kB raw but over 1 MiB escaped, answer -32602 naming chat.max_message_bytes
    before anything is appended."""
    app = await start_app(chat_config(config_factory, fake_openai))
    try:
        async with Client.connect(app.url, TOKEN) as c:
            key = (await c.call("sessions.create"))["sessionKey"]
            reply = await c.request("chat.send", {"sessionKey": key, "message": "\x01" * 200_000})
            assert reply["error"]["code"] == -32602, reply
            assert "chat.max_message_bytes" in reply["error"]["message"]
            assert (await c.call("sessions.get", {"sessionKey": key}))["messageCount"] == 0
    finally:
        await app.close()


async def test_idempotent_retry_of_a_send_that_then_fails_is_not_a_phantom_duplicate(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """A retry with the same idempotency key that arrives while the first attempt's append is
    still in flight waits for it; when that attempt fails, the retry is carried out itself: its
    runId is real, its reply arrives, and the message is in the transcript exactly once."""
    app = await start_app(chat_config(config_factory, fake_openai),
                          file_io=FileIO(write=failing_write(b"retried message", times=1)))
    try:
        async with Client.connect(app.url, TOKEN) as c:
            key = (await c.call("sessions.create"))["sessionKey"]
            params = {"sessionKey": key, "message": "retried message", "idempotencyKey": "k-1"}
            first, retry = await batch(c, ("chat.send", params), ("chat.send", params))
            assert first["error"]["code"] == -32603, first
            assert "result" in retry and not retry["result"].get("duplicate"), retry
            run_id = retry["result"]["runId"]
            final = await c.next_event("chat.final", timeout=20)
            assert final["params"]["runId"] == run_id
            history = (await c.call("sessions.history", {"sessionKey": key}))["messages"]
            users = [m for m in history if m["role"] == "user"]
            assert [(m["content"], m["runId"]) for m in users] == [("retried message", run_id)]
            again = await c.call("chat.send", params)
            assert again == {"runId": run_id, "status": "started", "duplicate": True}
    finally:
        await app.close()
