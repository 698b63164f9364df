"""`recalld open`: the page's URL with the token in the fragment, printed without a display and
handed to the default browser with one."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

from gateway.cli.web import has_display, page_url


def recalld(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("RECALLD_", "OPENAI_")) and k not in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER")}
    return subprocess.run([sys.executable, "-m", "gateway", *args], capture_output=True, text=True,
                          timeout=60, env={**base, **env}, stdin=subprocess.DEVNULL)


def test_without_a_display_the_url_is_printed(tmp_path: Path) -> None:
    """With no display, `recalld open` prints http://HOST:PORT/#token=… with the data dir's token and exits 0."""
    data = str(tmp_path / "data")
    token = recalld("--data-dir", data, "token", env={}).stdout.strip()
    out = recalld("--data-dir", data, "open", env={"RECALLD_SERVER_PORT": "18999"})
    assert out.returncode == 0, out.stderr
    url = urllib.parse.urlsplit(out.stdout.strip())
    assert (url.scheme, url.netloc, url.path, url.query) == ("http", "127.0.0.1:18999", "/", "")
    assert urllib.parse.parse_qs(url.fragment) == {"token": [token]}


def test_with_a_display_the_browser_gets_the_url(tmp_path: Path) -> None:
    """With a display, the URL goes to the default browser ($BROWSER here, a script that records
    it), not stdout; with --print it is printed and no browser starts."""
    seen = tmp_path / "opened.txt"
    fake_browser = tmp_path / "browser.sh"
    fake_browser.write_text(f'#!/bin/sh\nprintf "%s" "$1" > {seen}\n')
    fake_browser.chmod(0o755)
    env = {"DISPLAY": ":99", "BROWSER": str(fake_browser)}
    printed = recalld("--data-dir", str(tmp_path / "data"), "open", "--print", "--token", "tok-123", env=env)
    assert printed.stdout.strip() == "http://127.0.0.1:18789/#token=tok-123"
    time.sleep(0.5)
    assert not seen.exists()
    out = recalld("--data-dir", str(tmp_path / "data"), "open", "--token", "tok-123",
                  env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""
    deadline = time.monotonic() + 30
    while not seen.exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the browser command is started, not waited for
    assert seen.read_text() == "http://127.0.0.1:18789/#token=tok-123"


def test_page_urls_and_display_detection() -> None:
    """A wss:// gateway gives an https:// page, the token is URL-encoded, and a display is detected per platform."""
    assert page_url("wss://example.lan:8443/", "a+b/c") == "https://example.lan:8443/#token=a%2Bb%2Fc"
    assert page_url("ws://[::1]:18789/", None) == "http://[::1]:18789/"
    assert has_display({}, "linux") is False and has_display({"WAYLAND_DISPLAY": "w"}, "linux") is True
    assert has_display({}, "darwin") is True
