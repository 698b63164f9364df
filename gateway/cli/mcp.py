"""``recalld mcp``: serve recalld's memory to an MCP client on stdio (docs/mcp.md).

It finds the daemon like ``recalld call`` (``--url``, ``--token-file``, ``RECALLD_URL`` /
``RECALLD_TOKEN``, ``daemon.json``), again at every tool call, so a daemon restarted on
another port or with a rotated token is followed; a daemon that is not running is a failed
tool call the model reads, not a server that will not start.

Its start is what a client waits for before its first ``initialize``: it imports the config,
the client and the MCP SDK, never the daemon's own stack (``gateway.app``, ``gateway.chat``
and the ``openai`` SDK; tests/mcp/test_stdio_start.py checks it).
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.cli.target import TargetError, connection_target
from gateway.config import Config

__all__ = ["add_mcp_parser", "install_mcp_command"]


def add_mcp_parser(sub: Any, flags: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("mcp", help="serve the memory to MCP clients "
                                   "(Claude Desktop, Cursor, VS Code) on stdio")
    flags(p)
    p.set_defaults(run=_run)


def install_mcp_command() -> str:
    """The exact command that adds the ``mcp`` extra to the environment running this command:
    its own interpreter's pip (``make serve``'s .venv holds no pip on PATH), in the checkout
    when recalld runs from one (an editable install), else from the package index."""
    python = shlex.quote(sys.executable)
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "gateway").is_dir():
        return f"cd {shlex.quote(str(checkout))} && {python} -m pip install -e '.[mcp]'"
    return f"{python} -m pip install 'recalld[mcp]'"


def _run(config: Config, args: argparse.Namespace) -> int:
    from gateway.mcp import DaemonLink, DaemonUnreachable, Route, SdkMissing, require_sdk

    try:
        require_sdk()
    except SdkMissing as exc:
        print(f"recalld: {exc}; run: {install_mcp_command()}", file=sys.stderr)
        return 2
    from gateway.logs import configure_logging
    from gateway.mcp.stdio import serve_stdio

    connection_target(config, args)  # a bad --token-file or --cacert fails now, not at each call
    # stdout is the protocol's: every log line goes to stderr, which MCP clients show as the log.
    configure_logging(config.log.level, config.log.format, stream=sys.stderr)

    def route() -> Route:
        try:
            target = connection_target(config, args)
        except TargetError as exc:  # the token file removed since the start, for one
            raise DaemonUnreachable(str(exc)) from None
        return Route(target.url, target.token, target.ssl)

    asyncio.run(serve_stdio(DaemonLink(route), version=_package_version()))
    return 0


def _package_version() -> str:
    # gateway.app.package_version's answer, without importing the daemon's composition root:
    # that pulls in the chat stack (the openai SDK alone is about half a second), which a
    # client that spawns `recalld mcp` would wait for at every start (issue 34).
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("recalld")
    except PackageNotFoundError:
        return "0.0.0"
