"""The model-facing side of chat: a small ``ChatModel`` Protocol and its OpenAI-compatible backend.

``OpenAIChatModel`` streams chat completions through the ``openai`` SDK from any
OpenAI-compatible endpoint (OpenAI, Ollama, vLLM, LM Studio, llama.cpp). The SDK sends the
request (auth, base URL, timeouts, retries, status errors); the streamed body is read raw and
each server-sent event decoded with orjson into the few fields a run uses. Every failure leaves
this module as one :class:`~gateway.errors.UpstreamError` with an HTTP status (or ``None``
when no answer came), a ``retryable`` flag and a message safe to show: the API key never
appears in it.

Usage::

    model = create_chat_model(base_url, api_key, "gpt-4o-mini", timeout_s=60)
    async with contextlib.aclosing(model.stream(messages)) as events:
        async for event in events:
            ...  # TextDelta(text) ..., ToolCall(...) ...,
                 # then one Completion(finish_reason, usage, model)
    await model.close()

Closing the generator early (``aclose()``, or cancelling the task iterating it) closes the
HTTP response at once, so the endpoint sees the client leave and stops
generating. The SDK retries (``max_retries``) only before the first byte of an answer; once
text has streamed, a failure is reported, never silently replayed.

Tools: ``stream(messages, tools=[…])`` offers OpenAI function tools. The API streams a call as
``delta.tool_calls`` pieces keyed by ``index`` (the first carries ``id``, ``type`` and
``function.name``, later ones argument fragments) and ends with finish_reason
``"tool_calls"``; the pieces are joined here and each whole call is yielded as one
:class:`ToolCall` after the text, before the ``Completion``. An endpoint that answers 400 to a
request with tools (a model without tool support) is asked again without them, once, and
never offered tools again: ``supports_tools`` turns false.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias
from urllib.parse import urlsplit

import anyio
import httpx2
import openai
import orjson
import structlog

from gateway.errors import UpstreamError

__all__ = [
    "OPENAI_BASE_URL",
    "ChatEvent",
    "ChatModel",
    "Completion",
    "OpenAIChatModel",
    "SampledModel",
    "Sampling",
    "TextDelta",
    "ToolCall",
    "create_chat_model",
]

log = structlog.get_logger("recalld.llm")

OPENAI_BASE_URL = "https://api.openai.com/v1"
# Local servers (Ollama, llama.cpp) ignore the key, but the SDK refuses to start without one.
PLACEHOLDER_API_KEY = "no-key-required"
_DETAIL_CHARS = 300
_KEY_LIKE = re.compile(r"\b((?:sk|pk|rk|key)[-_])[A-Za-z0-9_\-*.]{6,}", re.IGNORECASE)
_BEARER = re.compile(r"(Bearer\s+)\S+", re.IGNORECASE)
# What the SDK itself counts as a broken connection (its _httpx2.request_exceptions).
_TRANSPORT_ERRORS: tuple[type[Exception], ...] = (httpx2.RequestError, ssl.SSLError,
                                                  anyio.EndOfStream)
# How long the rest of a body after [DONE] may take to arrive (the SDK's own drain bound).
_DRAIN_S = 0.1


@dataclass(frozen=True, slots=True)
class TextDelta:
    """New reply text since the previous event."""

    text: str


@dataclass(frozen=True, slots=True)
class Completion:
    """The end of a reply: why it stopped, token usage if the endpoint reported it, the model."""

    finish_reason: str
    usage: dict[str, int] | None
    model: str


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One whole function call the model asked for; ``arguments`` is its JSON text as sent."""

    id: str
    name: str
    arguments: str


ChatEvent: TypeAlias = TextDelta | ToolCall | Completion
Messages: TypeAlias = Sequence[Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class Sampling:
    """A session's request parameters (``sessions.update``); None: not sent, the endpoint's
    default."""

    temperature: float | None = None
    max_tokens: int | None = None

    def body(self) -> dict[str, Any]:
        """The request body's fields for these, as the chat completions API names them."""
        out: dict[str, Any] = {}
        if self.temperature is not None:
            out["temperature"] = self.temperature
        if self.max_tokens is not None:
            out["max_tokens"] = self.max_tokens
        return out


class ChatModel(Protocol):
    """Anything that can stream a reply to a list of chat messages (``role``, ``content``, and
    for tool turns ``tool_calls`` / ``tool_call_id``)."""

    name: str
    supports_tools: bool

    def stream(
        self, messages: Messages, *, model: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None, sampling: Sampling | None = None,
    ) -> AsyncGenerator[ChatEvent, None]:
        """Yield ``TextDelta``s, then the ``ToolCall``s, then exactly one ``Completion``, or
        raise ``UpstreamError``."""
        ...

    async def complete(self, messages: Messages, *, model: str | None = None) -> str:
        """One whole reply, not streamed (background work such as episode summaries)."""
        ...

    async def close(self) -> None: ...


class OpenAIChatModel:
    """A ``ChatModel`` over ``openai.AsyncOpenAI`` streaming chat completions."""

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 10.0,
        max_retries: int = 2,
    ) -> None:
        self.name = model
        self.base_url = base_url or OPENAI_BASE_URL
        self.timeout_s = timeout_s
        self._api_key = api_key
        # The read timeout applies to every socket read, so it bounds both the wait for the
        # first byte and the silence between two chunks of a stream.
        self._client = openai.AsyncOpenAI(
            api_key=api_key or PLACEHOLDER_API_KEY,
            base_url=self.base_url,  # always explicit: the SDK would otherwise read OPENAI_BASE_URL
            timeout=openai.Timeout(timeout_s, connect=connect_timeout_s),
            max_retries=max_retries,
        )
        # Some older local servers reject stream_options; after one such 400 we stop sending it.
        self._ask_usage = True
        # Likewise tools, for models without tool support (see the module docstring).
        self.supports_tools = True

    @property
    def endpoint(self) -> str:
        """The base URL without credentials or query, for messages and logs."""
        parts = urlsplit(self.base_url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{host}{port}{parts.path}"

    async def close(self) -> None:
        await self._client.close()

    async def stream(
        self, messages: Messages, *, model: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None, sampling: Sampling | None = None,
    ) -> AsyncGenerator[ChatEvent, None]:
        """Stream one reply; see the module docstring for the events and the failure contract."""
        chosen = model or self.name
        response = await self._open(messages, chosen,
                                    tools if self.supports_tools else None, sampling)
        received = 0
        finish: str | None = None
        usage: dict[str, int] | None = None
        reported_model = chosen
        calls: dict[int, list[str]] = {}  # index → [id, name, arguments so far]
        body = response.aiter_bytes()
        events = _sse_data(body)
        try:
            async for data in events:
                if data.startswith(b"[DONE]"):
                    await _drain(body)
                    break
                chunk = orjson.loads(data)
                if not isinstance(chunk, dict):
                    raise ValueError(f"event is not an object: {data[:80]!r}")
                if chunk.get("error"):
                    raise UpstreamError(
                        f"model stream ended early after {received} characters: "
                        f"{self._frame_error(chunk)}",
                        None,
                        True,
                    )
                reported_model = chunk.get("model") or reported_model
                if chunk.get("usage") is not None:
                    usage = _usage_dict(chunk["usage"])
                for choice in (chunk.get("choices") or ())[:1]:
                    delta = choice.get("delta") or {}
                    text = delta.get("content")
                    if text:
                        received += len(text)
                        yield TextDelta(text)
                    for piece in delta.get("tool_calls") or ():
                        call = calls.setdefault(piece.get("index", 0), ["", "", ""])
                        call[0] = piece.get("id") or call[0]
                        function = piece.get("function")
                        if function:
                            call[1] = function.get("name") or call[1]
                            call[2] += function.get("arguments") or ""
                    finish = choice.get("finish_reason") or finish
        except httpx2.TimeoutException:
            raise self._stream_timeout(received) from None
        except _TRANSPORT_ERRORS as exc:
            raise UpstreamError(
                f"model stream ended early after {received} characters: "
                f"{self._scrub(_describe(exc))}",
                None,
                True,
            ) from None
        except (ValueError, AttributeError, TypeError) as exc:  # not JSON, or not the
                                                                # shape of a chunk
            raise UpstreamError(
                f"model stream ended early after {received} characters: malformed event "
                f"({self._scrub(str(exc))})",
                None,
                True,
            ) from None
        finally:
            # Closing at once (also on aclose() or cancellation) tells the endpoint the client left.
            await events.aclose()
            await body.aclose()
            await response.aclose()
        if finish is None:
            # A clean end of body without a finish_reason: the server gave up mid-reply.
            raise UpstreamError(
                f"model stream ended early after {received} characters (no finish reason)",
                None, True
            )
        for index in sorted(calls):
            call_id, name, arguments = calls[index]
            yield ToolCall(call_id or f"call_{index}", name, arguments)
        yield Completion(finish, usage, reported_model)

    async def complete(self, messages: Messages, *, model: str | None = None) -> str:
        """One reply, not streamed; failures map like ``stream``'s before any text."""
        payload: list[Any] = [dict(m) for m in messages]
        try:
            response = await self._client.chat.completions.create(model=model or self.name,
                                                                  messages=payload)
        except openai.APIError as exc:
            raise self._request_error(exc) from None
        if not response.choices:
            raise UpstreamError("model endpoint answered without a choice", None, True)
        return response.choices[0].message.content or ""

    async def _open(
        self, messages: Messages, model: str, tools: Sequence[Mapping[str, Any]] | None,
        sampling: Sampling | None = None,
    ) -> httpx2.Response:
        """Send the request and return the answer's response with its body still unread; the
        SDK's retries happen in here, before any text exists.

        The body goes through the SDK's generic ``post`` (its documented way to send any JSON)
        rather than ``chat.completions.create``: ``create`` first walks every message and tool
        against the SDK's TypedDicts (``maybe_transform``), about 0.25 ms per message and
        0.5 ms for the memory tools here, which is time between the user's message and the
        model's first byte. Our messages and tools are plain JSON already, which that walk
        returns unchanged; the path, headers, retries, timeouts and status errors are
        ``create``'s own. ``cast_to=httpx2.Response`` with ``stream=True`` (the SDK's raw
        response) hands the body over unparsed: building a pydantic ``ChatCompletionChunk``
        for every delta was most of a run's CPU, so ``stream`` reads the few fields it uses
        with orjson instead.
        """
        for _attempt in range(3):
            body: dict[str, Any] = {"model": model, "messages": [dict(m) for m in messages],
                                    "stream": True}
            if self._ask_usage:
                body["stream_options"] = {"include_usage": True}
            if tools:
                body["tools"] = list(tools)
            if sampling is not None:
                body.update(sampling.body())
            try:
                return await self._client.post(
                    "/chat/completions", body=body, cast_to=httpx2.Response, stream=True,
                    options={"security": {"bearer_auth": True}},  # create()'s own auth
                )
            except openai.BadRequestError as exc:
                if self._ask_usage and "stream_options" in str(exc.message):
                    self._ask_usage = False
                    continue
                if tools and "tool" in str(exc.message).lower():
                    self.supports_tools = False
                    tools = None
                    log.warning("chat.tools_unsupported", model=model,
                                effect="replies without memory tools")
                    continue
                raise self._request_error(exc) from None
            except openai.APIError as exc:
                raise self._request_error(exc) from None
        raise AssertionError("unreachable")

    # -- failure mapping: one place, messages scrubbed ---------------------------------

    def _request_error(self, exc: openai.APIError) -> UpstreamError:
        """Map a failure before the stream started."""
        if isinstance(exc, openai.APITimeoutError):
            return UpstreamError(
                f"model endpoint {self.endpoint} did not answer within {self.timeout_s:g}s",
                None, True
            )
        if isinstance(exc, openai.APIConnectionError):
            return UpstreamError(
                f"cannot reach model endpoint {self.endpoint}: {self._cause(exc)}", None, True
            )
        if isinstance(exc, openai.APIStatusError):
            return self._status_error(exc)
        return UpstreamError(f"model endpoint error: {self._detail(exc)}", None, True)

    def _stream_timeout(self, received: int) -> UpstreamError:
        """Map a read timeout while the reply was streaming."""
        if received == 0:
            what = f"no reply text within {self.timeout_s:g}s"
        else:
            what = f"stalled for more than {self.timeout_s:g}s after {received} characters"
        return UpstreamError(f"model stream timed out: {what}", None, True)

    def _frame_error(self, frame: Mapping[str, Any]) -> str:
        """The message of an ``{"error": …}`` event: the endpoint failed after it had started."""
        error = frame["error"]
        message = error.get("message") if isinstance(error, Mapping) else None
        return self._scrub(message if message and isinstance(message, str)
                           else "An error occurred during streaming")

    def _status_error(self, exc: openai.APIStatusError) -> UpstreamError:
        status = exc.status_code
        detail = self._detail(exc)
        if status in (401, 403):
            what = "rejected the API key" if status == 401 else "refused access"
            return UpstreamError(f"model endpoint {what} ({status}): {detail}", status, False)
        if status == 429:
            wait = _retry_after(exc.response.headers)
            hint = f"; retry after {wait}" if wait else ""
            return UpstreamError(f"model endpoint rate limit (429){hint}: {detail}", status, True)
        retryable = status in (408, 409) or status >= 500
        return UpstreamError(f"model endpoint answered {status}: {detail}", status, retryable)

    def _detail(self, exc: openai.APIError) -> str:
        body = exc.body
        message = body.get("message") if isinstance(body, dict) else None
        return self._scrub(str(message) if message else exc.message)

    def _cause(self, exc: BaseException) -> str:
        cause = exc.__cause__ or exc.__context__
        return self._scrub(str(exc) if cause is None else _describe(cause))

    def _scrub(self, text: str) -> str:
        """Remove anything that could be the key; endpoints sometimes echo it back."""
        if self._api_key:
            text = text.replace(self._api_key, "***")
        text = _BEARER.sub(r"\1***", _KEY_LIKE.sub(r"\1***", text))
        return text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 1] + "…"


class SampledModel:
    """``inner`` with a run's :class:`Sampling` on every streamed request: what the run hands
    the memory tools, whose rounds then all go out with the session's parameters. Closing it
    leaves ``inner`` open (the gateway's one model outlives every run)."""

    def __init__(self, inner: ChatModel, sampling: Sampling) -> None:
        self.inner = inner
        self.sampling = sampling
        self.name = inner.name

    @property
    def supports_tools(self) -> bool:
        return self.inner.supports_tools  # learnt by the inner model, for every run

    @supports_tools.setter
    def supports_tools(self, value: bool) -> None:
        self.inner.supports_tools = value

    def stream(
        self, messages: Messages, *, model: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None, sampling: Sampling | None = None,
    ) -> AsyncGenerator[ChatEvent, None]:
        return self.inner.stream(messages, model=model, tools=tools,
                                 sampling=sampling or self.sampling)

    async def complete(self, messages: Messages, *, model: str | None = None) -> str:
        return await self.inner.complete(messages, model=model)

    async def close(self) -> None:
        pass


def create_chat_model(
    base_url: str | None,
    api_key: str | None,
    model: str,
    *,
    timeout_s: float = 60.0,
    connect_timeout_s: float = 10.0,
    max_retries: int = 2,
) -> ChatModel | None:
    """The configured model, or ``None`` when neither an endpoint nor a key is set."""
    if not base_url and not api_key:
        return None
    return OpenAIChatModel(
        model=model,
        base_url=base_url,
        api_key=api_key,
        timeout_s=timeout_s,
        connect_timeout_s=connect_timeout_s,
        max_retries=max_retries,
    )


async def _sse_data(body: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    """Each server-sent event's data (its ``data:`` lines joined by newlines), as bytes.

    The SSE framing of the spec as the SDK's decoder reads it: lines end in LF, CRLF or CR; an
    empty line ends an event; other fields and comments are skipped; an event the body ends
    without finishing is dropped.
    """
    pending = b""
    data: list[bytes] = []
    async for chunk in body:
        text = pending + chunk
        if b"\r" in text:
            # A CR at the end may be the first half of a CRLF split between two reads.
            held = text.endswith(b"\r")
            text = text[:-1] if held else text
            text = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n") + (b"\r" if held else b"")
        lines = text.split(b"\n")
        pending = lines.pop()
        for line in lines:
            if not line:
                if data:
                    yield b"\n".join(data)
                    data = []
            elif line.startswith(b"data:"):
                data.append(line[6:] if line.startswith(b"data: ") else line[5:])


async def _drain(body: AsyncGenerator[bytes, None]) -> None:
    """Read what follows ``[DONE]`` so an HTTP/1.1 connection goes back to the pool for reuse;
    a server that keeps the body open longer than a moment just loses the connection."""
    with contextlib.suppress(TimeoutError, *_TRANSPORT_ERRORS, httpx2.TimeoutException):
        async with asyncio.timeout(_DRAIN_S):
            async for _ in body:
                pass


def _describe(exc: BaseException) -> str:
    """An exception as ``Type: message``, for errors of the transport under the SDK."""
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


def _usage_dict(usage: Any) -> dict[str, int] | None:
    """Token counts only; the detail sub-objects differ between servers."""
    if not isinstance(usage, Mapping):
        return None
    return {k: v for k, v in usage.items() if isinstance(v, int) and not isinstance(v, bool)}


def _retry_after(headers: Any) -> str | None:
    """The server's requested wait, as written for a person ("2s", "250ms")."""
    seconds = headers.get("retry-after")
    if seconds:
        with contextlib.suppress(ValueError):
            return f"{float(seconds):g}s"
        return json.dumps(seconds)  # an HTTP date: show it as given
    ms = headers.get("retry-after-ms")
    if ms:
        with contextlib.suppress(ValueError):
            return f"{float(ms):g}ms"
    return None
