"""Import chats from the web client, in a real Chromium against the real gateway: a ChatGPT
export picked in the account menu's dialog becomes sessions in the sidebar, once."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

pytest.importorskip("playwright.async_api",
                    reason="playwright is not installed (pip install -e '.[dev]')")

from playwright.async_api import Browser, FilePayload, Page, expect  # noqa: E402

from gateway.app import App
from gateway.client import Client
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.gateway.test_cli_import import chatgpt_export
from tests.web.conftest import PageErrors, open_signed_in
from tests.web.test_browser_audit import serious


def export_file(conversations: list[dict[str, Any]],
                name: str = "conversations.json") -> FilePayload:
    return {"name": name, "mimeType": "application/json",
            "buffer": json.dumps(conversations).encode()}


async def pick(page: Page, file: FilePayload) -> None:
    """Account menu → Import chats…, then the file in its dialog."""
    await page.get_by_role("button", name="Account: default").click()
    await page.get_by_role("button", name="Import chats…").click()
    await expect(page.locator("#import-dialog")).to_be_visible()
    await page.set_input_files("#import-file", file)


async def test_a_chatgpt_export_imported_in_the_page_shows_in_the_sidebar(browser: Browser,
                                                                          app: App) -> None:
    """The dialog says what was imported (and passes axe's serious rules), the conversations
    appear in the sidebar at once (no reload) and open with their messages; the same file again
    imports nothing."""
    # bypass_csp: for axe's script tag only (tests/web/test_browser_audit.py says why).
    page = await open_signed_in(browser, app, context=await browser.new_context(bypass_csp=True))
    errors = PageErrors(page)
    await pick(page, export_file(chatgpt_export()))
    status = page.locator("#import-status")
    await expect(status).to_have_text("Imported 2 conversations, 5 messages.")
    assert await serious(page, "import dialog") == []
    sidebar = page.locator("#session-list .session")
    await expect(sidebar.filter(has_text="Sourdough")).to_have_count(1)
    await expect(sidebar.filter(has_text="Bike")).to_have_count(1)
    await page.get_by_role("button", name="Close").click()
    await sidebar.filter(has_text="Sourdough").click()
    await expect(page.locator("li.msg.user").first).to_contain_text("my starter is called Bubbles")
    await expect(page.locator("li.msg.assistant")).to_contain_text("Bubbles is a fine name")
    await pick(page, export_file(chatgpt_export()))
    await expect(status).to_have_text("Nothing new: all 2 conversations were already imported.")
    await expect(sidebar.filter(has_text="Sourdough")).to_have_count(1)
    assert errors.items == []


@pytest.fixture
async def small_frames(config_factory: Callable[..., Config]) -> AsyncIterator[App]:
    """A gateway taking frames of at most 8 KiB: an export of a few dozen conversations
    needs parts."""
    async with running(config_factory(server={"max_size": 8192})) as app:
        yield app


def _conversation(n: int) -> dict[str, Any]:
    text = f"conversation number {n} talks about topic {n} at some length. " * 8
    return {"title": f"Topic {n}", "id": f"c-{n}", "create_time": 1_700_000_000 + n,
            "current_node": "b",
            "mapping": {"a": {"id": "a", "parent": None, "children": ["b"], "message": {
                "author": {"role": "user"}, "content": {"content_type": "text", "parts": [text]},
                "create_time": 1_700_000_000 + n}},
                "b": {"id": "b", "parent": "a", "children": [], "message": {
                    "author": {"role": "assistant"},
                    "content": {"content_type": "text", "parts": ["noted"]},
                    "create_time": 1_700_000_001 + n}}}}


async def test_an_export_larger_than_a_frame_goes_in_parts_and_a_bad_one_imports_nothing(
    browser: Browser, small_frames: App
) -> None:
    """40 conversations, several frames' worth, import whole in parts; an export whose last
    conversation is malformed imports nothing (every part is checked first) and names it by its
    place in the file; a zip is refused with what to do."""
    page = await open_signed_in(browser, small_frames)
    errors = PageErrors(page)
    bad = [_conversation(n) for n in range(100, 140)] + [{"title": "broken", "id": "c-x"}]
    await pick(page, export_file(bad, "broken.json"))
    problem = page.locator("#import-error")
    await expect(problem).to_have_text("broken.json: conversation 41: no 'mapping' object (not a "
                                       "ChatGPT conversation); nothing was imported.")
    async with Client.connect(small_frames.url, TOKEN) as c:
        assert (await c.call("sessions.list"))["sessions"] == []
    await page.set_input_files("#import-file", {"name": "export.zip", "mimeType": "application/zip",
                                                "buffer": b"PK\x03\x04rest of a zip"})
    await expect(problem).to_contain_text("Unzip it")
    good = [_conversation(n) for n in range(40)]
    assert len(json.dumps(good)) > 4 * 8192
    await page.set_input_files("#import-file", export_file(good))
    await expect(page.locator("#import-status")).to_have_text(
        "Imported 40 conversations, 80 messages.")
    await expect(problem).to_have_text("")
    async with Client.connect(small_frames.url, TOKEN) as c:
        listed = (await c.call("sessions.list", {"limit": 100}))["sessions"]
    assert sorted(s["title"] for s in listed) == sorted(f"Topic {n}" for n in range(40))
    await expect(
        page.locator("#session-list .session").filter(has_text="Topic 39")).to_have_count(1)
    assert errors.items == []
