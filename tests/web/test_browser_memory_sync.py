"""The web client's memory and live parts in a real Chromium: recalled-memory chips, the search
panel, two tabs kept in step, and a connection dropped by the server mid-reply."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("playwright.async_api",
                    reason="playwright is not installed (pip install -e '.[dev]')")

from playwright.async_api import Browser, Locator, Page, expect  # noqa: E402

from gateway.app import App
from gateway.client import Client
from tests.conftest import TOKEN
from tests.fake_openai import FakeOpenAI
from tests.web.conftest import (
    PageErrors,
    new_session,
    open_session_key,
    open_signed_in,
    send,
    wait_indexed,
)


async def test_recalled_memory_chip_opens_the_source_session(browser: Browser,
                                                             web_app: App) -> None:
    """A reply that recalled another session's message shows a chip with its date and excerpt;
    clicking it opens that session with the message in view and highlighted."""
    page = await open_signed_in(browser, web_app)
    errors = PageErrors(page)
    await new_session(page)
    await send(page, "My favourite programming language is Rust.")
    source = await open_session_key(page)
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(1)
    await wait_indexed(web_app, "favourite programming language")
    await new_session(page)
    await send(page, "Which programming language do I like?")
    chip = page.locator(".msg.assistant .chip").first
    await expect(chip).to_contain_text("Rust")
    year = str((await wait_indexed(web_app, "Rust"))["startTs"])[:4]
    await expect(chip).to_contain_text(year)
    await chip.click()
    await expect(page.locator("#session-list .session[aria-current=true]")).to_have_attribute(
        "data-key", source)
    flashed = page.locator(".msg.flash")
    await expect(flashed).to_contain_text("Rust")
    await expect(flashed).to_be_in_viewport()
    assert errors.items == []


async def test_memory_search_panel(browser: Browser, web_app: App) -> None:
    """The panel searches memory with a mode and date range, highlights the query's words,
    and opens a result's session; a range that excludes everything finds nothing."""
    page = await open_signed_in(browser, web_app)
    await new_session(page)
    await send(page, "The weather in Lisbon was sunny today.")
    source = await open_session_key(page)
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(1)
    await wait_indexed(web_app, "Lisbon weather")
    await new_session(page)
    await page.get_by_role("button", name="Search memory").click()
    await page.get_by_label("Query").fill("Lisbon weather")
    await page.get_by_label("Mode", exact=True).select_option("keyword")
    await page.locator("#search-form").get_by_role("button", name="Search").click()
    result = page.locator("#search-results .result").first
    await expect(result.locator("mark").first).to_have_text("weather")
    await expect(result).to_contain_text("Lisbon")
    await result.get_by_role("button", name="Open in session").click()
    await expect(page.locator("#session-list .session[aria-current=true]")).to_have_attribute(
        "data-key", source)
    await expect(page.locator(".msg.flash")).to_contain_text("Lisbon")
    await page.get_by_label("To", exact=True).fill("2001-01-01")
    await page.locator("#search-form").get_by_role("button", name="Search").click()
    await expect(page.locator("#search-results")).to_have_text("Nothing found.")


async def test_two_tabs_stay_in_sync(browser: Browser, web_app: App) -> None:
    """What one tab does (create, rename, chat, delete) shows in another tab of the same
    user at once."""
    ctx = await browser.new_context()
    a = await open_signed_in(browser, web_app, context=ctx)
    b = await open_signed_in(browser, web_app, context=ctx)
    # A new chat is created by its first message (not by "New chat"), so tab A speaks first.
    await new_session(a)
    await send(a, "hello from tab A")
    key = await open_session_key(a)
    b_item = b.locator(f"#session-list .session[data-key='{key}']")
    await expect(b_item).to_be_visible()
    await b_item.click()
    await expect(b.locator(".msg.user .body")).to_have_text("hello from tab A")
    await expect(b.locator(".msg.assistant[data-state=done] .body")).to_have_text(
        "Echo: hello from tab A")
    await expect(b.locator(".msg")).to_have_count(2)
    await a.get_by_role("button", name="Rename").click()
    await a.locator("#edit-text").fill("Shared plans")
    await a.get_by_role("button", name="Save").click()
    await expect(b_item).to_contain_text("Shared plans")
    await expect(b.locator("#chat-title")).to_have_text("Shared plans")
    a.once("dialog", lambda d: asyncio.ensure_future(d.accept()))
    await a.get_by_role("button", name="Delete").click()
    await expect(b_item).to_have_count(0)
    await expect(b.locator("#banner")).to_have_text("This session was deleted.")


async def test_dropped_connection_reconnects_without_loss_or_duplicates(
    browser: Browser, web_app: App, fake_openai: FakeOpenAI
) -> None:
    """When the server's side of the socket dies mid-reply, the page says so, reconnects with
    backoff, and ends with the full reply and a message sent meanwhile, each shown once and in
    the transcript's order."""
    words = " ".join(f"w{i}" for i in range(40))
    fake_openai.configure(reply=words, delta_delay_s=0.05)
    page = await open_signed_in(browser, web_app)
    await new_session(page)
    await send(page, "tell me a long story")
    key = await open_session_key(page)
    await drop_mid_reply(page, web_app)
    async with Client.connect(web_app.url, TOKEN) as other:
        run = await other.call("chat.send", {"sessionKey": key, "message": "sent while away"})
        assert run["runId"]
    await expect(page.locator("#conn-state")).to_have_attribute("data-state", "open", timeout=20000)
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(2, timeout=20000)
    bodies = await page.locator(".msg .body").all_inner_texts()
    assert sorted(bodies) == sorted(["tell me a long story", words, "sent while away", words])
    async with Client.connect(web_app.url, TOKEN) as other:
        history = await other.call("sessions.history", {"sessionKey": key})
    assert bodies == [m["content"] for m in history["messages"]]


async def drop_mid_reply(page: Page, web_app: App) -> Locator:
    """Once the last reply shows its first words, kill every TCP connection of the server (no
    close frame) and wait for the page to notice; returns the reply's locator."""
    reply = page.locator(".msg.assistant").last
    await expect(reply.locator(".body")).to_contain_text("w3")
    for conn in list(web_app.server.connections):
        conn.ws.transport.abort()
    await expect(page.locator("#conn-state")).to_have_attribute("data-state", "retrying")
    return reply


# Every text the last assistant reply's body and notes show, with the connection's state then,
# recorded in the page on each change of the messages or of the connection state.
RECORD_REPLY = """() => {
  window.__seen = [];
  const observer = new MutationObserver(() => {
    const reply = [...document.querySelectorAll(".msg.assistant")].pop();
    const state = document.getElementById("conn-state").dataset.state;
    if (reply) {
      window.__seen.push([reply.querySelector(".body").textContent,
                          reply.querySelector(".extras").textContent, state]);
    }
  });
  observer.observe(document.getElementById("messages"),
                   { subtree: true, childList: true, characterData: true });
  observer.observe(document.getElementById("conn-state"), { attributes: true });
}"""


def resumed_texts(bodies: list[str], before: str, final: str) -> list[str]:
    """The texts that prove a reply resumed: longer than it was before the drop, not yet final."""
    return [body for body in bodies if len(before) < len(body) < len(final)]


async def test_reconnect_mid_stream_never_shows_a_gap(
    browser: Browser, web_app: App, fake_openai: FakeOpenAI
) -> None:
    """A reply that keeps streaming while the page is offline resumes after the reconnect from
    the subscription's snapshot and keeps growing: every state of it is a prefix of the final
    reply (never a hole), some are between the text before the drop and the final one, and it
    ends shown once."""
    words = " ".join(f"w{i}" for i in range(150))
    fake_openai.configure(reply=words, delta_delay_s=0.03)
    page = await open_signed_in(browser, web_app)
    sockets: list[list[str]] = []

    def on_socket(ws: Any) -> None:
        frames: list[str] = []
        sockets.append(frames)
        ws.on("framereceived", lambda payload: frames.append(str(payload)))

    page.on("websocket", on_socket)
    await new_session(page)
    await page.evaluate(RECORD_REPLY)
    await send(page, "tell me a long story")
    reply = await drop_mid_reply(page, web_app)
    await expect(page.locator("#conn-state")).to_have_attribute("data-state", "open", timeout=20000)
    await expect(reply).to_have_attribute("data-state", "done", timeout=20000)
    assert sockets and any("chat.delta" in f for f in sockets[-1]), \
        "no delta came after the reconnect"
    seen: list[list[str]] = await page.evaluate("window.__seen")
    assert seen
    gaps = [body for body, _, _ in seen if not words.startswith(body.strip())]
    assert gaps == [], gaps[:1]
    states = [state for _, _, state in seen]
    dropped = next(i for i, state in enumerate(states) if state != "open")
    back = next(i for i in range(dropped, len(states)) if states[i] == "open")
    before = max((body.strip() for body, _, _ in seen[:dropped]), key=len)
    assert before.startswith("w0 w1 w2 w3")
    after = [body.strip() for body, _, _ in seen[back:]]
    assert resumed_texts(after, before, words), "the reply waited for its end instead of resuming"
    assert not any("Reconnected" in notes for _, notes, _ in seen)
    assert await page.locator(".msg .body").all_inner_texts() == ["tell me a long story", words]
    await expect(reply.locator(".note")).to_have_count(0)


async def test_reload_mid_stream_never_shows_a_gap(
    browser: Browser, web_app: App, fake_openai: FakeOpenAI
) -> None:
    """A page reloaded while a reply streams shows the reply so far as soon as it appears and
    keeps streaming it: every state is a prefix of the final reply (never its tail alone), some
    are between the text before the reload and the final one."""
    words = " ".join(f"w{i}" for i in range(100))
    fake_openai.configure(reply=words, delta_delay_s=0.03)
    page = await open_signed_in(browser, web_app)
    await new_session(page)
    await send(page, "tell me a long story")
    await expect(page.locator(".msg.assistant .body")).to_contain_text("w3")
    before = (await page.locator(".msg.assistant .body").inner_text()).strip()
    await page.reload()
    await page.wait_for_selector("#messages .msg.user")
    await page.evaluate(RECORD_REPLY)
    reply = page.locator(".msg.assistant").last
    # The reply appears with its text so far (the snapshot), not empty until its end.
    first = (await reply.locator(".body").inner_text()).strip()
    assert words.startswith(first) and len(first) >= len(before), (first, before)
    await expect(reply).to_have_attribute("data-state", "done", timeout=20000)
    seen: list[list[str]] = await page.evaluate("window.__seen")
    assert seen
    gaps = [body for body, _, _ in seen if not words.startswith(body.strip())]
    assert gaps == [], gaps[:1]
    bodies = [body.strip() for body, _, _ in seen]
    assert resumed_texts(bodies, before, words), "the reply waited for its end instead of resuming"
    assert await page.locator(".msg .body").all_inner_texts() == ["tell me a long story", words]


async def test_sidebar_and_history_page_as_you_scroll(browser: Browser, web_app: App) -> None:
    """35 sessions show 30 until the list is scrolled to its end; a 120-message session shows its
    last 50 and loads older pages, oldest message last, when scrolled to the top."""
    store = web_app.store
    keys = [(await asyncio.to_thread(store.create, "default", title=f"s{i:02d}")).session_key
            for i in range(35)]
    for i in range(120):
        await asyncio.to_thread(store.append_message, "default", keys[-1], role="user",
                                content=f"msg {i:03d}")
    page = await open_signed_in(browser, web_app)
    sessions = page.locator("#session-list .session")
    await expect(sessions).to_have_count(30)
    await sessions.last.scroll_into_view_if_needed()
    await page.locator("#session-more").scroll_into_view_if_needed()
    await expect(sessions).to_have_count(35)
    await expect(page.locator(".msg")).to_have_count(50)  # the newest session opens first
    await expect(page.locator(".msg .body").last).to_have_text("msg 119")
    for expected in (100, 120):
        await page.locator("#scroller").evaluate("el => { el.scrollTop = 0; }")
        await expect(page.locator(".msg")).to_have_count(expected)
    await expect(page.locator(".msg .body").first).to_have_text("msg 000")
