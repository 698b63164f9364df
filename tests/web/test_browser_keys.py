"""Keyboard shortcuts and the theme in a real Chromium (issue 34 item 4): the `?` list, new
chat, search, focus the composer, previous/next session and copy the last reply from the
keyboard, bare keys left alone while typing, and a light/dark/system choice that is
remembered and applied before the page is painted."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

pytest.importorskip("playwright.async_api",
                    reason="playwright is not installed (pip install -e '.[dev]')")

from playwright.async_api import Browser, expect  # noqa: E402

from gateway.app import App
from tests.web.conftest import PageErrors, open_signed_in, page_url, send

# The page's --bg in each theme (app.css).
LIGHT_BG = "rgb(247, 247, 245)"
DARK_BG = "rgb(22, 24, 27)"


async def seed(app: App, *titles: str) -> None:
    """Sessions with one message each, the first title the newest."""
    now = datetime.now(UTC)
    for age, title in enumerate(titles):
        ts = now - timedelta(minutes=age)
        s = await asyncio.to_thread(app.store.create, "default", title=title, created_at=ts)
        await asyncio.to_thread(app.store.append_message, "default", s.session_key, role="user",
                                content=f"about {title}", ts=ts)


async def test_question_mark_lists_the_shortcuts(browser: Browser, web_app: App) -> None:
    """`?` outside a text field opens a dialog listing every shortcut (Esc closes it); typed in
    the composer it is just a character."""
    page = await open_signed_in(browser, web_app)
    errors = PageErrors(page)
    box = page.get_by_role("textbox", name="Message", exact=True)
    await box.press("?")
    await expect(box).to_have_value("?")
    await expect(page.locator("#keys-dialog")).to_be_hidden()
    await box.fill("")
    await page.locator("#chat-title").click()  # focus leaves the text field
    await page.keyboard.press("?")
    dialog = page.get_by_role("dialog", name="Keyboard shortcuts")
    await expect(dialog).to_be_visible()
    for action in ("New chat", "Search memory", "Focus the message box", "Stop the reply",
                   "Previous session", "Next session", "Copy the last reply", "Show this list"):
        await expect(dialog.get_by_role("row", name=action)).to_be_visible()
    await expect(dialog.get_by_role("row", name="New chat")).to_contain_text("Ctrl+Shift+O")
    await expect(dialog.get_by_role("row", name="Search memory")).to_contain_text("Ctrl+K")
    await page.keyboard.press("Escape")
    await expect(dialog).to_be_hidden()
    # The account menu opens the same list, for those who do not know `?`.
    await page.get_by_role("button", name="Account: default").click()
    await page.get_by_role("button", name="Keyboard shortcuts").click()
    await expect(dialog).to_be_visible()
    await dialog.get_by_role("button", name="Close").click()
    await expect(dialog).to_be_hidden()
    assert errors.items == []


async def test_ctrl_k_search_ctrl_shift_o_new_chat_and_focus_keys(browser: Browser,
                                                                  web_app: App) -> None:
    """Ctrl+K opens the search panel with its query focused, even from the composer; Shift+Esc
    and `/` (outside a text field) go back to the composer; Ctrl+Shift+O opens a new chat."""
    await seed(web_app, "Porto trip")
    page = await open_signed_in(browser, web_app)
    await expect(page.get_by_role("heading", level=1)).to_have_text("Porto trip")
    box = page.get_by_role("textbox", name="Message", exact=True)
    await expect(box).to_be_focused()
    await page.keyboard.press("Control+k")
    await expect(page.get_by_role("complementary", name="Search memory")).to_be_visible()
    query = page.get_by_label("Query")
    await expect(query).to_be_focused()
    await page.keyboard.type("a/b")  # `/` in a text field is a character
    await expect(query).to_have_value("a/b")
    await page.keyboard.press("Shift+Escape")
    await expect(box).to_be_focused()
    # not closed by it
    await expect(page.get_by_role("complementary", name="Search memory")).to_be_visible()
    await page.locator("#chat-title").click()
    await page.keyboard.press("/")
    await expect(box).to_be_focused()
    await expect(box).to_have_value("")
    await page.keyboard.press("Control+Shift+O")
    await expect(page.get_by_role("heading", level=1)).to_have_text("New chat")
    await expect(page.locator("#welcome")).to_be_visible()
    await expect(box).to_be_focused()


async def test_alt_arrows_step_through_sessions(browser: Browser, web_app: App) -> None:
    """Alt+↓ opens the next session down the sidebar and Alt+↑ the one above, from the composer."""
    await seed(web_app, "First", "Second", "Third")
    page = await open_signed_in(browser, web_app)
    heading = page.get_by_role("heading", level=1)
    await expect(heading).to_have_text("First")
    await page.keyboard.press("Alt+ArrowDown")
    await expect(heading).to_have_text("Second")
    await page.keyboard.press("Alt+ArrowDown")
    await expect(heading).to_have_text("Third")
    await page.keyboard.press("Alt+ArrowDown")  # the last stays the last
    await expect(heading).to_have_text("Third")
    await page.keyboard.press("Alt+ArrowUp")
    await expect(heading).to_have_text("Second")
    await expect(page.locator("#session-list .session[aria-current=true] .title")).to_have_text(
        "Second")


async def test_ctrl_shift_c_copies_the_last_reply(browser: Browser, web_app: App) -> None:
    """Ctrl+Shift+C copies the newest reply's text, from the composer."""
    ctx = await browser.new_context()
    await ctx.grant_permissions(["clipboard-read", "clipboard-write"])
    page = await open_signed_in(browser, web_app, context=ctx)
    await send(page, "first words")
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(1)
    await send(page, "second words")
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(2)
    await page.get_by_role("textbox", name="Message", exact=True).focus()
    await page.keyboard.press("Control+Shift+C")
    await expect(page.locator(".msg.assistant").last.get_by_role(
        "button", name="Copy message")).to_have_text("Copied")
    assert await page.evaluate("navigator.clipboard.readText()") == "Echo: second words"


async def test_theme_choice_is_remembered_and_applied_before_paint(browser: Browser,
                                                                   web_app: App) -> None:
    """Theme (in the account menu) overrides the system's scheme, is kept across a reload, and
    is on the root element before the body is parsed, so the page never flashes the other theme;
    System follows the system again."""
    ctx = await browser.new_context(color_scheme="light")
    # Records the theme at the moment <body> is created, i.e. before anything can be painted.
    await ctx.add_init_script("""
      new MutationObserver((_, obs) => {
        if (document.body) {
          window.__themeAtBody = document.documentElement.dataset.theme || "none";
          obs.disconnect();
        }
      }).observe(document, { childList: true, subtree: true });
    """)
    page = await open_signed_in(browser, web_app, context=ctx)
    bg = "getComputedStyle(document.body).backgroundColor"
    assert await page.evaluate(bg) == LIGHT_BG
    await page.get_by_role("button", name="Account: default").click()
    theme = page.get_by_label("Theme")
    await expect(theme).to_have_value("system")
    await theme.select_option("dark")
    assert await page.evaluate(bg) == DARK_BG
    await page.reload()
    await page.wait_for_selector("#conn-state[data-state=open]")
    assert await page.evaluate("window.__themeAtBody") == "dark"
    assert await page.evaluate(bg) == DARK_BG
    await page.get_by_role("button", name="Account: default").click()
    await expect(theme).to_have_value("dark")
    await theme.select_option("system")
    assert await page.evaluate(bg) == LIGHT_BG
    await page.emulate_media(color_scheme="dark")
    assert await page.evaluate(bg) == DARK_BG
    await theme.select_option("light")
    assert await page.evaluate(bg) == LIGHT_BG
    await page.goto(page_url(web_app))  # a new load of the page, signed in from storage
    await page.wait_for_selector("#conn-state[data-state=open]")
    assert await page.evaluate("window.__themeAtBody") == "light"
    assert await page.evaluate(bg) == LIGHT_BG
