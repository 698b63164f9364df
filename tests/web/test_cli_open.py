"""`recalld open`: the page's URL with a one-time sign-in code in the fragment, never the token
(issue 22 N7: a browser's command line is visible to every local user), printed without a display
and handed to the default browser with one."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

from gateway.app import App
from gateway.cli.web import has_display, page_url
from gateway.client import Client
from tests.conftest import TOKEN


def recalld(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("RECALLD_", "OPENAI_"))
            and k not in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER")}
    return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True,
                          timeout=60, env={**base, **env}, stdin=subprocess.DEVNULL)


def code_of(url: str, app: App) -> str:
    parts = urllib.parse.urlsplit(url)
    assert (parts.scheme, parts.netloc, parts.path, parts.query) == \
        ("http", urllib.parse.urlsplit(app.url).netloc, "/", "")
    fragment = urllib.parse.parse_qs(parts.fragment)
    assert list(fragment) == ["code"], url
    return fragment["code"][0]


async def redeem(app: App, code: str) -> dict[str, Any]:
    async with Client.connect(app.url) as c:
        return await c.request("auth", {"code": code})


async def test_without_a_display_the_url_with_a_code_is_printed(app: App, tmp_path: Path) -> None:
    """With no display, `recalld open` prints http://HOST:PORT/#code=… (never the token) and exits
    0; the code signs in once as the token's user, and says on stderr that it works once."""
    env = {"RECALLD_URL": app.url, "RECALLD_TOKEN": TOKEN}
    out = await asyncio.to_thread(recalld, "--data-dir", str(tmp_path / "cli"), "open", env=env)
    assert out.returncode == 0, out.stderr
    assert TOKEN not in out.stdout and TOKEN not in out.stderr
    assert "once" in out.stderr
    code = code_of(out.stdout.strip(), app)
    first = await redeem(app, code)
    assert first["result"]["user"] == "default" and first["result"]["token"] == TOKEN
    assert (await redeem(app, code))["error"]["code"] == -32001


async def test_the_browser_command_line_never_holds_the_token(app: App, tmp_path: Path) -> None:
    """With a display, the default browser ($BROWSER here, a script that records its whole argv)
    gets the URL with a code and not the token, nothing is printed; with --print it is printed
    and no browser starts."""
    seen = tmp_path / "argv.txt"
    fake_browser = tmp_path / "browser.sh"
    fake_browser.write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$0" "$@" > {seen}.tmp && mv {seen}.tmp {seen}\n')
    fake_browser.chmod(0o755)
    env = {"DISPLAY": ":99", "BROWSER": str(fake_browser), "RECALLD_URL": app.url,
           "RECALLD_TOKEN": TOKEN}
    data = str(tmp_path / "cli")
    printed = await asyncio.to_thread(recalld, "--data-dir", data, "open", "--print", env=env)
    assert printed.returncode == 0, printed.stderr
    code_of(printed.stdout.strip(), app)
    assert TOKEN not in printed.stdout
    await asyncio.sleep(0.5)
    assert not seen.exists()
    out = await asyncio.to_thread(recalld, "--data-dir", data, "open", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""
    async with asyncio.timeout(30):
        while not seen.exists():
            await asyncio.sleep(0.05)  # the browser command is started, not waited for
    argv = seen.read_text().splitlines()
    assert not any(TOKEN in arg for arg in argv), argv
    code = code_of(argv[-1], app)
    assert (await redeem(app, code))["result"]["user"] == "default"


def test_without_a_daemon_it_fails_and_opens_nothing(tmp_path: Path) -> None:
    """With no daemon to issue a code, `recalld open` says so on stderr, exits 1, and prints no
    URL (it never falls back to the token)."""
    out = recalld("--data-dir", str(tmp_path / "data"), "open", "--print",
                  env={"RECALLD_URL": "ws://127.0.0.1:9/", "RECALLD_TOKEN": TOKEN})
    assert out.returncode == 1
    assert out.stdout == "" and TOKEN not in out.stderr
    assert "sign-in code" in out.stderr and "recalld serve" in out.stderr


def test_page_urls_and_display_detection() -> None:
    """A wss:// gateway gives an https:// page, the code is URL-encoded, and a display is detected
    per platform."""
    assert (page_url("wss://example.lan:8443/", "a+b/c")
            == "https://example.lan:8443/#code=a%2Bb%2Fc")
    assert page_url("ws://[::1]:18789/", None) == "http://[::1]:18789/"
    assert (has_display({}, "linux") is False
            and has_display({"WAYLAND_DISPLAY": "w"}, "linux") is True)
    assert has_display({}, "darwin") is True
