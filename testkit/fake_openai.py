"""A real OpenAI-compatible HTTP/1.1 server on loopback, scriptable per test.

It speaks the wire format the ``openai`` SDK expects from the real API: chunked
``text/event-stream`` replies of ``chat.completion.chunk`` frames ending in ``data: [DONE]``,
JSON error bodies with the API's status codes and ``Retry-After``, keep-alive connections,
``/v1/embeddings`` (float and base64) and ``/v1/models``. Faults are real socket behaviour:
a cut closes the socket mid-body, a hang never answers, a malformed frame is bad JSON.

Usage::

    server = FakeOpenAI()
    await server.start()
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="k")
    server.configure(reply="Hello there", delta_delay_s=0.01)   # every later request
    server.script(Behaviour(status=429, retry_after=1), Behaviour())  # next two, then default
    # a tool call
    server.script(Behaviour(reply="", tool_calls=[("remember", {"text": "I like tea"})]))
    ...
    assert server.requests[-1].json["messages"][0]["role"] == "system"
    await server.close()

It lives in ``testkit/`` because the tests and the chat benchmark both stream from it; the tests'
pytest fixture is ``tests/fake_openai.py``. Run by hand (or for the soak):
``python -m testkit.fake_openai --port 8901``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import dataclasses
import hashlib
import math
import re
import signal
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.chat.compaction import COMPACTION_INSTRUCTION
from gateway.chat.titles import TITLE_INSTRUCTION

__all__ = ["Behaviour", "FakeOpenAI", "RecordedRequest", "echo_reply", "hashed_embedding"]

Messages = list[dict[str, Any]]
# A scripted tool call: the function name and its arguments (a dict is sent as JSON; a str as is,
# so a test can send arguments that are not valid JSON).
ToolCallSpec = tuple[str, Mapping[str, Any] | str]
_ARG_PIECE = 7  # argument fragment size: the real API streams arguments a few characters at a time
_MAX_HEAD_BYTES = 64 * 1024
_WORDS = re.compile(r"\w+", re.UNICODE)
_TOKENS = re.compile(r"\s*\S+|\s+")
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            408: "Request Timeout", 429: "Too Many Requests", 500: "Internal Server Error",
            502: "Bad Gateway", 503: "Service Unavailable"}
_ERROR_KINDS = {401: ("invalid_request_error", "invalid_api_key"),
                403: ("invalid_request_error", None),
                429: ("requests", "rate_limit_exceeded"),
                404: ("invalid_request_error", "model_not_found")}


def echo_reply(messages: Messages) -> str:
    """The default reply: deterministic and tied to the input, so tests can tell runs apart."""
    last = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), None)
    return f"Echo: {last}" if isinstance(last, str) else "Hello from the fake model."


def title_reply(messages: Messages) -> str:
    """The default answer to the gateway's title request: a few words of the first message."""
    exchange = next((m.get("content") for m in messages if m.get("role") == "user"), "")
    first = str(exchange).removeprefix("User: ").split("\n", 1)[0]
    return "Chat about " + " ".join(first.split()[:4])


def compaction_reply(messages: Messages) -> str:
    """The default answer to the gateway's summary request: the summary so far, then what the
    user said in the new messages, word for word (the gateway cuts it to its token bound)."""
    body = str(next((m.get("content") for m in messages if m.get("role") == "user"), ""))
    so_far, _, new = body.partition("\n\nNew messages:\n")
    previous = so_far.partition("Summary so far:\n")[2]
    said = [p.removeprefix("user: ") for p in new.split("\n\n") if p.startswith("user: ")]
    return " ".join(([] if previous == "(none yet)" else [previous]) + said)


def _system_is(body: Any, instruction: str) -> bool:
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], dict):
        return False
    return bool(messages[0].get("content") == instruction)


def is_title_request(body: Any) -> bool:
    """Whether a chat request is the gateway's title request (its system message says so)."""
    return _system_is(body, TITLE_INSTRUCTION)


def is_compaction_request(body: Any) -> bool:
    """Whether a chat request is the gateway's conversation summary request."""
    return _system_is(body, COMPACTION_INSTRUCTION)


def hashed_embedding(text: str, dims: int) -> list[float]:
    """Feature-hashed bag of words, unit length: same text, same vector; shared words, closer
    vectors."""
    vec = [0.0] * dims
    for word in _WORDS.findall(text.lower()):
        h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
        vec[h % dims] += 1.0 if (h >> 63) & 1 else -1.0
    if not any(vec):
        # No words (empty text, punctuation only): still a distinct, deterministic direction.
        seed = hashlib.sha256(text.encode()).digest()
        vec[int.from_bytes(seed[:8], "little") % dims] = 1.0
    norm = math.sqrt(sum(v * v for v in vec))
    # Round through float32 so the float and base64 encodings carry identical numbers.
    return list(array("f", (v / norm for v in vec)))


@dataclass(frozen=True, slots=True)
class Behaviour:
    """How the server answers one request; every field's default is the well-behaved API."""

    reply: str | Callable[[Messages], str] = echo_reply
    deltas: int | None = None  # split the reply into this many pieces; None: word by word
    first_byte_delay_s: float = 0.0  # before the status line
    delta_delay_s: float = 0.0  # between content frames
    finish_reason: str = "stop"
    model: str | None = None  # reported model; None: echo the requested one
    status: int | None = None  # answer this HTTP error instead
    error_message: str | None = None
    retry_after: float | None = None  # seconds, sent as Retry-After with an error status
    cut_after: int | None = None  # close the socket after this many content deltas
    hang: bool = False  # read the request, never answer
    hang_after: int | None = None  # send this many deltas, then go silent with the socket open
    # send this many deltas, then end the body cleanly: no finish, no [DONE]
    end_after: int | None = None
    malformed_sse: bool = False  # send a frame that is not JSON after `malformed_after` deltas
    malformed_after: int = 1
    # After the reply text, stream these function calls and finish with "tool_calls" (only when
    # the request offered tools; a callable sees the messages and may return none).
    tool_calls: Sequence[ToolCallSpec] | Callable[[Messages], Sequence[ToolCallSpec]] | None = None
    reject_tools: bool = False  # answer 400 to a request that offers tools, as tool-less models do


@dataclass(slots=True)
class RecordedRequest:
    """One request as the server saw it; ``client_gone`` is set if the peer left mid-answer."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any
    received_at: float
    client_gone: asyncio.Event = field(default_factory=asyncio.Event)
    client_gone_at: float | None = None
    completed: bool = False


class _ClientGone(Exception):
    """The peer closed its socket while we were answering."""


class _Cut(Exception):
    """A scripted fault: we close the socket ourselves without finishing the answer."""


class _Conn:
    """A client connection with our own buffer, so an EOF watcher can run during an answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.buf = bytearray()
        self.eof = False
        self.gone = asyncio.Event()

    async def fill(self) -> None:
        data = await self.reader.read(65536)
        if not data:
            self.eof = True
            self.gone.set()
        self.buf += data

    async def read_until(self, sep: bytes, limit: int) -> bytes | None:
        while (i := self.buf.find(sep)) < 0:
            if self.eof or len(self.buf) > limit:
                return None
            await self.fill()
        out = bytes(self.buf[: i + len(sep)])
        del self.buf[: i + len(sep)]
        return out

    async def read_exactly(self, n: int) -> bytes | None:
        while len(self.buf) < n:
            if self.eof:
                return None
            await self.fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    async def watch_eof(self) -> None:
        # While we answer, the client sends nothing (no pipelining), so any read that
        # returns is either EOF (the client left) or early bytes we keep for later.
        while not self.eof:
            await self.fill()

    async def write(self, data: bytes) -> None:
        if self.gone.is_set() or self.writer.is_closing():
            raise _ClientGone
        self.writer.write(data)
        try:
            await self.writer.drain()
        except ConnectionError as exc:
            raise _ClientGone from exc

    async def pause(self, seconds: float) -> None:
        """Sleep, but return early by raising if the client leaves meanwhile."""
        if seconds <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.gone.wait(), seconds)
        if self.gone.is_set():
            raise _ClientGone


class FakeOpenAI:
    """The server: ``start()``, point the SDK at ``base_url``, script, assert on ``requests``."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, api_key: str | None = None,
                 embedding_dims: int = 64, models: tuple[str, ...] = ("fake-model", "fake-embed"),
                 max_recorded: int | None = None) -> None:
        self.host = host
        self.port = port
        self.api_key = api_key  # when set, other bearer tokens get the API's 401
        self.embedding_dims = embedding_dims
        self.models = models
        self.chat_behaviour = Behaviour()
        # Title requests are answered by this, never by the chat script, and kept apart in
        # ``title_requests``: they come after a first reply, and chat tests count their own.
        self.title_behaviour = Behaviour(reply=title_reply)
        self.title_requests: list[RecordedRequest] = []
        # Likewise summary requests (compaction, after a run): ``compaction_behaviour`` answers
        # them (set it to fail or delay them) and ``compaction_requests`` keeps them.
        self.compaction_behaviour = Behaviour(reply=compaction_reply)
        self.compaction_requests: list[RecordedRequest] = []
        self.embedding_behaviour = Behaviour()
        self._chat_queue: collections.deque[Behaviour] = collections.deque()
        self._embedding_queue: collections.deque[Behaviour] = collections.deque()
        # Bounded for long soaks; unbounded by default so a test sees every request.
        self.requests: collections.deque[RecordedRequest] = collections.deque(maxlen=max_recorded)
        self.embedding_calls = 0
        self.embedded_inputs: list[str] = []
        self.connections_opened = 0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._closing = False
        self._conns: set[_Conn] = set()
        self._counter = 0

    # -- scripting ---------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def connections_open(self) -> int:
        return len(self._conns)

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == "/v1/chat/completions"]

    def configure(self, **changes: Any) -> None:
        """Change the default chat behaviour for every later request."""
        self.chat_behaviour = dataclasses.replace(self.chat_behaviour, **changes)

    def configure_embeddings(self, **changes: Any) -> None:
        """Change the default embeddings behaviour for every later request."""
        self.embedding_behaviour = dataclasses.replace(self.embedding_behaviour, **changes)

    def script(self, *behaviours: Behaviour | Mapping[str, Any]) -> None:
        """Queue one-shot chat behaviours, used in order before falling back to the default."""
        self._chat_queue.extend(_as_behaviour(b) for b in behaviours)

    def script_embeddings(self, *behaviours: Behaviour | Mapping[str, Any]) -> None:
        """Queue one-shot embeddings behaviours."""
        self._embedding_queue.extend(_as_behaviour(b) for b in behaviours)

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> FakeOpenAI:
        self._closing = False
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        """Stop listening, cancel every handler and close every client socket; safe twice."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> FakeOpenAI:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- HTTP --------------------------------------------------------------------------

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # A plain callback, not a coroutine: asyncio 3.11 then leaves the task to us, so we
        # track it from the first moment and its cancellation at close() is not logged as
        # an error by StreamReaderProtocol.
        if self._closing:
            # Accepted as close() ran (asyncio 3.11 leaves accepted sockets open): no handler
            # would be cancelled for it, so its socket would outlive the loop.
            writer.transport.abort()
            return
        task = asyncio.get_running_loop().create_task(self._handle(reader, writer))
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(reader, writer)
        self._conns.add(conn)
        self.connections_opened += 1
        try:
            while await self._serve_one(conn):
                pass
        except (_ClientGone, _Cut, ConnectionError):
            pass
        finally:
            self._conns.discard(conn)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve_one(self, conn: _Conn) -> bool:
        """Read one request and answer it; False when the connection should end."""
        head = await conn.read_until(b"\r\n\r\n", _MAX_HEAD_BYTES)
        if head is None:
            return False
        lines = head.decode("latin-1").split("\r\n")
        request_line = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        length = headers.get("content-length", "0")
        if len(request_line) != 3 or not length.isdigit():
            await self._send_json(conn, 400, {"error": {"message": "malformed request",
                                                        "type": "invalid_request_error"}})
            return False
        method, target, _version = request_line
        body = await conn.read_exactly(int(length))
        if body is None:
            return False
        try:
            parsed = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            parsed = None
        request = RecordedRequest(method, target.split("?", 1)[0], headers, body, parsed,
                                  time.monotonic())
        if is_title_request(parsed):
            self.title_requests.append(request)
        elif is_compaction_request(parsed):
            self.compaction_requests.append(request)
        else:
            self.requests.append(request)
        watcher = asyncio.create_task(conn.watch_eof())
        try:
            keep_open = await self._route(conn, request)
            request.completed = True
        except _ClientGone:
            request.client_gone_at = time.monotonic()
            request.client_gone.set()
            raise
        finally:
            watcher.cancel()
            try:
                await watcher
            except asyncio.CancelledError:
                # The watcher's own cancellation is expected; close() cancelling this handler
                # while it waits here is not, and must not be swallowed.
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
        return keep_open and not conn.eof and headers.get("connection", "").lower() != "close"

    async def _route(self, conn: _Conn, req: RecordedRequest) -> bool:
        if (self.api_key is not None
                and req.headers.get("authorization") != f"Bearer {self.api_key}"):
            return await self._send_error(conn, Behaviour(status=401, error_message=(
                "Incorrect API key provided. You can find your API key at https://platform.openai.com.")))
        if (req.method == "POST" and req.path == "/v1/chat/completions"
                and is_title_request(req.json)):
            return await self._chat(conn, req, self.title_behaviour)
        if (req.method == "POST" and req.path == "/v1/chat/completions"
                and is_compaction_request(req.json)):
            return await self._chat(conn, req, self.compaction_behaviour)
        if req.method == "POST" and req.path == "/v1/chat/completions":
            return await self._chat(conn, req, self._next(self._chat_queue, self.chat_behaviour))
        if req.method == "POST" and req.path == "/v1/embeddings":
            return await self._embeddings(conn, req, self._next(self._embedding_queue,
                                                                self.embedding_behaviour))
        if req.method == "GET" and req.path == "/v1/models":
            data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"}
                    for m in self.models]
            return await self._send_json(conn, 200, {"object": "list", "data": data})
        return await self._send_error(conn, Behaviour(status=404,
                                                      error_message=f"Unknown path {req.path}"))

    @staticmethod
    def _next(queue: collections.deque[Behaviour], default: Behaviour) -> Behaviour:
        return queue.popleft() if queue else default

    async def _preamble(self, conn: _Conn, b: Behaviour) -> bool:
        """Apply the faults that come before any byte; False if the error reply was sent."""
        await conn.pause(b.first_byte_delay_s)
        if b.hang:
            await conn.gone.wait()
            raise _ClientGone
        if b.status is not None:
            await self._send_error(conn, b)
            return False
        return True

    async def _chat(self, conn: _Conn, req: RecordedRequest, b: Behaviour) -> bool:
        body = req.json if isinstance(req.json, dict) else {}
        if not await self._preamble(conn, b):
            return True
        messages = body.get("messages") or []
        if b.reject_tools and body.get("tools"):
            await self._send_error(conn, Behaviour(status=400, error_message=(
                f"{body.get('model', 'fake-model')} does not support tools")))
            return True
        text = b.reply(messages) if callable(b.reply) else b.reply
        calls = b.tool_calls(messages) if callable(b.tool_calls) else (b.tool_calls or ())
        if not body.get("tools"):
            calls = ()  # like the real API: no tools offered, no tool calls
        finish_reason = "tool_calls" if calls else b.finish_reason
        self._counter += 1
        cid = f"chatcmpl-fake{self._counter}"
        model = b.model or str(body.get("model", "fake-model"))
        usage = {"prompt_tokens": _count_tokens(orjson.dumps(messages).decode()),
                 "completion_tokens": _count_tokens(text)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        if not body.get("stream"):
            if b.cut_after is not None:
                raise _Cut  # close without an answer
            message: dict[str, Any] = {"role": "assistant",
                                       "content": text or (None if calls else ""),
                                       "refusal": None}
            if calls:
                message["tool_calls"] = [
                    {"id": f"call_fake{self._counter}_{i}", "type": "function", "function": {
                        "name": name, "arguments": (args if isinstance(args, str)
                                                    else orjson.dumps(dict(args)).decode())}}
                    for i, (name, args) in enumerate(calls)]
            return await self._send_json(conn, 200, {
                "id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": finish_reason}],
                "usage": usage, "system_fingerprint": "fp_fake"})
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        await conn.write(_head(200, "text/event-stream; charset=utf-8", chunked=True))
        created = int(time.time())

        def frame(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
            chunk: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk",
                                     "created": created,
                                     "model": model, "system_fingerprint": "fp_fake",
                                     "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                  "finish_reason": finish}], **extra}
            if include_usage and "usage" not in chunk:
                chunk["usage"] = None  # the real API marks every chunk but the last this way
            return _chunk(b"data: " + orjson.dumps(chunk) + b"\n\n")

        await conn.write(frame({"role": "assistant", "content": None if calls and not text else "",
                                "refusal": None}))
        for i, piece in enumerate(_split(text, b.deltas) if text or not calls else []):
            if b.cut_after is not None and i >= b.cut_after:
                raise _Cut  # the handler closes the socket: an incomplete chunked body
            if b.hang_after is not None and i >= b.hang_after:
                await conn.gone.wait()
                raise _ClientGone
            if b.end_after is not None and i >= b.end_after:
                await conn.write(b"0\r\n\r\n")
                return True
            if b.malformed_sse and i == b.malformed_after:
                await conn.write(_chunk(b'data: {"id": "' + cid.encode() + b'", "choices": [\n\n'))
            if i:
                await conn.pause(b.delta_delay_s)
            await conn.write(frame({"content": piece}))
        if b.hang_after is not None:
            await conn.gone.wait()
            raise _ClientGone
        if b.cut_after is not None:
            raise _Cut  # asked to cut after more deltas than the reply had
        for index, (name, arguments) in enumerate(calls):
            raw = (arguments if isinstance(arguments, str)
                   else orjson.dumps(dict(arguments)).decode())
            # The first piece names the call; the arguments follow in fragments (the API's shape).
            await conn.write(frame({"tool_calls": [{"index": index,
                                                    "id": f"call_fake{self._counter}_{index}",
                                                    "type": "function",
                                                    "function": {"name": name, "arguments": ""}}]}))
            for start in range(0, len(raw), _ARG_PIECE):
                await conn.write(frame({"tool_calls": [{"index": index, "function": {
                    "arguments": raw[start:start + _ARG_PIECE]}}]}))
        await conn.write(frame({}, finish_reason))
        if include_usage:
            usage_chunk = {"id": cid, "object": "chat.completion.chunk", "created": created,
                           "model": model, "system_fingerprint": "fp_fake", "choices": [],
                           "usage": usage}
            await conn.write(_chunk(b"data: " + orjson.dumps(usage_chunk) + b"\n\n"))
        await conn.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        return True

    async def _embeddings(self, conn: _Conn, req: RecordedRequest, b: Behaviour) -> bool:
        body = req.json if isinstance(req.json, dict) else {}
        self.embedding_calls += 1
        if not await self._preamble(conn, b):
            return True
        if b.cut_after is not None:
            raise _Cut
        raw = body.get("input", [])
        inputs = [raw] if isinstance(raw, str) or (raw and isinstance(raw[0], int)) else list(raw)
        texts = [t if isinstance(t, str) else " ".join(map(str, t)) for t in inputs]
        self.embedded_inputs.extend(texts)
        dims = int(body.get("dimensions") or self.embedding_dims)
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for i, text in enumerate(texts):
            vec = hashed_embedding(text, dims)
            encoded: Any = (base64.b64encode(array("f", vec).tobytes()).decode() if as_base64
                            else vec)
            data.append({"object": "embedding", "index": i, "embedding": encoded})
        tokens = sum(_count_tokens(t) for t in texts)
        payload = {"object": "list", "data": data, "model": str(body.get("model", "fake-embed")),
                   "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
        if b.malformed_sse:
            await conn.write(_head(200, "application/json", length=9) + b'{"object"')
            return True
        return await self._send_json(conn, 200, payload)

    async def _send_json(self, conn: _Conn, status: int, payload: Any, extra: str = "") -> bool:
        data = orjson.dumps(payload)
        await conn.write(_head(status, "application/json", length=len(data), extra=extra) + data)
        return True

    async def _send_error(self, conn: _Conn, b: Behaviour) -> bool:
        status = b.status or 500
        kind, code = _ERROR_KINDS.get(status, ("server_error", None))
        message = b.error_message or f"The fake server answered {status} as scripted."
        extra = ""
        if b.retry_after is not None:
            # Integral seconds as the real API sends them; fractions in retry-after-ms.
            extra += (f"retry-after: {math.ceil(b.retry_after)}\r\n"
                      f"retry-after-ms: {int(b.retry_after * 1000)}\r\n")
        return await self._send_json(
            conn, status, {"error": {"message": message, "type": kind, "param": None,
                                     "code": code}}, extra)


def _as_behaviour(b: Behaviour | Mapping[str, Any]) -> Behaviour:
    return b if isinstance(b, Behaviour) else Behaviour(**b)


def _count_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / 4)) if text else 0


def _split(text: str, parts: int | None) -> list[str]:
    if parts is None:
        return _TOKENS.findall(text) or [text]
    parts = max(1, min(parts, len(text) or 1))
    step, extra = divmod(len(text), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + step + (1 if i < extra else 0)
        out.append(text[start:end])
        start = end
    return out


def _head(status: int, content_type: str, *, length: int | None = None, chunked: bool = False,
          extra: str = "") -> bytes:
    framing = "transfer-encoding: chunked\r\n" if chunked else f"content-length: {length}\r\n"
    return (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\ncontent-type: {content_type}\r\n"
            f"{framing}cache-control: no-cache\r\nconnection: keep-alive\r\n"
            f"x-request-id: req_fake\r\nopenai-processing-ms: 1\r\n{extra}\r\n").encode("latin-1")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the fake OpenAI-compatible server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8901)
    parser.add_argument("--reply", default=None, help="fixed reply text (default: echo the user)")
    parser.add_argument("--deltas", type=int, default=None)
    parser.add_argument("--delta-delay", type=float, default=0.0)
    parser.add_argument("--first-byte-delay", type=float, default=0.0)
    parser.add_argument("--dims", type=int, default=64)
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args()

    async def serve() -> None:
        server = FakeOpenAI(host=args.host, port=args.port, api_key=args.api_key,
                            embedding_dims=args.dims, max_recorded=1000)
        server.configure(deltas=args.deltas, delta_delay_s=args.delta_delay,
                         first_byte_delay_s=args.first_byte_delay,
                         **({"reply": args.reply} if args.reply is not None else {}))
        await server.start()
        print(f"fake OpenAI listening on {server.base_url}", flush=True)
        stop = asyncio.Event()
        # A soak harness ends us with SIGTERM; close sockets the same way as on Ctrl+C.
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        try:
            await stop.wait()
        finally:
            await server.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())


if __name__ == "__main__":
    main()
