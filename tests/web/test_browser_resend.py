"""The web client's protocol features from issue 23 in a real Chromium: the Recalled block read
back from history after a reload, Regenerate on the last reply and Edit on the last user message."""

from __future__ import annotations

import pytest

pytest.importorskip("playwright.async_api",
                    reason="playwright is not installed (pip install -e '.[dev]')")

from playwright.async_api import Browser, expect  # noqa: E402

from gateway.app import App
from gateway.client import Client
from tests.conftest import TOKEN
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.web.conftest import (
    PageErrors,
    new_session,
    open_session_key,
    open_signed_in,
    send,
    wait_indexed,
)


async def _history(app: App, key: str) -> list[str]:
    async with Client.connect(app.url, TOKEN) as c:
        return [m["content"] for m in
                (await c.call("sessions.history", {"sessionKey": key}))["messages"]]


async def test_recalled_block_is_there_after_a_reload(browser: Browser, web_app: App) -> None:
    """The Recalled block under a reply comes back from the transcript when the page reloads, with
    the excerpt and its source session's title."""
    page = await open_signed_in(browser, web_app)
    errors = PageErrors(page)
    await new_session(page)
    await send(page, "My favourite programming language is Rust, for its careful compiler.")
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(1)
    await wait_indexed(web_app, "favourite programming language")
    await new_session(page)
    await send(page, "Which programming language do I like?")
    chips = page.locator(".msg.assistant .recalled .chip")
    await expect(chips.first).to_contain_text("careful compiler")
    await page.reload()
    await page.wait_for_selector("#conn-state[data-state=open]")
    recalled = page.locator(".msg.assistant .recalled")
    await expect(recalled.get_by_role("heading", name="Recalled")).to_be_visible()
    await expect(recalled.locator(".chip").first).to_contain_text("careful compiler")
    assert errors.items == []


async def test_regenerate_replaces_the_last_reply(browser: Browser, web_app: App,
                                                  fake_openai: FakeOpenAI) -> None:
    """"Regenerate" sits on the last reply only; it streams a new reply in its place, and the
    transcript's shown history holds only the new one."""
    page = await open_signed_in(browser, web_app)
    errors = PageErrors(page)
    await new_session(page)
    await send(page, "first")
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(1)
    await send(page, "second")
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(2)
    key = await open_session_key(page)
    regenerate = page.get_by_role("button", name="Regenerate")
    await expect(regenerate).to_have_count(1)
    await expect(page.locator(".msg.assistant").last.get_by_role(
        "button", name="Regenerate")).to_be_visible()
    fake_openai.script(Behaviour(reply="A fresh answer."))
    await regenerate.click()
    await expect(page.locator(".msg.assistant").last).to_contain_text("A fresh answer.")
    await expect(page.locator(".msg.assistant")).to_have_count(2)
    await expect(page.get_by_text("Echo: second")).to_have_count(0)
    assert await _history(web_app, key) == ["first", "Echo: first", "second", "A fresh answer."]
    await page.reload()
    await page.wait_for_selector("#conn-state[data-state=open]")
    await expect(page.locator(".msg.assistant").last).to_contain_text("A fresh answer.")
    await expect(page.get_by_text("Echo: second")).to_have_count(0)
    assert errors.items == []


async def test_edit_resends_the_last_message(browser: Browser, web_app: App) -> None:
    """"Edit" on the last user message opens a one-message form; Enter sends the new text, whose
    reply replaces the old message and its reply; Esc cancels."""
    page = await open_signed_in(browser, web_app)
    errors = PageErrors(page)
    await new_session(page)
    await send(page, "keep this")
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(1)
    await send(page, "a tpyo")
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(2)
    key = await open_session_key(page)
    edit = page.locator(".msg.user").last.get_by_role("button", name="Edit", exact=True)
    # any user message
    await expect(page.get_by_role("button", name="Edit", exact=True)).to_have_count(2)
    await edit.click()
    box = page.get_by_role("textbox", name="Edit message")
    await expect(box).to_have_value("a tpyo")
    await box.press("Escape")
    await expect(box).to_have_count(0)
    await expect(page.locator(".msg.user").last.locator(".body")).to_have_text("a tpyo")
    await edit.click()
    await page.get_by_role("textbox", name="Edit message").fill("no typo")
    await page.get_by_role("textbox", name="Edit message").press("Enter")
    await expect(page.locator(".msg.assistant").last).to_contain_text("Echo: no typo")
    await expect(page.get_by_text("a tpyo")).to_have_count(0)
    await expect(page.locator(".msg.user")).to_have_count(2)
    assert (await _history(web_app, key)
            == ["keep this", "Echo: keep this", "no typo", "Echo: no typo"])
    assert errors.items == []
