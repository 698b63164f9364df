"""The web client shows a session's conversation summary as a collapsed "Earlier in this chat"
block above its messages, in a real Chromium against the real gateway."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("playwright.async_api",
                    reason="playwright is not installed (pip install -e '.[dev]')")

from playwright.async_api import Browser, expect  # noqa: E402

from gateway.app import App
from tests.web.conftest import PageErrors, open_signed_in


async def test_summary_shows_as_a_collapsed_block(browser: Browser, web_app: App) -> None:
    """A session with a summary opens with "Earlier in this chat" collapsed above the messages,
    its text shown once expanded (as text, not markup); a session without one shows no block."""
    store = web_app.store
    plain = await asyncio.to_thread(store.create, "default", title="Plain")
    await asyncio.to_thread(store.append_message, "default", plain.session_key, role="user",
                            content="hi")
    summarised = await asyncio.to_thread(store.create, "default", title="Long talk")
    first = await asyncio.to_thread(store.append_message, "default", summarised.session_key,
                                    role="user", content="My locker code is 4471.")
    await asyncio.to_thread(store.append_message, "default", summarised.session_key,
                            role="assistant", content="Noted.")
    await asyncio.to_thread(store.append_summary, "default", summarised.session_key,
                            content="The user's locker code is 4471. <b>bold</b>", through=first.id,
                            messages=1)
    page = await open_signed_in(browser, web_app)
    errors = PageErrors(page)
    await page.click(f"#session-list .session[data-key='{summarised.session_key}']")
    block = page.locator("#earlier")
    await expect(block).to_be_visible()
    await expect(block.locator("summary")).to_have_text("Earlier in this chat")
    assert await block.get_attribute("open") is None  # collapsed
    await expect(page.locator("#earlier-text")).to_be_hidden()
    await block.locator("summary").click()
    await expect(page.locator("#earlier-text")).to_have_text(
        "The user's locker code is 4471. <b>bold</b>")
    assert await page.locator("#earlier b").count() == 0
    box_summary = await block.bounding_box()
    box_messages = await page.locator("#messages li").first.bounding_box()
    assert (box_summary is not None and box_messages is not None
            and box_summary["y"] < box_messages["y"])
    await page.click(f"#session-list .session[data-key='{plain.session_key}']")
    await expect(block).to_be_hidden()
    assert errors.items == []
