"""``recalld``: the command line. Every mistake becomes one message here, never a traceback.

Command groups live in their own modules (``gateway.cli.chat``, ``gateway.cli.memory``); this
one parses, loads the config and runs ``serve``, ``token`` and ``call``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import orjson

from gateway.cli.chat import add_chat_parser
from gateway.cli.importer import add_import_parser
from gateway.cli.mcp import add_mcp_parser
from gateway.cli.memory import add_memory_parser
from gateway.cli.target import TargetError, add_connection_flags, connection_target
from gateway.cli.token import add_token_subcommands, run_token_command
from gateway.cli.web import add_open_parser
from gateway.config import Config, ConfigError, is_loopback, load
from gateway.private import set_private_umask
from gateway.storage import StorageUnavailable
from sessions import SchemaTooNew

__all__ = ["main"]


def _global_flags(p: argparse.ArgumentParser, *, top: bool) -> None:
    # The same flags on the top parser and on every command, so `recalld serve --data-dir D`
    # works like `recalld --data-dir D serve`. On commands the default is SUPPRESS: a flag not
    # given there must not overwrite one given before the command.
    default = None if top else argparse.SUPPRESS
    p.add_argument("--config", type=Path, default=default,
                   help="config file (default ./config.toml, then <data dir>/config.toml)")
    p.add_argument("--data-dir", type=Path, default=default,
                   help="data directory (default ~/.recalld or $RECALLD_HOME)")


def _base_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recalld",
                                     description="AI chat gateway with a long memory")
    _global_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True)

    def command_flags(p: argparse.ArgumentParser) -> None:
        _global_flags(p, top=False)

    serve = sub.add_parser("serve", help="run the daemon in the foreground")
    command_flags(serve)
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 18789; 0 picks a free one)")

    token = sub.add_parser("token", help="show or rotate the generated token; add, list or revoke "
                                         "client tokens")
    command_flags(token)
    token.add_argument("--rotate", action="store_true", help="replace the generated token")
    add_token_subcommands(token, command_flags)

    call = sub.add_parser("call", help="send one request and print the result as JSON")
    command_flags(call)
    call.add_argument("method")
    call.add_argument("params", nargs="?", default=None, help="params as a JSON object")
    add_connection_flags(call)

    def chat_flags(p: argparse.ArgumentParser) -> None:
        command_flags(p)
        add_connection_flags(p)

    add_chat_parser(sub, chat_flags)
    add_memory_parser(sub, command_flags)
    add_open_parser(sub, chat_flags)
    add_import_parser(sub, command_flags)
    add_mcp_parser(sub, chat_flags)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _base_parser().parse_args(argv)
    # Before any file is made (the token, the index): private, like the daemon's (gateway.private).
    set_private_umask()
    overrides: dict[str, dict[str, Any]] = {}
    if args.command == "serve":
        overrides["server"] = {"host": args.host, "port": args.port}
    try:
        config = load(args.config, overrides=overrides, data_dir=args.data_dir)
    except ConfigError as exc:
        print(f"recalld: {exc}", file=sys.stderr)
        return 2
    handler = {"serve": _serve, "token": _token, "call": _call}.get(args.command)
    if handler is None:
        handler = args.run  # set by the command group modules
    try:
        return int(handler(config, args))
    except TargetError as exc:
        print(f"recalld: {exc}", file=sys.stderr)
        return 2
    except SchemaTooNew as exc:  # any command that opens a database a newer recalld migrated
        print(f"recalld: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader of our output went away (`recalld call … | head -3`): not an error of ours.
        # Quiet, with the status `cat` has then; stdout points at /dev/null so that the
        # interpreter's own flush at exit does not complain again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _startup_facts(config: Config, url: str, *, chat_model: bool) -> tuple[str, str]:
    """The web client's address and what ``chat.send`` will do, as the start-up line says them."""
    from gateway.cli.web import page_url

    if not chat_model:
        return page_url(url, None), ("no model configured (set [llm] base_url or api_key in "
                                     "config.toml and restart)")
    where = config.llm.base_url or "OpenAI"
    return page_url(url, None), f"model {config.llm.model} at {where}"


def _serve(config: Config, args: argparse.Namespace) -> int:
    import structlog

    from gateway.app import PLAINTEXT_WARNING, start_app
    from gateway.logs import configure_logging

    configure_logging(config.log.level, config.log.format)
    startup_log = structlog.get_logger("recalld.app")

    async def run() -> int:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        interrupts = 0

        def on_signal(signum: int) -> None:
            nonlocal interrupts
            interrupts += 1
            if interrupts > 1 and signum == signal.SIGINT:
                # A second Ctrl+C means "now": skip the graceful drain.
                os._exit(130)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        app = await start_app(config)
        web, chat = _startup_facts(config, app.url, chat_model=app.runs.model is not None)
        # The log line names the web client and the chat model too, for a daemon run under a
        # service manager (JSON logs); on a terminal, one readable line says it.
        startup_log.info("recalld.ready", url=app.url, web=web, chat=chat)
        if sys.stderr.isatty():
            token = f"; token: {config.data_dir / 'token'}" if config.auth.mode == "token" else ""
            print(f"recalld listening on {app.url} — web client: {web} — chat: {chat}{token}",
                  file=sys.stderr)
        if (sys.stderr.isatty() and app.url.startswith("ws://")
                and not is_loopback(config.server.host)):
            # The log line says it too; on a terminal it should not scroll by unnoticed.
            bar = "!" * 78
            print(f"{bar}\n!! WARNING: {PLAINTEXT_WARNING}.\n!! Use TLS ([tls] cert/key) or an SSH "
                  f"tunnel: see docs/remote.md.\n{bar}", file=sys.stderr)
        await stop.wait()
        await app.close()
        return 0

    try:
        return asyncio.run(run())
    except (OSError, StorageUnavailable) as exc:
        print(f"recalld: cannot start: {exc}", file=sys.stderr)
        return 1


def _token(config: Config, args: argparse.Namespace) -> int:
    from gateway.auth import load_or_create_token, rotate_token, token_path

    if getattr(args, "token_command", None):  # add, list, revoke: client tokens (gateway.cli.token)
        return run_token_command(config, args)
    if config.auth.token or config.auth.users:
        print("recalld: tokens come from the config or RECALLD_TOKEN here; "
              "the generated token file is not used", file=sys.stderr)
        return 1
    if args.rotate:
        token = rotate_token(config.data_dir)
        print(f"rotated; restart the daemon to apply. new token in {token_path(config.data_dir)}",
              file=sys.stderr)
    else:
        token, _ = load_or_create_token(config.data_dir)
    print(token)
    return 0


def _call(config: Config, args: argparse.Namespace) -> int:
    from gateway.client import Client, RpcError

    params = None
    if args.params is not None:
        try:
            params = orjson.loads(args.params)
        except orjson.JSONDecodeError as exc:
            print(f"recalld: params are not valid JSON: {exc}", file=sys.stderr)
            return 2
    target = connection_target(config, args)
    url = target.url

    async def run() -> tuple[int, Any]:
        async with Client.connect(url, target.token, ssl_context=target.ssl) as client:
            try:
                return 0, await client.call(args.method, params)
            except RpcError as exc:
                return 1, {"error": {"code": exc.code, "message": exc.message, "data": exc.data}}

    try:
        code, answer = asyncio.run(run())
    except (OSError, ConnectionError) as exc:
        print(f"recalld: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # websockets' InvalidStatus for a refused token, for one
        print(f"recalld: {exc}", file=sys.stderr)
        return 1
    # Printed once the connection is closed: a closed stdout (main) is not an unreachable daemon.
    print(orjson.dumps(answer, option=orjson.OPT_INDENT_2).decode(), flush=True)
    return code
