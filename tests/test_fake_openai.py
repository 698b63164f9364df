"""The fake OpenAI server, seen through the real ``openai`` SDK exactly as the gateway sees it."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from testkit.fake_openai import Behaviour, FakeOpenAI, hashed_embedding
from tests.fake_openai import fake_openai

__all__ = ["fake_openai"]  # the fixture is imported to be used here

USER: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "hello there"},
]


@pytest.fixture
async def client(fake_openai: FakeOpenAI) -> AsyncIterator[openai.AsyncOpenAI]:
    sdk = openai.AsyncOpenAI(base_url=fake_openai.base_url, api_key="sk-test", max_retries=0,
                             timeout=5)
    try:
        yield sdk
    finally:
        await sdk.close()


async def _stream_text(
    client: openai.AsyncOpenAI, *, include_usage: bool = False
) -> tuple[str, list[Any]]:
    stream = await client.chat.completions.create(
        model="fake-model", messages=USER, stream=True,
        stream_options={"include_usage": include_usage}
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


async def test_stream_assembles_reply_with_role_finish_and_usage(
    fake_openai: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    """A streamed reply arrives as role chunk, content deltas, a stop chunk and a usage chunk."""
    text, chunks = await _stream_text(client, include_usage=True)
    assert text == "Echo: hello there"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens == (chunks[-1].usage.prompt_tokens
                                             + chunks[-1].usage.completion_tokens)
    assert all(c.usage is None for c in chunks[:-1])
    assert len(chunks) > 4  # word by word, not one blob


async def test_requests_are_recorded_with_headers_and_body(
    fake_openai: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    """Every request is recorded so tests can assert what the model was sent."""
    await _stream_text(client)
    req = fake_openai.requests[-1]
    assert (req.method, req.path) == ("POST", "/v1/chat/completions")
    assert req.headers["authorization"] == "Bearer sk-test"
    assert req.json["messages"][0] == {"role": "system", "content": "Be brief."}
    assert req.completed and not req.client_gone.is_set()


async def test_reply_function_and_fixed_delta_count(
    fake_openai: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    """The reply may be a function of the messages and split into an exact number of deltas."""
    fake_openai.configure(reply=lambda msgs: msgs[-1]["content"].upper(), deltas=3)
    text, chunks = await _stream_text(client)
    assert text == "HELLO THERE"
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) == 3


async def test_non_stream_completion(fake_openai: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    """A request without stream gets one chat.completion object."""
    fake_openai.configure(reply="whole answer")
    done = await client.chat.completions.create(model="fake-model", messages=USER)
    assert done.choices[0].message.content == "whole answer"
    assert done.choices[0].finish_reason == "stop" and done.usage is not None


async def test_five_hundred_deltas_stream_quickly(
    fake_openai: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    """Five hundred deltas with no configured delay stream without waiting between them."""
    fake_openai.configure(reply="ab" * 500, deltas=500)
    started = time.perf_counter()
    text, _ = await _stream_text(client)
    assert text == "ab" * 500
    assert time.perf_counter() - started < 5.0  # 500 × even 10 ms of delay would be 5 s


async def test_keep_alive_reuses_one_connection(
    fake_openai: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    """Completed streams end their chunked body properly, so the SDK reuses the connection."""
    for _ in range(3):
        await _stream_text(client)
    assert fake_openai.connections_opened == 1


async def test_delays_before_first_byte_and_between_deltas(
    fake_openai: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    """Configured delays hold the first byte and space the deltas."""
    fake_openai.configure(reply="a b c", first_byte_delay_s=0.2, delta_delay_s=0.05)
    started = time.perf_counter()
    await _stream_text(client)
    assert time.perf_counter() - started >= 0.3


@pytest.mark.parametrize(("status", "error"), [
    (401, openai.AuthenticationError), (403, openai.PermissionDeniedError),
    (500, openai.InternalServerError), (503, openai.InternalServerError),
])
async def test_error_status_raises_sdk_status_error(
    fake_openai: FakeOpenAI, client: openai.AsyncOpenAI, status: int, error: type[Exception]
) -> None:
    """A scripted status reaches the SDK as its typed APIStatusError with the API's error body."""
    fake_openai.script(Behaviour(status=status, error_message="scripted failure"))
    with pytest.raises(error) as info:
        await _stream_text(client)
    assert isinstance(info.value, openai.APIStatusError) and info.value.status_code == status
    assert "scripted failure" in info.value.message


async def test_wrong_api_key_gets_401(fake_openai: FakeOpenAI) -> None:
    """With an api_key set, the server refuses other bearer tokens like the real API."""
    fake_openai.api_key = "sk-right"
    async with openai.AsyncOpenAI(base_url=fake_openai.base_url, api_key="sk-wrong",
                                  max_retries=0) as sdk:
        with pytest.raises(openai.AuthenticationError):
            await sdk.models.list()
    async with openai.AsyncOpenAI(base_url=fake_openai.base_url, api_key="sk-right",
                                  max_retries=0) as sdk:
        assert [m.id async for m in sdk.models.list()] == ["fake-model", "fake-embed"]


async def test_429_carries_retry_after(fake_openai: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    """A 429 carries Retry-After in whole seconds and the rate-limit error code."""
    fake_openai.script(Behaviour(status=429, retry_after=2))
    with pytest.raises(openai.RateLimitError) as info:
        await _stream_text(client)
    assert info.value.response.headers["retry-after"] == "2"
    assert info.value.code == "rate_limit_exceeded"


async def test_queue_of_behaviours_then_default(fake_openai: FakeOpenAI) -> None:
    """Queued behaviours apply one per request; the SDK's own retry turns 429 then 200 into
    success."""
    fake_openai.script(Behaviour(status=429, retry_after=0.01), {"reply": "second try"})
    async with openai.AsyncOpenAI(base_url=fake_openai.base_url, api_key="k", max_retries=1) as sdk:
        stream = await sdk.chat.completions.create(model="m", messages=USER, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream])
    assert text == "second try"
    assert len(fake_openai.chat_requests) == 2


async def test_cut_mid_stream_raises_connection_error(
    fake_openai: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    """Closing the socket after some deltas surfaces as APIConnectionError after those deltas."""
    fake_openai.configure(reply="one two three four", cut_after=2)
    stream = await client.chat.completions.create(model="m", messages=USER, stream=True)
    seen = []
    with pytest.raises(openai.APIConnectionError):
        async for chunk in stream:
            seen.append(chunk.choices[0].delta.content)
    assert "".join(filter(None, seen)) == "one two"


async def test_malformed_sse_raises_json_error(
    fake_openai: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    """A frame that is not JSON makes the SDK raise a bare JSONDecodeError (not an APIError)."""
    fake_openai.configure(malformed_sse=True)
    with pytest.raises(json.JSONDecodeError):
        await _stream_text(client)


async def test_hang_times_out_and_server_sees_client_leave(
    fake_openai: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    """A request that is never answered times out in the SDK; the server notices the client left."""
    fake_openai.configure(hang=True)
    with pytest.raises(openai.APITimeoutError):
        await client.chat.completions.create(model="m", messages=USER, stream=True, timeout=0.2)
    await asyncio.wait_for(fake_openai.requests[-1].client_gone.wait(), 1.0)


async def test_hang_after_deltas_times_out_while_reading(
    fake_openai: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    """A stream that goes silent mid-way raises APITimeoutError from the iteration."""
    fake_openai.configure(reply="one two three", hang_after=1)
    stream = await client.chat.completions.create(model="m", messages=USER, stream=True,
                                                  timeout=0.2)
    with pytest.raises(openai.APITimeoutError):
        async for _ in stream:
            pass


async def test_early_close_is_seen_by_server(
    fake_openai: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    """Closing the SDK stream early closes the socket, and the server records the disconnect."""
    fake_openai.configure(reply="word " * 100, delta_delay_s=0.02)
    stream = await client.chat.completions.create(model="m", messages=USER, stream=True)
    async for _ in stream:
        break
    await stream.close()
    await asyncio.wait_for(fake_openai.requests[-1].client_gone.wait(), 1.0)
    assert not fake_openai.requests[-1].completed


async def test_close_with_hanging_client_is_clean() -> None:
    """Closing the server while a request hangs ends the handler and the client sees a closed
    socket."""
    async with FakeOpenAI() as server, openai.AsyncOpenAI(
        base_url=server.base_url, api_key="k", max_retries=0, timeout=5
    ) as sdk:
        server.configure(hang=True)
        pending = asyncio.create_task(sdk.chat.completions.create(model="m", messages=USER,
                                                                  stream=True))
        while not server.requests:
            await asyncio.sleep(0.01)
        await server.close()
        with pytest.raises(openai.APIConnectionError):
            await pending
        assert server.connections_open == 0
    await server.close()  # twice is fine


async def test_embeddings_float_and_base64_agree(
    fake_openai: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    """Embeddings are deterministic, unit length, the same in float and base64, and counted."""
    texts = ["the cat sat", "a dog ran", "the cat sat"]
    # the SDK asks for base64
    as_b64 = await client.embeddings.create(model="fake-embed", input=texts)
    as_float = await client.embeddings.create(model="fake-embed", input=texts,
                                              encoding_format="float")
    assert fake_openai.requests[0].json["encoding_format"] == "base64"
    vectors = [d.embedding for d in as_b64.data]
    assert vectors == [d.embedding for d in as_float.data]
    assert vectors[0] == vectors[2] != vectors[1]
    assert len(vectors[0]) == fake_openai.embedding_dims
    assert math.isclose(sum(v * v for v in vectors[0]), 1.0, rel_tol=1e-5)
    assert fake_openai.embedding_calls == 2 and fake_openai.embedded_inputs == texts * 2


async def test_embeddings_honour_dimensions_and_share_words(
    fake_openai: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    """The ``dimensions`` parameter sets the length; texts sharing words are closer than
    unrelated ones."""
    res = await client.embeddings.create(model="e", input="solo", dimensions=16)
    assert len(res.data[0].embedding) == 16
    a, b, c = (hashed_embedding(t, 256)
               for t in ("sqlite vector search", "vector search engine", "banana bread"))
    assert sum(x * y for x, y in zip(a, b)) > sum(x * y for x, y in zip(a, c))


async def test_embedding_faults(fake_openai: FakeOpenAI, client: openai.AsyncOpenAI) -> None:
    """The embeddings endpoint has its own script: status errors and cuts."""
    fake_openai.script_embeddings(Behaviour(status=500), Behaviour(cut_after=0))
    with pytest.raises(openai.InternalServerError):
        await client.embeddings.create(model="e", input="x")
    with pytest.raises(openai.APIConnectionError):
        await client.embeddings.create(model="e", input="x")
    assert (await client.embeddings.create(model="e", input="x")).data
    assert fake_openai.embedding_calls == 3


TOOLS: list[Any] = [{"type": "function", "function": {"name": "remember", "parameters": {
    "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}]


async def test_tool_calls_stream_in_the_api_shape(
    fake_openai: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    """Scripted calls arrive as delta.tool_calls: index/id/type/name first, then argument
    fragments, two calls by index, and finish_reason "tool_calls"."""
    fake_openai.script(Behaviour(reply="", tool_calls=[
        ("remember", {"text": "I own a red bicycle"}), ("remember", "{not json")]))
    stream = await client.chat.completions.create(model="fake-model", messages=USER, stream=True,
                                                  tools=TOOLS)
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.content is None
    pieces = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    heads = [p for p in pieces if p.id is not None]
    assert [(h.index, h.type, h.function.name, h.function.arguments) for h in heads] == [  # type: ignore[union-attr]
        (0, "function", "remember", ""), (1, "function", "remember", "")]
    joined = {i: "".join(p.function.arguments or "" for p in pieces  # type: ignore[union-attr]
                         if p.index == i) for i in (0, 1)}
    assert json.loads(joined[0]) == {"text": "I own a red bicycle"} and joined[1] == "{not json"
    assert sum(1 for p in pieces if p.index == 0 and p.id is None) > 1  # fragments, not one blob
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


async def test_tool_calls_only_when_tools_are_offered(
    fake_openai: FakeOpenAI, client: openai.AsyncOpenAI
) -> None:
    """Without tools in the request the scripted calls are not sent; reject_tools answers 400 to
    tools."""
    fake_openai.configure(reply="plain", tool_calls=[("remember", {"text": "x"})])
    text, chunks = await _stream_text(client)
    assert text == "plain" and chunks[-1].choices[0].finish_reason == "stop"
    fake_openai.configure(reject_tools=True)
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="fake-model", messages=USER, stream=True,
                                             tools=TOOLS)
    assert "does not support tools" in str(info.value)
