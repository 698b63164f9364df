"""Code blocks in replies are highlighted by the vendored highlight.js under the page's strict
CSP and Trusted Types, stay sanitised, are coloured by the light or dark theme, and copy their
exact text with their own Copy button."""

from __future__ import annotations

from typing import Literal

import pytest

pytest.importorskip("playwright.async_api",
                    reason="playwright is not installed (pip install -e '.[dev]')")

from playwright.async_api import Browser, expect  # noqa: E402

from gateway.app import App
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.web.conftest import PageErrors, open_signed_in, send
from tests.web.test_browser_audit import serious

PYTHON = 'def greet(name):\n    return "<b>hi</b>"  # say <i>hi</i>\n'
REPLY = (f"```python\n{PYTHON}```\n\n```nosuchlang\nplain <b>text</b>\n```\n\n"
         '<span class="hljs-keyword">not code</span> and `inline <b>code</b>`\n')

COLOUR = "el => getComputedStyle(el).color"


async def test_code_is_highlighted_safely(browser: Browser, web_app: App,
                                          fake_openai: FakeOpenAI) -> None:
    """A fence naming a known language gets highlight.js's token spans (its text unchanged and
    copied exactly), an unknown one stays plain, markup in the code stays text, and a class
    written outside a code block is dropped; the page logs no CSP or Trusted Types error."""
    fake_openai.script(Behaviour(reply=REPLY, deltas=4))
    ctx = await browser.new_context()
    await ctx.grant_permissions(["clipboard-read", "clipboard-write"])
    page = await open_signed_in(browser, web_app, context=ctx)
    errors = PageErrors(page)
    await send(page, "code please")
    reply = page.locator(".msg.assistant[data-state=done]")
    await expect(reply).to_have_count(1)
    blocks = reply.locator("pre")
    await expect(blocks).to_have_count(2)
    code = blocks.first.locator("code")
    await expect(code).to_have_text(PYTHON)
    await expect(code.locator("span.hljs-keyword").first).to_have_text("def")
    await expect(code.locator("span.hljs-string")).to_have_text('"<b>hi</b>"')
    await expect(code.locator("span.hljs-comment")).to_have_text("# say <i>hi</i>")
    assert await code.locator(".hljs-keyword").first.evaluate(COLOUR) != await code.evaluate(COLOUR)
    assert await blocks.nth(1).locator("code span").count() == 0
    await expect(blocks.nth(1).locator("code")).to_have_text("plain <b>text</b>\n")
    # Raw HTML in the reply is shown as text, so no class can be smuggled in beside the code.
    assert await reply.locator(".body [class]:not(pre [class])").count() == 0
    await expect(reply.locator(".body")).to_contain_text(
        '<span class="hljs-keyword">not code</span>')
    assert await reply.locator("b, i, img, script").count() == 0
    await blocks.first.get_by_role("button", name="Copy code").click()
    assert await page.evaluate("navigator.clipboard.readText()") == PYTHON
    assert errors.items == []


@pytest.mark.parametrize("scheme", ["light", "dark"])
async def test_code_colours_follow_the_colour_scheme(browser: Browser, web_app: App,
                                                     fake_openai: FakeOpenAI,
                                                     scheme: Literal["light", "dark"]) -> None:
    """Keywords take the theme's colour for the system's scheme (a dark one on light, a light one
    on dark), and axe-core finds no serious contrast or other violation in the highlighted reply."""
    fake_openai.script(Behaviour(reply=f"```python\n{PYTHON}```\n"))
    ctx = await browser.new_context(color_scheme=scheme, bypass_csp=True)  # for the audit script
    page = await open_signed_in(browser, web_app, context=ctx)
    await send(page, "code please")
    keyword = page.locator(".msg.assistant[data-state=done] pre .hljs-keyword").first
    await expect(keyword).to_have_text("def")
    expected = {"light": "rgb(179, 23, 59)", "dark": "rgb(255, 123, 114)"}[scheme]
    assert await keyword.evaluate(COLOUR) == expected
    assert await serious(page, f"highlighted code, {scheme}") == []


async def test_long_code_line_scrolls_inside_its_block(browser: Browser, web_app: App,
                                                       fake_openai: FakeOpenAI) -> None:
    """At 390 px a code line wider than the window scrolls inside its block; the message
    stays in view."""
    long_line = "print(" + " + ".join(f'"part {i}"' for i in range(12)) + ")\n"
    fake_openai.script(Behaviour(reply=f"```python\n{long_line}```\n"))
    ctx = await browser.new_context(viewport={"width": 390, "height": 844})
    page = await open_signed_in(browser, web_app, context=ctx)
    await send(page, "a long line")
    reply = page.locator(".msg.assistant[data-state=done]")
    await expect(reply).to_have_count(1)
    box = await reply.bounding_box()
    assert box and box["x"] + box["width"] <= 390, box
    assert await reply.locator("pre").evaluate("el => el.scrollWidth > el.clientWidth")
