"""gateway.chat.llm against a real HTTP server on loopback, through the real ``openai`` SDK."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway.chat.llm import (
    PLACEHOLDER_API_KEY,
    Completion,
    OpenAIChatModel,
    TextDelta,
    ToolCall,
    create_chat_model,
)
from gateway.errors import UpstreamError
from tests.fake_openai import Behaviour, FakeOpenAI, fake_openai

__all__ = ["fake_openai"]  # the fixture is imported to be used here

KEY = "sk-test-secret-0123456789"
MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "ping"}]


@pytest.fixture
async def model(fake_openai: FakeOpenAI) -> AsyncIterator[OpenAIChatModel]:
    chat = OpenAIChatModel(model="fake-model", base_url=fake_openai.base_url, api_key=KEY,
                           timeout_s=2.0, connect_timeout_s=1.0, max_retries=0)
    try:
        yield chat
    finally:
        await chat.close()


async def _collect(chat: OpenAIChatModel, **kw: Any) -> tuple[str, list[Any]]:
    events = [e async for e in chat.stream(MESSAGES, **kw)]
    return "".join(e.text for e in events if isinstance(e, TextDelta)), events


async def _failure(chat: OpenAIChatModel) -> UpstreamError:
    with pytest.raises(UpstreamError) as info:
        await _collect(chat)
    assert KEY not in info.value.message
    return info.value


async def test_stream_assembles_text_and_usage(fake_openai: FakeOpenAI,
                                               model: OpenAIChatModel) -> None:
    """A normal reply streams as text deltas and ends with one Completion carrying usage."""
    fake_openai.configure(reply="Hello from the other side", delta_delay_s=0.001)
    text, events = await _collect(model)
    assert text == "Hello from the other side"
    assert sum(isinstance(e, TextDelta) for e in events) == 5
    final = events[-1]
    assert (isinstance(final, Completion) and final.finish_reason == "stop"
            and final.model == "fake-model")
    assert final.usage is not None and final.usage["total_tokens"] > 0
    assert not any(isinstance(e, Completion) for e in events[:-1])


async def test_request_carries_messages_model_and_usage_option(
    fake_openai: FakeOpenAI, model: OpenAIChatModel
) -> None:
    """The endpoint sees the messages as given, the per-call model and the include_usage option."""
    await _collect(model, model="other-model")
    body = fake_openai.chat_requests[-1].json
    assert (body["messages"] == MESSAGES and body["model"] == "other-model"
            and body["stream"] is True)
    assert body["stream_options"] == {"include_usage": True}
    assert fake_openai.chat_requests[-1].headers["authorization"] == f"Bearer {KEY}"


async def test_local_endpoint_without_key_gets_placeholder(fake_openai: FakeOpenAI) -> None:
    """With only a base URL (Ollama, llama.cpp) a placeholder key is sent instead of failing."""
    chat = create_chat_model(fake_openai.base_url, None, "llama3")
    assert isinstance(chat, OpenAIChatModel) and chat.name == "llama3"
    try:
        await _collect(chat)
    finally:
        await chat.close()
    assert fake_openai.chat_requests[-1].headers["authorization"] == f"Bearer {PLACEHOLDER_API_KEY}"


async def test_create_chat_model_needs_an_endpoint_or_key() -> None:
    """Neither a base URL nor a key means no model (the gateway answers -32011)."""
    assert create_chat_model(None, None, "gpt-4o-mini") is None
    assert create_chat_model("", "", "gpt-4o-mini") is None
    chat = create_chat_model(None, "sk-x", "gpt-4o-mini")
    assert isinstance(chat, OpenAIChatModel) and chat.base_url == "https://api.openai.com/v1"
    await chat.close()


async def test_connection_refused_is_retryable_without_status() -> None:
    """Nothing listening on the port maps to status None, retryable, naming the endpoint."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    chat = OpenAIChatModel(model="m", base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY,
                           max_retries=0)
    try:
        err = await _failure(chat)
    finally:
        await chat.close()
    assert (err.status, err.retryable) == (None, True)
    assert f"127.0.0.1:{port}" in err.message and err.code == -32010


@pytest.mark.parametrize("status", [401, 403])
async def test_auth_failures_are_final_and_never_echo_the_key(
    fake_openai: FakeOpenAI, model: OpenAIChatModel, status: int
) -> None:
    """401/403 are not retryable, and a key echoed by the endpoint is scrubbed from the message."""
    echoed = f"Incorrect API key provided: {KEY} (also tried sk-proj-abcdef987654, Bearer tok123)"
    fake_openai.script(Behaviour(status=status, error_message=echoed))
    err = await _failure(model)
    assert (err.status, err.retryable) == (status, False)
    assert "Incorrect API key provided: ***" in err.message
    assert "abcdef987654" not in err.message and "tok123" not in err.message


async def test_rate_limit_is_retryable_with_retry_after(fake_openai: FakeOpenAI,
                                                        model: OpenAIChatModel) -> None:
    """429 is retryable and the message says how long the endpoint asked to wait."""
    fake_openai.script(Behaviour(status=429, retry_after=2))
    err = await _failure(model)
    assert (err.status, err.retryable) == (429, True)
    assert "retry after 2s" in err.message


@pytest.mark.parametrize(("status", "retryable"),
                         [(500, True), (503, True), (400, False), (404, False)])
async def test_status_errors_map_status_and_retryable(
    fake_openai: FakeOpenAI, model: OpenAIChatModel, status: int, retryable: bool
) -> None:
    """5xx are retryable; other client errors are not; the status is kept."""
    fake_openai.script(Behaviour(status=status))
    err = await _failure(model)
    assert (err.status, err.retryable) == (status, retryable)


async def test_no_first_byte_within_timeout(fake_openai: FakeOpenAI) -> None:
    """An endpoint that never answers fails after the timeout, retryable, without a status."""
    fake_openai.configure(hang=True)
    chat = OpenAIChatModel(model="m", base_url=fake_openai.base_url, api_key=KEY, timeout_s=0.2,
                           max_retries=0)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        err = await _failure(chat)
        assert loop.time() - started < 1.5
    finally:
        await chat.close()
    assert (err.status, err.retryable) == (None, True) and "0.2s" in err.message


async def test_stream_stalling_mid_way_times_out(fake_openai: FakeOpenAI) -> None:
    """Silence between chunks longer than the timeout ends the stream as a retryable timeout."""
    fake_openai.configure(reply="one two three", hang_after=1)
    chat = OpenAIChatModel(model="m", base_url=fake_openai.base_url, api_key=KEY, timeout_s=0.2,
                           max_retries=0)
    seen: list[str] = []
    try:
        with pytest.raises(UpstreamError) as info:
            async for event in chat.stream(MESSAGES):
                if isinstance(event, TextDelta):
                    seen.append(event.text)
    finally:
        await chat.close()
    assert seen == ["one"]
    assert ((info.value.status, info.value.retryable) == (None, True)
            and "stalled" in info.value.message)


async def test_cut_mid_stream_says_it_ended_early(fake_openai: FakeOpenAI,
                                                  model: OpenAIChatModel) -> None:
    """A socket closed mid-reply is a retryable failure whose message says the stream
    ended early."""
    fake_openai.configure(reply="one two three four", cut_after=2)
    err = await _failure(model)
    assert (err.status, err.retryable) == (None, True)
    assert "ended early after 7 characters" in err.message


async def test_clean_end_without_finish_reason_is_early_end(
    fake_openai: FakeOpenAI, model: OpenAIChatModel
) -> None:
    """A body that ends cleanly but without a finish reason or [DONE] is still an early end."""
    fake_openai.configure(reply="one two three", end_after=2)
    err = await _failure(model)
    assert (err.status, err.retryable) == (None, True)
    assert "ended early after 7 characters" in err.message


async def test_malformed_event_says_it_ended_early(fake_openai: FakeOpenAI,
                                                   model: OpenAIChatModel) -> None:
    """A frame that is not JSON is a retryable failure saying the stream ended early."""
    fake_openai.configure(malformed_sse=True)
    err = await _failure(model)
    assert (err.status, err.retryable) == (None, True)
    assert "ended early" in err.message and "malformed" in err.message


async def test_sdk_retries_before_first_byte(fake_openai: FakeOpenAI) -> None:
    """With max_retries, a 429 before any text is retried by the SDK and the reply succeeds."""
    fake_openai.script(Behaviour(status=429, retry_after=0.01), Behaviour(reply="after retry"))
    chat = OpenAIChatModel(model="m", base_url=fake_openai.base_url, api_key=KEY, max_retries=1)
    try:
        text, _ = await _collect(chat)
    finally:
        await chat.close()
    assert text == "after retry" and len(fake_openai.chat_requests) == 2


async def test_no_retry_once_text_has_streamed(fake_openai: FakeOpenAI) -> None:
    """A failure after the first byte is reported, never replayed, even with retries configured."""
    fake_openai.configure(reply="one two three", cut_after=1)
    chat = OpenAIChatModel(model="m", base_url=fake_openai.base_url, api_key=KEY, max_retries=2)
    try:
        await _failure(chat)
    finally:
        await chat.close()
    assert len(fake_openai.chat_requests) == 1


async def test_stream_options_rejection_falls_back(fake_openai: FakeOpenAI,
                                                   model: OpenAIChatModel) -> None:
    """An endpoint that rejects stream_options is asked again without it, and no longer gets it."""
    fake_openai.script(Behaviour(status=400,
                                 error_message="Unrecognized request argument: stream_options"))
    text, events = await _collect(model)
    assert (text.startswith("Echo:") and isinstance(events[-1], Completion)
            and events[-1].usage is None)
    await _collect(model)
    assert [("stream_options" in r.json) for r in fake_openai.chat_requests] == [True, False, False]


async def test_aclose_disconnects_upstream_promptly(fake_openai: FakeOpenAI,
                                                    model: OpenAIChatModel) -> None:
    """Closing the event stream early closes the HTTP response; the server sees the client leave."""
    fake_openai.configure(reply="word " * 200, delta_delay_s=0.01)
    async with contextlib.aclosing(model.stream(MESSAGES)) as events:
        async for event in events:
            assert isinstance(event, TextDelta)
            break
    request = fake_openai.chat_requests[-1]
    await asyncio.wait_for(request.client_gone.wait(), 1.0)
    assert not request.completed


async def test_task_cancel_disconnects_upstream_promptly(fake_openai: FakeOpenAI,
                                                         model: OpenAIChatModel) -> None:
    """Cancelling the task that iterates the stream (chat.abort) closes the upstream connection."""
    fake_openai.configure(reply="word " * 200, delta_delay_s=0.01)
    first = asyncio.Event()

    async def consume() -> None:
        async for _ in model.stream(MESSAGES):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 2.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(fake_openai.chat_requests[-1].client_gone.wait(), 1.0)
    assert fake_openai.connections_open == 0


async def test_connection_is_reused_after_complete_streams(fake_openai: FakeOpenAI,
                                                           model: OpenAIChatModel) -> None:
    """Finished streams leave the keep-alive connection reusable: one socket for several replies."""
    for _ in range(3):
        await _collect(model)
    assert fake_openai.connections_opened == 1


TOOLS = [{"type": "function", "function": {"name": "remember", "parameters": {"type": "object"}}}]


async def test_tool_calls_are_joined_and_yielded_before_completion(
    fake_openai: FakeOpenAI, model: OpenAIChatModel
) -> None:
    """Argument fragments of each call are joined into one ToolCall, in index order, after the
    text and before a Completion whose finish reason is tool_calls; the request carried
    the tools."""
    fake_openai.script(Behaviour(reply="One moment.",
                                 tool_calls=[("remember", {"text": "I am a nurse"}),
                                             ("forget", {"id": 3})]))
    text, events = await _collect(model, tools=TOOLS)
    calls = [e for e in events if isinstance(e, ToolCall)]
    assert text == "One moment."
    assert ([(c.name, json.loads(c.arguments)) for c in calls]
            == [("remember", {"text": "I am a nurse"}), ("forget", {"id": 3})])
    assert all(c.id for c in calls) and calls[0].id != calls[1].id
    assert isinstance(events[-1], Completion) and events[-1].finish_reason == "tool_calls"
    assert fake_openai.chat_requests[-1].json["tools"] == TOOLS


async def test_a_model_without_tools_is_asked_again_without_them(
    fake_openai: FakeOpenAI, model: OpenAIChatModel
) -> None:
    """A 400 naming tools makes the model retry the same request without tools and stop
    offering them."""
    fake_openai.configure(reject_tools=True, reply="fine")
    text, _ = await _collect(model, tools=TOOLS)
    assert text == "fine" and model.supports_tools is False
    assert [("tools" in r.json) for r in fake_openai.chat_requests] == [True, False]
    await _collect(model, tools=TOOLS)
    assert "tools" not in fake_openai.chat_requests[-1].json


@contextlib.asynccontextmanager
async def _raw_sse_server(pieces: list[bytes]) -> AsyncIterator[str]:
    """A loopback HTTP server that answers every request with ``pieces`` as a chunked SSE body,
    one socket write per piece, so a test controls where the reads split the frames; yields
    its base URL and, on exit, waits until every answer has closed its socket."""
    answers: list[asyncio.Task[None]] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n")
            for piece in pieces:
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
                await asyncio.sleep(0.01)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client left first, as it does after an error event
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def start(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answers.append(asyncio.ensure_future(answer(reader, writer)))

    server = await asyncio.start_server(start, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    finally:
        server.close()
        await server.wait_closed()
        await asyncio.gather(*answers)


def _frame(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return json.dumps({"model": "raw",
                       "choices": [{"delta": delta, "finish_reason": finish}]}).encode()


async def test_sse_framing_across_reads() -> None:
    """CRLF line ends split between reads, comments, other fields and multi-line data decode as
    the SSE spec says; an unfinished event at the end of the body is dropped."""
    first, second = _frame({"content": "he"}), _frame({"content": "llo"}, "stop")
    half = second.index(b'"finish_reason"')  # between two JSON tokens
    pieces = [b": keep-alive\r\n\r\nevent: message\r\ndata: " + first + b"\r",
              b"\n\r\ndata: " + second[:half] + b"\r\ndata: ", second[half:] + b"\r\n\r\n",
              b"data: [DONE]\r\n\r\ndata: {\"dropped\": true}\r\n"]
    # The split data lines rejoin with a newline, which JSON reads as whitespace.
    async with _raw_sse_server(pieces) as url:
        chat = OpenAIChatModel(model="m", base_url=url, api_key=KEY, timeout_s=2.0, max_retries=0)
        try:
            text, events = await _collect(chat)
        finally:
            await chat.close()
    assert text == "hello"
    assert (isinstance(events[-1], Completion) and events[-1].finish_reason == "stop"
            and events[-1].model == "raw")


async def test_error_event_mid_stream_ends_early() -> None:
    """An {"error": …} event after text is a retryable early end carrying the endpoint's message,
    with the key scrubbed."""
    error = json.dumps({"error": {"message": f"overloaded, key {KEY}",
                                  "type": "server_error"}}).encode()
    pieces = [b"data: " + _frame({"content": "one "}) + b"\n\n", b"data: " + error + b"\n\n"]
    async with _raw_sse_server(pieces) as url:
        chat = OpenAIChatModel(model="m", base_url=url, api_key=KEY, timeout_s=2.0, max_retries=0)
        try:
            err = await _failure(chat)
        finally:
            await chat.close()
    assert (err.status, err.retryable) == (None, True)
    assert "ended early after 4 characters: overloaded" in err.message and KEY not in err.message
