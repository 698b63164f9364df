"""``recalld chat``: an interactive terminal client that streams replies as they arrive.

Lines from stdin (a TTY or a pipe) become ``chat.send`` calls; deltas go to stdout unbuffered,
errors to stderr as one line each. Ctrl+C while a reply streams aborts that run; Ctrl+C with no
reply streaming (including a second one before the abort lands) exits with code 130.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import mimetypes
import os
import signal
import ssl
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from gateway.cli.target import connection_target
from gateway.client import Client, RpcError
from gateway.config import Config

__all__ = ["add_chat_parser", "run_chat"]

HISTORY_SHOWN = 10
HELP = """commands:
  /new            start a new session
  /sessions       list recent sessions
  /search QUERY   search past conversations
  /regenerate     answer your last message again (the new reply replaces the last one)
  /edit TEXT      replace your last message with TEXT and answer it again
  /continue       write on a reply that stopped at the length limit
  /model [NAME]   show this chat's model and those offered, or switch to NAME
  /summary        show the summary of this chat's earlier part (what left the model's window)
  /attach PATH    attach a file (text, source, PDF, image) to your next message
  /help           show this help
  /quit           exit (end of input does too)
Ctrl+C aborts a streaming reply; Ctrl+C while idle exits (code 130)."""


def add_chat_parser(sub: Any, connection_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("chat", help="interactive chat in the terminal, replies streamed")
    p.add_argument("--session", metavar="KEY",
                   help="resume this session instead of starting a new one")
    p.add_argument("--list", action="store_true", help="list recent sessions and exit")
    connection_flags(p)
    p.set_defaults(run=run_chat)


def run_chat(config: Config, args: argparse.Namespace) -> int:
    target = connection_target(config, args)
    url, token = target.url, target.token
    if not token:
        _err(f"recalld: no token for {url}: pass --token-file, set RECALLD_TOKEN, or run "
             "`recalld token`")
        return 1
    chat = Chat(args)
    try:
        return asyncio.run(chat.main(url, token, target.ssl))
    except InvalidStatus as exc:
        status = exc.response.status_code
        reason = "the token was refused" if status == 401 else f"HTTP {status}"
        _err(f"recalld: cannot connect to {url}: {reason}")
        return 1
    except (OSError, TimeoutError, ConnectionClosed, InvalidHandshake, InvalidURI) as exc:
        # ConnectionError is an OSError too: whether we got in decides which message fits.
        what = "lost the connection to" if chat.connected else "cannot connect to"
        _err(f"recalld: {what} {url}: {exc or type(exc).__name__}")
        return 1
    except RpcError as exc:  # a setup call (create, list) refused
        _err(f"recalld: {exc.message}")
        return 1


def _out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()  # deltas must show as they arrive, also when stdout is a pipe


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _one_line(text: str, width: int = 160) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _read_stdin(loop: asyncio.AbstractEventLoop, lines: asyncio.Queue[str | None]) -> None:
    """Pump stdin into ``lines`` from a thread; None marks end of input.

    A thread rather than ``connect_read_pipe`` because stdin may be a regular file, which epoll
    refuses; raw ``os.read`` so no buffer lock is held if the process exits mid-read.
    """

    def put(item: str | None) -> None:
        try:
            loop.call_soon_threadsafe(lines.put_nowait, item)
        except RuntimeError:  # the loop is closed: we are exiting anyway
            pass

    def pump() -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(sys.stdin.fileno(), 65536)
            except (OSError, ValueError):
                chunk = b""
            if not chunk:
                break
            *whole, buf = (buf + chunk).split(b"\n")
            for raw in whole:
                put(raw.decode(errors="replace").rstrip("\r"))
        if buf:
            put(buf.decode(errors="replace"))
        put(None)

    threading.Thread(target=pump, name="recalld-stdin", daemon=True).start()


class Chat:
    client: Client
    exit: asyncio.Future[int]  # set by Ctrl+C when there is no reply to abort
    closed: asyncio.Future[None]  # done when the socket closes, so a stream cannot wait forever

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.connected = False
        self.session_key = ""
        self.run_id: str | None = None  # the run whose reply is streaming, if any
        self.abort_sent = False
        self.tty = sys.stdin.isatty()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.attached: list[dict[str, Any]] = []  # /attach: sent with the next message

    async def main(self, url: str, token: str, ssl_context: ssl.SSLContext | None = None) -> int:
        loop = asyncio.get_running_loop()
        self.exit = loop.create_future()
        async with Client.connect(url, token, ssl_context=ssl_context) as client:
            self.connected = True
            self.client = client
            # Only now: until connected, Ctrl+C should simply interrupt (exit 130 via main()).
            loop.add_signal_handler(signal.SIGINT, self._on_sigint)
            self.closed = asyncio.ensure_future(client.ws.wait_closed())
            try:
                if self.args.list:
                    await self._list()
                    return 0
                if self.args.session:
                    if not await self._resume(self.args.session):
                        return 1
                else:
                    await self._new()
                repl = asyncio.create_task(self._repl(loop))
                await asyncio.wait({repl, self.exit}, return_when=asyncio.FIRST_COMPLETED)
                if repl.done():
                    return repl.result()
                repl.cancel()
                await asyncio.gather(repl, return_exceptions=True)
                _out("\n")
                return self.exit.result()
            finally:
                self.closed.cancel()

    def _on_sigint(self) -> None:
        if self.run_id is not None and not self.abort_sent:
            self.abort_sent = True
            _err("\n[aborting — Ctrl+C again to quit]")
            self._background(self.client.call("chat.abort", {"sessionKey": self.session_key,
                                                             "runId": self.run_id}))
        elif not self.exit.done():
            self.exit.set_result(130)

    def _background(self, coro: Awaitable[Any]) -> None:
        async def quietly() -> None:
            try:
                await coro
            except (RpcError, ConnectionError) as exc:
                _err(f"error: {getattr(exc, 'message', exc)}")

        task = asyncio.ensure_future(quietly())
        self._tasks.add(task)  # keep a reference so the task is not collected mid-flight
        task.add_done_callback(self._tasks.discard)

    async def _repl(self, loop: asyncio.AbstractEventLoop) -> int:
        lines: asyncio.Queue[str | None] = asyncio.Queue()
        _read_stdin(loop, lines)
        while True:
            if self.tty:
                _out("> ")
            line = await lines.get()
            if line is None or line.strip() == "/quit":
                return 0
            text = line.strip()
            if not text:
                continue
            try:
                if text.startswith("/"):
                    await self._command(text)
                else:
                    await self._send(line)
            except RpcError as exc:
                _err(f"error: {exc.message}")

    async def _command(self, text: str) -> None:
        name, _, rest = text.partition(" ")
        if name == "/new":
            await self._new()
        elif name == "/sessions":
            await self._list()
        elif name == "/search" and rest.strip():
            await self._search(rest.strip())
        elif name == "/regenerate" and not rest.strip():
            await self._resend("chat.regenerate", {})
        elif name == "/edit" and rest.strip():
            await self._resend("chat.edit", {"text": rest.strip()})
        elif name == "/continue" and not rest.strip():
            await self._resend("chat.continue", {})
        elif name == "/model":
            await self._model(rest.strip())
        elif name == "/summary" and not rest.strip():
            await self._summary()
        elif name == "/attach" and rest.strip():
            self._attach(rest.strip())
        elif name == "/help":
            _out(HELP + "\n")
        else:
            _err(f"unknown command {text!r}; /help lists them")

    async def _new(self) -> None:
        result = await self.client.call("sessions.create", {})
        self.session_key = result["sessionKey"]
        _out(f"session {self.session_key}\n")

    async def _resume(self, key: str) -> bool:
        try:
            session = await self.client.call("sessions.get", {"sessionKey": key})
            history = await self.client.call("sessions.history",
                                             {"sessionKey": key, "limit": HISTORY_SHOWN})
        except RpcError as exc:
            _err(f"recalld: unknown session {key}" if exc.code == -32002
                 else f"recalld: {exc.message}")
            return False
        self.session_key = key
        title = session.get("title") or "untitled"
        _out(f"session {key} ({title}, {session.get('messageCount', 0)} messages)\n")
        if session.get("summary"):
            _print_summary(session["summary"])
        for m in history.get("messages", []):
            _out(f"{m.get('role')}: {_one_line(m.get('content') or '', 300)}\n")
        return True

    async def _model(self, name: str) -> None:
        """``/model``: the session's model and what models.list offers; ``/model NAME`` switches."""
        if not self.session_key:
            _out("no session yet\n")
            return
        if name:
            session = await self.client.call("sessions.update",
                                             {"sessionKey": self.session_key, "model": name})
            _out(f"model: {session.get('model', name)}\n")
            return
        session = await self.client.call("sessions.get", {"sessionKey": self.session_key})
        offered = await self.client.call("models.list")
        current = session.get("model") or offered.get("default")
        _out(f"model: {current} (offered: {', '.join(offered.get('models', []))})\n")

    async def _summary(self) -> None:
        if not self.session_key:
            _out("no session yet\n")
            return
        session = await self.client.call("sessions.get", {"sessionKey": self.session_key})
        if session.get("summary"):
            _print_summary(session["summary"])
        else:
            _out("no summary yet: the whole chat still fits the model's window\n")

    async def _list(self) -> None:
        result = await self.client.call("sessions.list", {"limit": 20})
        sessions = result.get("sessions", [])
        if not sessions:
            _out("no sessions yet\n")
        for s in sessions:
            updated = str(s.get("updatedAt") or "")[:19].replace("T", " ")
            _out(f"{s['sessionKey']}  {updated:19}  {s.get('messageCount', 0):>4} msgs  "
                 f"{_one_line(s.get('title') or '(untitled)', 60)}\n")

    async def _search(self, query: str) -> None:
        try:
            result = await self.client.call("memory.search", {"query": query, "k": 5})
        except RpcError as exc:
            # -32601 until memory is wired in, or the index is not ready: say so and carry on.
            _err(f"search unavailable: {exc.message}")
            return
        hits = result.get("results", [])
        if not hits:
            _out(f"no matches for {query!r}\n")
        for i, hit in enumerate(hits, 1):
            date = str(hit.get("startTs") or "")[:10] or "undated"
            _out(f"{i}. {date}  session {hit.get('sessionKey')}  "
                 f"{_one_line(hit.get('content', ''))}\n")

    def _attach(self, path: str) -> None:
        """``/attach PATH``: read the file now; it goes with the next message (the gateway checks
        its type and size, and says which file it refuses)."""
        file = Path(path).expanduser()
        try:
            data = file.read_bytes()
        except OSError as exc:
            _err(f"error: cannot read {path}: {exc.strerror or exc}")
            return
        kind = mimetypes.guess_type(file.name)[0]
        # Source files mimetypes does not know (.rs, .go, …) go as text; the gateway
        # checks they are.
        kind = kind if kind and kind != "application/octet-stream" else "text/plain"
        self.attached.append({"name": file.name, "mediaType": kind,
                              "data": base64.b64encode(data).decode("ascii")})
        _out(f"attached {file.name} ({kind}, {len(data)} bytes); it goes with your next message\n")

    async def _send(self, message: str) -> None:
        files, self.attached = self.attached, []
        try:
            await self._resend("chat.send",
                               {"message": message, **({"attachments": files} if files else {})})
        except RpcError:
            self.attached = files + self.attached  # refused: kept for the next try (or /new)
            raise

    async def _resend(self, method: str, params: dict[str, Any]) -> None:
        """chat.send, chat.regenerate, chat.edit or chat.continue into this session, its
        reply streamed."""
        result = await self.client.call(method, {"sessionKey": self.session_key, **params})
        self.run_id, self.abort_sent = result["runId"], False
        try:
            await self._stream(result["runId"])
        finally:
            self.run_id = None

    async def _stream(self, run_id: str) -> None:
        wrote = False
        while True:
            get = asyncio.ensure_future(self.client.events.get())
            waiters: set[asyncio.Future[Any]] = {get, self.closed}
            try:
                done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                # Cancelled (Ctrl+C to quit) or the socket closed: don't leave a getter behind
                # to take an event nobody will read. A no-op once it has its event.
                get.cancel()
            if get not in done:
                raise ConnectionError("the gateway closed the connection")
            event = get.result()
            params = event.get("params") or {}
            if params.get("runId") != run_id:
                continue  # another run or session on this connection
            method = event.get("method")
            if method == "chat.delta":
                _out(params.get("delta", ""))
                wrote = True
            elif method == "chat.final":
                _out("\n")
                return
            elif method == "chat.error":
                if wrote:
                    _out("\n")
                _err(f"error: {(params.get('error') or {}).get('message', 'the model failed')}")
                return
            elif method == "chat.aborted":
                _out(("\n" if wrote else "") + "[aborted]\n")
                return


def _print_summary(summary: dict[str, Any]) -> None:
    _out(f"earlier in this chat ({summary.get('messages', 0)} messages): "
         f"{summary.get('text', '')}\n")
