"""The web client's Facts panel in a real Chromium: list (paged), add, edit, delete, keyboard
use, hostile text shown as text, and a reply that saves a fact refreshing the list."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

pytest.importorskip("playwright.async_api",
                    reason="playwright is not installed (pip install -e '.[dev]')")

from playwright.async_api import Browser, Dialog, expect  # noqa: E402

from gateway.app import App
from gateway.client import Client
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.web.conftest import PageErrors, new_session, open_signed_in, send


@pytest.fixture
async def facts_app(config_factory: Callable[..., Config],
                    fake_openai: FakeOpenAI) -> AsyncIterator[App]:
    """The gateway with the loopback model and no embedder, so only identical facts merge."""
    cfg = config_factory(
        llm={"base_url": fake_openai.base_url, "api_key": "sk-test", "model": "fake-model",
             "timeout_s": 10.0, "max_retries": 0},
        memory={"embedder": "none", "debounce_ms": 20},
    )
    async with running(cfg) as app:
        yield app


async def active_texts(app: App) -> list[str]:
    async with Client.connect(app.url, TOKEN) as c:
        return [f["text"] for f in (await c.call("memory.facts.list", {"limit": 200}))["facts"]]


async def test_facts_panel_lists_adds_edits_and_deletes(browser: Browser, facts_app: App) -> None:
    """Opened from the keyboard, the panel pages through the user's facts, adds one, edits one
    (a new version replaces it) and deletes one, each change reaching memory.facts.list; a
    fact's markup-like text is shown as literal text."""
    hostile = '<img src=x onerror="window.pwned=1"> is my motto'
    async with Client.connect(facts_app.url, TOKEN) as c:
        for i in range(54):
            await c.call("memory.facts.add", {"text": f"Seeded fact number {i}"})
        await c.call("memory.facts.add", {"text": hostile})
    page = await open_signed_in(browser, facts_app)
    errors = PageErrors(page)
    await page.locator("#open-facts").focus()
    await page.keyboard.press("Enter")
    panel = page.get_by_role("complementary", name="Remembered facts")
    await expect(panel).to_be_visible()
    await expect(page.get_by_label("New fact")).to_be_focused()
    items = panel.locator(".fact")
    await expect(items).to_have_count(50)
    await expect(items.first.locator(".fact-text")).to_have_text(hostile)
    assert await panel.locator("img").count() == 0 and await page.evaluate("window.pwned") is None
    await panel.get_by_role("button", name="Load more").click()
    await expect(items).to_have_count(55)
    await expect(panel.get_by_role("button", name="Load more")).to_be_hidden()

    await page.get_by_label("New fact").fill("I am vegetarian")
    await page.keyboard.press("Tab")
    await page.keyboard.press("Enter")  # "Add fact", reached by keyboard
    await expect(items.first.locator(".fact-text")).to_have_text("I am vegetarian")
    await expect(page.locator("#facts-status")).to_have_text("Remembered.")

    await panel.get_by_role("button", name="Edit fact: I am vegetarian").click()
    field = panel.get_by_label("Fact text")
    await expect(field).to_be_focused()
    await field.fill("I am vegan")
    await panel.get_by_role("button", name="Save").click()
    await expect(items.first.locator(".fact-text")).to_have_text("I am vegan")
    await expect(panel.get_by_text("I am vegetarian")).to_have_count(0)

    async def accept(dialog: Dialog) -> None:
        await dialog.accept()

    page.once("dialog", accept)
    await panel.get_by_role("button", name="Delete fact: Seeded fact number 53").click()
    await expect(panel.get_by_text("Seeded fact number 53", exact=True)).to_have_count(0)
    texts = await active_texts(facts_app)
    assert ("I am vegan" in texts and "I am vegetarian" not in texts
            and "Seeded fact number 53" not in texts)
    assert len(texts) == 55
    await page.keyboard.press("Escape")
    await expect(panel).to_be_hidden()
    assert errors.items == []


async def test_escape_cancels_an_edit_and_a_saved_fact_refreshes_the_list(
    browser: Browser, facts_app: App, fake_openai: FakeOpenAI
) -> None:
    """Esc in an edit restores the fact unchanged; a reply whose remember call saves a fact
    makes the open panel show it; the search panel and the facts panel replace each other."""
    page = await open_signed_in(browser, facts_app)
    await new_session(page)
    await page.get_by_role("button", name="Facts").click()
    panel = page.get_by_role("complementary", name="Remembered facts")
    await expect(panel.locator(".hint").last).to_have_text("Nothing remembered yet.")
    fake_openai.script(Behaviour(reply="", tool_calls=[("remember", {"text": "I live in Oslo"})]),
                       Behaviour(reply="Noted."))
    await send(page, "I live in Oslo.")
    await expect(panel.locator(".fact .fact-text")).to_have_text(["I live in Oslo"])
    await panel.get_by_role("button", name="Edit fact: I live in Oslo").click()
    await panel.get_by_label("Fact text").fill("I live in Bergen")
    await page.keyboard.press("Escape")
    await expect(panel.locator(".fact .fact-text")).to_have_text(["I live in Oslo"])
    await expect(panel.get_by_role("button", name="Edit fact: I live in Oslo")).to_be_focused()
    assert await active_texts(facts_app) == ["I live in Oslo"]
    await page.get_by_role("button", name="Search memory").click()
    await expect(page.locator("#search-panel")).to_be_visible()
    await expect(panel).to_be_hidden()
    await expect(page.get_by_role("button", name="Facts")).to_have_attribute(
        "aria-expanded", "false")
