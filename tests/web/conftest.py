"""Browser fixtures: Debian's chromium driven by Playwright against the real gateway.

No browser is ever downloaded: the tests use the ``chromium`` on PATH (``apt-get install
chromium``; ``.ci/run`` installs it) and skip, with one line saying why, when it or the
``playwright`` package is missing.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gateway.app import App
from gateway.client import Client
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.fake_openai import FakeOpenAI

try:
    from playwright.async_api import Browser, Page, async_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    async_playwright = None  # type: ignore[assignment]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _skip_reason() -> str | None:
    if async_playwright is None:
        return "playwright is not installed (pip install -e '.[dev]')"
    if CHROMIUM is None:
        return "no chromium on PATH (apt-get install chromium)"
    return None


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield b
        finally:
            await b.close()


@pytest.fixture
async def web_app(config_factory: Callable[..., Config],
                  fake_openai: FakeOpenAI) -> AsyncIterator[App]:
    """The gateway with the loopback model, memory (its embeddings from the same fake) and
    model-written titles."""
    cfg = config_factory(
        llm={"base_url": fake_openai.base_url, "api_key": "sk-test", "model": "fake-model",
             "timeout_s": 10.0, "max_retries": 0},
        memory={"embedder": "openai", "debounce_ms": 20},
        chat={"auto_title": True},  # as a user gets it: the model names
                                    # a session after its first reply
    )
    async with running(cfg) as app:
        yield app


def page_url(app: App) -> str:
    return f"http://127.0.0.1:{app.server.port}/"


class PageErrors:
    """Uncaught exceptions and console errors of a page; a test asserts there were none."""

    def __init__(self, page: Page) -> None:
        self.items: list[str] = []
        page.on("pageerror", lambda exc: self.items.append(f"pageerror: {exc}"))
        page.on("console", lambda msg: (self.items.append(f"console: {msg.text}")
                                        if msg.type == "error" else None))


async def open_signed_in(browser: Browser, app: App, *, context: Any = None) -> Page:
    """A new page that signs in through a `#token=` link, in its own context unless given."""
    ctx = context or await browser.new_context()
    page = await ctx.new_page()
    await page.goto(page_url(app) + f"#token={TOKEN}")
    await page.wait_for_selector("#app:not([hidden])")
    await page.wait_for_selector("#conn-state[data-state=open]")
    return page


async def new_session(page: Page) -> None:
    """Click "New chat": an empty chat opens, ready to type in; its session is created by the
    first send."""
    await page.click("#new-session")
    await page.wait_for_selector("#welcome:not([hidden])")
    await page.wait_for_selector("#session-list .session[aria-current=true]", state="detached")


async def open_session_key(page: Page) -> str:
    """The key of the session open in the page (after a draft's first send, once it is created)."""
    current = page.locator("#session-list .session[aria-current=true]")
    await current.wait_for()
    return str(await current.get_attribute("data-key"))


async def send(page: Page, text: str) -> None:
    await page.fill("#message-input", text)
    await page.press("#message-input", "Enter")


async def wait_indexed(app: App, query: str) -> dict[str, Any]:
    """Wait until memory.search finds ``query`` (the indexer is debounced); returns the
    first hit."""
    async with Client.connect(app.url, TOKEN) as c:
        async with asyncio.timeout(15):
            while True:
                result = await c.call("memory.search", {"query": query})
                if result["results"]:
                    return dict(result["results"][0])
                await asyncio.sleep(0.05)
