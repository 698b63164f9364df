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
from gateway.cli.memory import add_memory_parser
from gateway.cli.target import connection_target
from gateway.config import Config, ConfigError, load

__all__ = ["main"]


def _base_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recalld", description="AI chat gateway with a long memory")
    parser.add_argument("--config", type=Path, help="config file (default ./config.toml, then <data dir>/config.toml)")
    parser.add_argument("--data-dir", type=Path, help="data directory (default ~/.recalld or $RECALLD_HOME)")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the daemon in the foreground")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 18789; 0 picks a free one)")

    token = sub.add_parser("token", help="show or rotate the generated token")
    token.add_argument("--rotate", action="store_true", help="replace the generated token")

    call = sub.add_parser("call", help="send one request and print the result as JSON")
    call.add_argument("method")
    call.add_argument("params", nargs="?", default=None, help="params as a JSON object")
    _connection_flags(call)

    add_chat_parser(sub, _connection_flags)
    add_memory_parser(sub)
    add_import_parser(sub)
    return parser


def _connection_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="gateway URL (default from config: ws://127.0.0.1:18789/)")
    p.add_argument("--token", help="token (default $RECALLD_TOKEN, then the data dir's token file)")


def main(argv: list[str] | None = None) -> int:
    args = _base_parser().parse_args(argv)
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
    except KeyboardInterrupt:
        return 130


def _serve(config: Config, args: argparse.Namespace) -> int:
    from gateway.app import start_app
    from gateway.logs import configure_logging

    configure_logging(config.log.level, config.log.format)

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
        if sys.stderr.isatty() and config.auth.mode == "token":
            print(f"recalld listening on {app.url} (token: {config.data_dir / 'token'})", file=sys.stderr)
        await stop.wait()
        await app.close()
        return 0

    try:
        return asyncio.run(run())
    except OSError as exc:
        print(f"recalld: cannot start: {exc}", file=sys.stderr)
        return 1


def _token(config: Config, args: argparse.Namespace) -> int:
    from gateway.auth import load_or_create_token, rotate_token, token_path

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
    url, token = connection_target(config, args)

    async def run() -> int:
        async with Client.connect(url, token) as client:
            try:
                result = await client.call(args.method, params)
            except RpcError as exc:
                print(orjson.dumps({"error": {"code": exc.code, "message": exc.message,
                                              "data": exc.data}}, option=orjson.OPT_INDENT_2).decode())
                return 1
        print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
        return 0

    try:
        return asyncio.run(run())
    except (OSError, ConnectionError) as exc:
        print(f"recalld: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # websockets' InvalidStatus for a refused token, for one
        print(f"recalld: {exc}", file=sys.stderr)
        return 1
