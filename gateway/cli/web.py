"""``recalld open``: open the web client in the default browser, already signed in.

The browser never gets the token: its command line is readable by every local user (``ps``)
for as long as it runs. The CLI, holding the token, asks the running daemon for a one-time
sign-in code (``auth.code``: single use, valid ``auth.code_ttl_s`` seconds) and hands the
browser that, in the URL *fragment* (``http://127.0.0.1:18789/#code=…``): browsers never send a
fragment to the server, and the page removes it from the address bar and redeems it at once.
Without a display (an SSH session, a container) the URL is printed instead, for the user to
open where a browser is.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import urllib.parse
import webbrowser
from collections.abc import Callable, Mapping
from typing import Any

from gateway.cli.target import Target, connection_target
from gateway.client import Client, RpcError
from gateway.config import Config

__all__ = ["add_open_parser", "page_url"]


def add_open_parser(sub: Any, connection_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("open", help="open the web client in a browser, signed in")
    p.add_argument("--print", dest="print_only", action="store_true",
                   help="print the URL instead of opening a browser")
    connection_flags(p)
    p.set_defaults(run=_run)


def page_url(ws_url: str, code: str | None) -> str:
    """The page's http(s) URL for a gateway's ws(s) URL, with a sign-in code in the fragment."""
    parts = urllib.parse.urlsplit(ws_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    fragment = urllib.parse.urlencode({"code": code}) if code else ""
    return urllib.parse.urlunsplit((scheme, parts.netloc, "/", "", fragment))


def has_display(env: Mapping[str, str] = os.environ, platform: str = sys.platform) -> bool:
    """Whether a browser window could appear: always on macOS and Windows; on other systems
    only with an X11 or Wayland display."""
    if platform in ("darwin", "win32"):
        return True
    return bool(env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"))


async def _ask_code(found: Target) -> tuple[str, float]:
    async with Client.connect(found.url, found.token, ssl_context=found.ssl) as client:
        reply = await client.call("auth.code")
    return str(reply["code"]), float(reply["expiresInS"])


def _run(config: Config, args: argparse.Namespace) -> int:
    found = connection_target(config, args)
    code: str | None = None
    if not found.token:
        if config.auth.mode == "token":
            print("recalld: no token found (try `recalld token`); the page will ask for one",
                  file=sys.stderr)
    else:
        try:
            code, ttl_s = asyncio.run(_ask_code(found))
        except RpcError as exc:
            print(f"recalld: {found.url} gave no sign-in code: {exc.message}", file=sys.stderr)
            return 1
        except Exception as exc:  # OSError, or websockets' InvalidStatus for a refused token
            print(f"recalld: cannot get a sign-in code from {found.url}: {exc} "
                  "(is the daemon running? `recalld serve`)", file=sys.stderr)
            return 1
    target = page_url(found.url, code)
    if args.print_only or not has_display():
        print(target)
        if code:
            print(f"recalld: the link signs in once, within {ttl_s:g} s", file=sys.stderr)
        return 0
    if not webbrowser.open(target):
        print(target)
        print("recalld: could not start a browser; open the URL above", file=sys.stderr)
    return 0
