"""The chat view's finish in a real Chromium (issue 34 items 4 and 5): a finished reply left in
view with what comes under it, banners that navigation clears, the welcome in an empty
session, the sidebar filter finding words said in a session, bordered tables and token usage
on hover."""

from __future__ import annotations

import re
from datetime import UTC, datetime

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

LONG_REPLY = "\n\n".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog."
                         for i in range(60))
GAP = "el => el.scrollHeight - el.scrollTop - el.clientHeight"


async def test_finished_reply_is_scrolled_to_its_end(browser: Browser, web_app: App,
                                                     fake_openai: FakeOpenAI) -> None:
    """When a long streamed reply finishes, the view is at the bottom with its Recalled block and
    Regenerate button in view; a reader who scrolled up mid-reply is left where they are."""
    page = await open_signed_in(browser, web_app)
    await send(page, "My favourite programming language is Rust because the compiler is strict.")
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(1)
    await wait_indexed(web_app, "favourite programming language")
    await new_session(page)
    fake_openai.script(Behaviour(reply=LONG_REPLY, deltas=30, delta_delay_s=0.01))
    await send(page, "Which programming language is my favourite?")
    reply = page.locator(".msg.assistant[data-state=done]")
    await expect(reply).to_have_count(1)
    await expect(reply.locator(".recalled .chip").first).to_contain_text("compiler is strict")
    await expect(reply.get_by_role("button", name="Regenerate")).to_be_in_viewport(ratio=1)
    await expect(reply.locator(".recalled")).to_be_in_viewport(ratio=1)
    assert await page.locator("#scroller").evaluate(GAP) < 8
    # Scrolled up while the next reply streams: it finishes without pulling the reader down.
    fake_openai.script(Behaviour(reply=LONG_REPLY, deltas=60, delta_delay_s=0.05))
    await reply.get_by_role("button", name="Regenerate").click()
    # Once the reply is taller than the view, so that there is somewhere to scroll up to.
    await expect(page.locator(".msg.assistant[data-state=streaming]")).to_contain_text(
        "Paragraph 20")
    await page.locator("#scroller").hover()
    await page.mouse.wheel(0, -3000)
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(1)
    await expect(page.locator(".msg.assistant .recalled .chip").first).to_be_visible()
    assert await page.locator("#scroller").evaluate(GAP) > 300


async def test_banner_is_cleared_by_navigation(browser: Browser, web_app: App) -> None:
    """"This session was deleted." goes away when Search, Facts or another session is opened."""
    page = await open_signed_in(browser, web_app)
    banner = page.locator("#banner")

    async def delete_open_session() -> None:
        await send(page, f"hello {datetime.now(UTC).isoformat()}")
        await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(1)
        key = await open_session_key(page)
        async with Client.connect(web_app.url, TOKEN) as c:
            await c.call("sessions.delete", {"sessionKey": key})
        await expect(banner).to_have_text("This session was deleted.")

    await delete_open_session()
    await page.get_by_role("button", name="Search memory").click()
    await expect(banner).to_be_hidden()
    await delete_open_session()
    await page.get_by_role("button", name="Facts").click()
    await expect(banner).to_be_hidden()
    async with Client.connect(web_app.url, TOKEN) as c:
        other = await c.call("sessions.create", {"title": "Another one"})
    await delete_open_session()
    await page.locator(f"#session-list .session[data-key='{other['sessionKey']}']").click()
    await expect(page.get_by_role("heading", level=1)).to_have_text("Another one")
    await expect(banner).to_be_hidden()


async def test_empty_session_at_load_shows_the_welcome(browser: Browser, web_app: App) -> None:
    """A session without messages, opened at load, shows the welcome and its starters, not a
    blank pane; its first message hides the welcome."""
    async with Client.connect(web_app.url, TOKEN) as c:
        await c.call("sessions.create", {"title": "Nothing yet"})
    page = await open_signed_in(browser, web_app)
    await expect(page.get_by_role("heading", level=1)).to_have_text("Nothing yet")
    await expect(page.get_by_role("heading", name="What shall we talk about?")).to_be_visible()
    await expect(page.get_by_role("button", name="Help me plan my week.")).to_be_visible()
    await send(page, "hello there")
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(1)
    await expect(page.locator("#welcome")).to_be_hidden()


async def test_filter_finds_words_said_in_a_session(browser: Browser, web_app: App) -> None:
    """The sidebar filter lists, under the title matches and marked "In messages", sessions whose
    messages hold the words though their titles do not; choosing one opens it."""
    # Sessions made with their titles, so the model's own titles cannot bring the word in.
    async with Client.connect(web_app.url, TOKEN) as c:
        for title, said in (("Breakfast", "I make marmalade from Seville oranges every January."),
                            ("Marmalade labels", "Print thirty labels."), ("Garden", "about roses"),
                            ("Taxes", "about receipts")):
            s = await c.call("sessions.create", {"title": title})
            await c.call("chat.send", {"sessionKey": s["sessionKey"], "message": said})
    await wait_indexed(web_app, "Seville oranges")
    page = await open_signed_in(browser, web_app)
    errors = PageErrors(page)
    await page.get_by_label("Filter sessions").fill("marmalade")
    titles = page.locator("#session-list section", has=page.get_by_role("heading", name="Titles"))
    await expect(titles.locator(".session .title")).to_have_text(["Marmalade labels"])
    found = page.locator("#session-list section",
                         has=page.get_by_role("heading", name="In messages"))
    await expect(found.locator(".session .title")).to_have_text(["Breakfast"])
    await expect(found.locator(".session .excerpt")).to_contain_text("Seville oranges")
    await expect(found.locator(".session .excerpt mark").first).to_have_text(
        re.compile("marmalade", re.I))
    await found.locator(".session").click()
    await expect(page.get_by_role("heading", level=1)).to_have_text("Breakfast")
    await expect(page.locator(".msg.user")).to_contain_text("Seville oranges")
    await page.get_by_label("Filter sessions").fill("")
    await expect(page.locator("#session-list .session")).to_have_count(4)
    await expect(page.get_by_role("heading", name="In messages")).to_have_count(0)
    assert errors.items == []


async def test_tables_have_borders_and_usage_shows_on_hover(browser: Browser, web_app: App,
                                                             fake_openai: FakeOpenAI) -> None:
    """A markdown table's cells have visible borders; hovering a finished reply shows the tokens
    it used (from chat.final, and from history after a reload)."""
    fake_openai.script(Behaviour(reply="| lang | typing |\n| --- | --- |\n| Rust | static |\n"
                                       "| Python | dynamic |\n"))
    page = await open_signed_in(browser, web_app)
    await send(page, "a table please")
    reply = page.locator(".msg.assistant[data-state=done]")
    await expect(reply).to_have_count(1)
    cell = reply.locator("td").first
    await expect(cell).to_have_text("Rust")
    style = await cell.evaluate(
        "el => { const s = getComputedStyle(el); return [s.borderTopStyle, s.borderTopWidth, "
        "s.borderLeftStyle]; }")
    assert style == ["solid", "1px", "solid"], style
    usage = reply.locator(".usage")
    await expect(usage).to_have_css("opacity", "0")
    await reply.hover()
    await expect(usage).to_have_css("opacity", "1")
    await expect(usage).to_have_text(re.compile(r"^\d+ tokens$"))
    assert re.search(r"\d+ in · \d+ out", await usage.get_attribute("title") or "")
    await page.reload()
    await page.wait_for_selector("#conn-state[data-state=open]")
    await expect(page.locator(".msg.assistant .usage")).to_have_text(re.compile(r"^\d+ tokens$"))
