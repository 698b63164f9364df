"""The per-session menu in the sidebar: each row's "⋯" button ("Actions for <title>") is reached
by Tab, opens Rename, Delete, Export as Markdown and Export as JSON for that row's session
(open or not), and Esc closes it with focus back on the button."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("playwright.async_api",
                    reason="playwright is not installed (pip install -e '.[dev]')")

from playwright.async_api import Browser, Dialog, Page, expect  # noqa: E402

from gateway.app import App
from gateway.client import Client
from testkit.fake_openai import title_reply
from tests.conftest import TOKEN
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.web.conftest import PageErrors, new_session, open_signed_in, send
from tests.web.test_browser_audit import serious


@pytest.fixture(autouse=True)
def titles_as_sent(fake_openai: FakeOpenAI) -> None:
    """The model titles a session with its first message's words, so the name the page shows
    at once and the one the model sends later are the same (the rows are found by title)."""
    fake_openai.title_behaviour = Behaviour(
        reply=lambda messages: title_reply(messages).removeprefix("Chat about "))


async def session_titles(app: App) -> list[str]:
    async with Client.connect(app.url, TOKEN) as c:
        return [s["title"] for s in (await c.call("sessions.list"))["sessions"]]


async def chat(page: Page, text: str) -> None:
    await send(page, text)
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(1)


async def test_row_menu_is_reached_by_keyboard_and_renames(browser: Browser, web_app: App) -> None:
    """Tab moves from a session to its "⋯" button, Enter opens the menu on Rename, Esc closes it
    and focuses the button again, a click elsewhere or Tab out of it closes it; Rename renames
    that row's session, not the open one."""
    page = await open_signed_in(browser, web_app)
    errors = PageErrors(page)
    await chat(page, "Lisbon trip plans")
    await new_session(page)
    await chat(page, "Porto weekend")
    sidebar = page.get_by_role("navigation", name="Sessions")
    await sidebar.locator(".session", has_text="Lisbon trip plans").focus()
    await page.keyboard.press("Tab")
    actions = sidebar.get_by_role("button", name="Actions for Lisbon trip plans")
    await expect(actions).to_be_focused()
    await expect(actions).to_have_attribute("aria-expanded", "false")
    await page.keyboard.press("Enter")
    menu = page.locator("#row-menu")
    await expect(menu).to_be_visible()
    await expect(actions).to_have_attribute("aria-expanded", "true")
    await expect(menu.get_by_role("button", name="Rename")).to_be_focused()
    await page.keyboard.press("Tab")
    await expect(menu.get_by_role("button", name="Delete")).to_be_focused()
    await page.keyboard.press("Escape")
    await expect(menu).to_be_hidden()
    await expect(actions).to_be_focused()
    await expect(sidebar).to_be_visible()  # Esc closed the menu only
    await page.keyboard.press("Enter")
    await page.keyboard.press("Enter")  # Rename
    field = page.get_by_role("textbox", name="Title")
    await expect(field).to_have_value("Lisbon trip plans")
    await field.fill("Lisbon in May")
    await field.press("Enter")
    await expect(sidebar.locator(".session .title", has_text="Lisbon in May")).to_be_visible()
    await expect(page.get_by_role("heading", level=1)).to_have_text("Porto weekend")
    assert sorted(await session_titles(web_app)) == ["Lisbon in May", "Porto weekend"]
    await sidebar.get_by_role("button", name="Actions for Porto weekend").click()
    await expect(menu).to_be_visible()
    await page.get_by_role("heading", level=1).click()  # a click elsewhere closes it
    await expect(menu).to_be_hidden()
    await sidebar.get_by_role("button", name="Actions for Porto weekend").press("Enter")
    await expect(menu.get_by_role("button", name="Rename")).to_be_focused()
    for _ in range(4):  # past Export as JSON, the last item: the menu closes behind
        await page.keyboard.press("Tab")
    await expect(menu).to_be_hidden()
    assert errors.items == []


async def test_a_row_keeps_the_keyboard_focus_when_the_list_is_drawn_again(
        browser: Browser, web_app: App) -> None:
    """A session's change arriving while a row's button has the focus (here another session
    renamed through the API) redraws the list, and the focus stays on that row's button."""
    page = await open_signed_in(browser, web_app)
    await chat(page, "Lisbon trip plans")
    await new_session(page)
    await chat(page, "Porto weekend")
    sidebar = page.get_by_role("navigation", name="Sessions")
    actions = sidebar.get_by_role("button", name="Actions for Lisbon trip plans")
    await actions.focus()
    await expect(actions).to_be_focused()
    async with Client.connect(web_app.url, TOKEN) as c:
        porto = next(s for s in (await c.call("sessions.list"))["sessions"]
                     if s["title"] == "Porto weekend")
        await c.call("sessions.update", {"sessionKey": porto["sessionKey"], "title": "Porto trip"})
    await expect(sidebar.locator(".session .title", has_text="Porto trip")).to_be_visible()
    await expect(actions).to_be_focused()
    await page.keyboard.press("Shift+Tab")
    await expect(sidebar.locator(".session", has_text="Lisbon trip plans")).to_be_focused()


async def test_row_menu_exports_and_deletes(browser: Browser, web_app: App, tmp_path: Path) -> None:
    """A row's menu passes axe-core, exports its session as Markdown or JSON and deletes it after
    a confirmation (cancelling keeps it); deleting the open session's row leaves an empty chat."""
    ctx = await browser.new_context(bypass_csp=True)  # for the injected audit script only
    page = await open_signed_in(browser, web_app, context=ctx)
    await chat(page, "Remember the blue door")
    await new_session(page)
    await chat(page, "Porto weekend")
    sidebar = page.get_by_role("navigation", name="Sessions")
    menu = page.locator("#row-menu")
    blue = sidebar.get_by_role("button", name="Actions for Remember the blue door")
    await blue.click()
    await expect(menu).to_be_visible()
    assert await serious(page, "a sidebar row's menu") == []
    async with page.expect_download() as md_download:
        await menu.get_by_role("button", name="Export as Markdown").click()
    md = await md_download.value
    assert md.suggested_filename == "Remember-the-blue-door.md"
    await md.save_as(tmp_path / "s.md")
    text = (tmp_path / "s.md").read_text("utf-8")
    assert text.startswith("# Remember the blue door\n") and "Echo: Remember the blue door" in text
    await blue.click()
    async with page.expect_download() as json_download:
        await menu.get_by_role("button", name="Export as JSON").click()
    await (await json_download.value).save_as(tmp_path / "s.json")
    data = json.loads((tmp_path / "s.json").read_text("utf-8"))
    assert [m["content"] for m in data["messages"]] == ["Remember the blue door",
                                                        "Echo: Remember the blue door"]

    asked: list[str] = []

    async def answer(accept: bool, dialog: Dialog) -> None:
        asked.append(dialog.message)
        await (dialog.accept() if accept else dialog.dismiss())

    page.once("dialog", lambda d: answer(False, d))
    await blue.click()
    await menu.get_by_role("button", name="Delete").click()
    await expect(menu).to_be_hidden()
    assert asked and "Remember the blue door" in asked[0]
    assert len(await session_titles(web_app)) == 2
    page.once("dialog", lambda d: answer(True, d))
    await blue.click()
    await menu.get_by_role("button", name="Delete").click()
    await expect(blue).to_have_count(0)
    assert await session_titles(web_app) == ["Porto weekend"]
    await expect(page.get_by_role("heading", level=1)).to_have_text("Porto weekend")
    page.once("dialog", lambda d: answer(True, d))
    await sidebar.get_by_role("button", name="Actions for Porto weekend").click()
    await menu.get_by_role("button", name="Delete").click()
    await expect(page.locator("#welcome")).to_be_visible()
    assert await session_titles(web_app) == []
