"""The web client in a real Chromium against the real gateway and the loopback model: signing
in, chatting with a streamed reply, stopping it, history after a reload, and replies that try
to run script."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("playwright.async_api",
                    reason="playwright is not installed (pip install -e '.[dev]')")

from playwright.async_api import Browser, expect  # noqa: E402

from gateway.app import App
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.web.conftest import (
    PageErrors,
    new_session,
    open_session_key,
    open_signed_in,
    page_url,
    send,
)


async def test_sign_in_with_a_pasted_token(browser: Browser, web_app: App) -> None:
    """Pasting the token signs in; "Remember on this device" keeps it in localStorage across
    a reload."""
    page = await browser.new_page()
    errors = PageErrors(page)
    await page.goto(page_url(web_app))
    await expect(page.locator("#signin")).to_be_visible()
    await page.get_by_label("Token", exact=True).fill(TOKEN)
    await page.get_by_label("Remember on this device").check()
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#app")).to_be_visible()
    await expect(page.locator("#conn-state")).to_have_text("Connected")
    assert await page.evaluate("localStorage.getItem('recalld.token')") == TOKEN
    await page.reload()
    await expect(page.locator("#conn-state")).to_have_text("Connected")
    await expect(page.locator("#memory-status")).to_contain_text("indexed")
    assert errors.items == []


async def test_link_token_is_taken_from_the_fragment_and_removed(browser: Browser,
                                                                 web_app: App) -> None:
    """The #token= link signs in, leaves no token in the address bar, and keeps it only
    for the tab."""
    page = await open_signed_in(browser, web_app)
    assert page.url == page_url(web_app)
    assert await page.evaluate("sessionStorage.getItem('recalld.token')") == TOKEN
    assert await page.evaluate("localStorage.getItem('recalld.token')") is None


async def test_gateway_url_in_query_or_fragment_is_ignored(browser: Browser, web_app: App) -> None:
    """A link carrying gateway URLs in its query string and fragment still signs in, and the
    page's WebSockets all go to the origin that served it, never to a URL the link names."""
    page = await browser.new_page()
    sockets: list[str] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    origin = page_url(web_app)
    await page.goto(f"{origin}?gateway=ws://127.0.0.1:1/x&url=ws://evil"
                    f"#token={TOKEN}&gateway=ws://evil")
    await expect(page.locator("#conn-state")).to_have_attribute("data-state", "open")
    await expect(page.locator("#app")).to_be_visible()
    own = origin.replace("http://", "ws://", 1)
    assert sockets and set(sockets) == {own}, sockets
    assert "token" not in page.url


async def test_wrong_token_shows_a_clear_message(browser: Browser, web_app: App) -> None:
    """A refused token brings back the sign-in form saying so, and nothing is stored."""
    page = await browser.new_page()
    await page.goto(page_url(web_app))
    await page.get_by_label("Token", exact=True).fill("not-the-token-0123456789")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#signin-error")).to_contain_text("That token was not accepted")
    await expect(page.locator("#app")).to_be_hidden()
    assert await page.evaluate("sessionStorage.getItem('recalld.token')") is None


async def test_create_send_and_watch_the_reply_stream(browser: Browser, web_app: App,
                                                      fake_openai: FakeOpenAI) -> None:
    """A new session takes a message on Enter (Shift+Enter is a newline) and the reply is seen
    growing while it streams, then complete with its markdown rendered."""
    fake_openai.configure(reply="Here is **bold** and more words to stream one by one until done",
                          delta_delay_s=0.08)
    page = await open_signed_in(browser, web_app)
    errors = PageErrors(page)
    await new_session(page)
    box = page.get_by_role("textbox", name="Message", exact=True)
    await box.fill("first line")
    await box.press("Shift+Enter")
    await box.press_sequentially("second line")
    assert await box.input_value() == "first line\nsecond line"
    await box.press("Enter")
    reply = page.locator(".msg.assistant").last
    await expect(reply).to_have_attribute("data-state", "streaming")
    await expect(reply.locator(".body")).to_contain_text("Here is")
    streamed = await reply.locator(".body").inner_text()
    assert "until done" not in streamed  # seen mid-stream, not only at the end
    await expect(page.get_by_role("button", name="Stop")).to_be_visible()
    await expect(reply).to_have_attribute("data-state", "done")
    await expect(reply.locator(".body strong")).to_have_text("bold")
    await expect(reply.locator(".body")).to_contain_text("until done")
    await expect(page.locator(".msg.user .body")).to_have_text("first line\nsecond line")
    await expect(page.get_by_role("button", name="Send")).to_be_visible()
    assert (fake_openai.chat_requests[-1].json["messages"][-1]["content"]
            == "first line\nsecond line")
    assert errors.items == []


async def test_own_message_shows_its_time_without_a_reload(browser: Browser, web_app: App) -> None:
    """The message just sent shows the time the transcript stored for it, as history does after
    a reload."""
    page = await open_signed_in(browser, web_app)
    await new_session(page)
    await send(page, "what time is it")
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(1)
    meta = page.locator(".msg.user .meta")
    await expect(meta).to_have_text(re.compile(r"^You · \S"))
    sent = await meta.inner_text()
    await page.reload()
    await expect(page.locator(".msg.user .meta")).to_have_text(sent)


async def test_stop_aborts_mid_stream(browser: Browser, web_app: App,
                                      fake_openai: FakeOpenAI) -> None:
    """Stop (and Esc) abort the running reply: the partial stays, marked stopped, and the transcript
    says aborted."""
    fake_openai.configure(reply=" ".join(f"word{i}" for i in range(200)), delta_delay_s=0.05)
    page = await open_signed_in(browser, web_app)
    await new_session(page)
    for n, how in enumerate(("button", "escape")):
        await send(page, f"go on and on ({how})")
        # This send's own reply: the one before it (aborted) also holds "word2".
        await expect(page.locator(".msg.assistant")).to_have_count(n + 1)
        reply = page.locator(".msg.assistant").nth(n)
        await expect(reply.locator(".body")).to_contain_text("word2")
        if how == "button":
            await page.get_by_role("button", name="Stop").click()
        else:
            await page.keyboard.press("Escape")
        await expect(reply).to_have_attribute("data-state", "aborted")
        await expect(reply).to_contain_text("Stopped.")
        assert "word199" not in await reply.locator(".body").inner_text()
    key = await open_session_key(page)
    path = web_app.config.data_dir / "sessions" / "default" / f"{key}.jsonl"
    assert path.read_text().count('"aborted":true') == 2


async def test_reload_shows_history_once(browser: Browser, web_app: App) -> None:
    """After a reload the open session's messages come back from history, each exactly once,
    in order."""
    page = await open_signed_in(browser, web_app)
    await new_session(page)
    for text in ("one", "two"):
        await send(page, text)
        await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(
            1 if text == "one" else 2)
    await page.reload()
    await expect(page.locator(".msg")).to_have_count(4)
    bodies = await page.locator(".msg .body").all_inner_texts()
    assert bodies == ["one", "Echo: one", "two", "Echo: two"]


async def test_hostile_reply_renders_inert(browser: Browser, web_app: App,
                                           fake_openai: FakeOpenAI) -> None:
    """Markup in a reply (an onerror image, a javascript: link, a script, a remote image) runs
    nothing, loads nothing, and shows as text or a dead link; code blocks get a copy button."""
    hostile = ('<img src=x onerror="window.__pwned=1"> [click me](javascript:window.__pwned=2) '
               '<script>window.__pwned=3</script> <a href="javascript:window.__pwned=4">raw</a>\n\n'
               '![tracker](http://127.0.0.1:9/leak.png)\n\n```\nprint("hi")\n```\n')
    fake_openai.script(Behaviour(reply=hostile, deltas=3))
    page = await open_signed_in(browser, web_app)
    requested: list[str] = []
    page.on("request", lambda req: requested.append(req.url))
    await new_session(page)
    await send(page, '<img src=y onerror="window.__pwned=5">')
    reply = page.locator(".msg.assistant").last
    await expect(reply).to_have_attribute("data-state", "done")
    messages = page.locator("#messages")
    assert await page.evaluate("window.__pwned") is None
    assert await messages.locator("script, [onerror], img[src=x], img[src=y]").count() == 0
    assert await reply.get_by_text("click me").get_attribute("href") is None
    assert await reply.locator("a[href^='javascript']").count() == 0
    await expect(reply.get_by_text("image: tracker")).to_have_attribute(
        "rel", "noopener noreferrer")
    await expect(reply.locator(".body")).to_contain_text('<img src=x onerror="window.__pwned=1">')
    await expect(page.locator(".msg.user .body")).to_have_text(
        '<img src=y onerror="window.__pwned=5">')
    await expect(reply.get_by_role("button", name="Copy code")).to_have_count(1)
    await reply.get_by_text("click me").click()
    assert await page.evaluate("window.__pwned") is None
    assert not [u for u in requested if "leak.png" in u]


async def test_page_works_over_tls(browser: Browser, config_factory: Callable[..., Config],
                                   fake_openai: FakeOpenAI, tmp_path: Path) -> None:
    """With [tls] the page loads over https:// and chats over wss:// to its own origin."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    cfg = config_factory(tls={"cert": str(cert_path), "key": str(key_path)},
                         llm={"base_url": fake_openai.base_url, "api_key": "sk-test",
                              "model": "fake-model"})
    async with running(cfg) as app:
        # The test CA is not in Chromium's store; a real deployment's certificate would be.
        ctx = await browser.new_context(ignore_https_errors=True)
        page = await ctx.new_page()
        await page.goto(f"https://127.0.0.1:{app.server.port}/#token={TOKEN}")
        await expect(page.locator("#conn-state")).to_have_attribute("data-state", "open")
        await new_session(page)
        await send(page, "over tls")
        await expect(page.locator(".msg.assistant[data-state=done] .body")).to_have_text(
            "Echo: over tls")


async def test_failed_reply_shows_the_error_and_retry_works(
    browser: Browser, web_app: App, fake_openai: FakeOpenAI
) -> None:
    """A run the model fails shows the server's error message and a Retry that sends the
    message again."""
    fake_openai.script(Behaviour(status=500, error_message="the model fell over"))
    page = await open_signed_in(browser, web_app)
    await new_session(page)
    await send(page, "please answer")
    failed = page.locator(".msg.assistant[data-state=error]")
    await expect(failed.get_by_role("alert")).to_contain_text("model endpoint answered 500: the "
                                                              "model fell over")
    await failed.get_by_role("button", name="Retry").click()
    await expect(page.locator(".msg.assistant[data-state=done] .body")).to_have_text(
        "Echo: please answer")
