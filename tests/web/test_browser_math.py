"""Math in replies ($…$ inline, $$…$$ display) is typeset by the vendored KaTeX as MathML under
the page's strict CSP, while prices in prose and code keep their dollars as written."""

from __future__ import annotations

import pytest

pytest.importorskip("playwright.async_api",
                    reason="playwright is not installed (pip install -e '.[dev]')")

from playwright.async_api import Browser, ConsoleMessage, Page, expect  # noqa: E402

from gateway.app import App
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.web.conftest import PageErrors, open_signed_in, send

REPLY = ("Einstein: $E=mc^2$, and the area:\n\n$$\\int_0^1 x\\,dx$$\n\n"
         "It costs $5 and $10 today; broken $\\frac{$ stays text.\n\n"
         "Inline `$x$` and a block:\n\n```\nlet $x$ = 1\n```\n")


def csp_messages(page: Page) -> list[str]:
    """Every console message of `page` (any level) that mentions the Content Security Policy."""
    seen: list[str] = []

    def on_console(msg: ConsoleMessage) -> None:
        if "Content Security Policy" in msg.text or "Trusted Type" in msg.text:
            seen.append(msg.text)

    page.on("console", on_console)
    return seen


async def test_math_is_typeset_and_prices_and_code_are_not(browser: Browser, web_app: App,
                                                           fake_openai: FakeOpenAI) -> None:
    """$E=mc^2$ becomes inline KaTeX MathML and $$…$$ a display block (its TeX kept whole
    through markdown), "$5 and $10", unparsable TeX and code keep their text, and the page logs
    no CSP, Trusted Types or other error."""
    fake_openai.script(Behaviour(reply=REPLY, deltas=5))
    page = await open_signed_in(browser, web_app)
    errors = PageErrors(page)
    csp = csp_messages(page)
    await send(page, "math please")
    body = page.locator(".msg.assistant[data-state=done] .body")
    await expect(body).to_have_count(1)
    await expect(body.locator(".katex")).to_have_count(2)
    inline = body.locator(".katex-inline .katex")
    await expect(inline).to_have_count(1)
    assert await inline.locator("annotation").text_content() == "E=mc^2"
    display = body.locator(".katex-display .katex math[display=block]")
    await expect(display).to_have_count(1)
    assert await display.locator("annotation").text_content() == "\\int_0^1 x\\,dx"
    await expect(body).to_contain_text("It costs $5 and $10 today; broken $\\frac{$ stays text.")
    await expect(body.locator("p > code")).to_have_text("$x$")
    await expect(body.locator("pre code")).to_have_text("let $x$ = 1\n")
    assert await body.locator("code .katex, pre .katex").count() == 0
    assert csp == [] and errors.items == []


async def test_prose_with_dollars_renders_no_math(browser: Browser, web_app: App,
                                                  fake_openai: FakeOpenAI) -> None:
    """A reply that only mentions prices ("costs $5 and $10") renders no .katex at all."""
    fake_openai.script(Behaviour(reply="It costs $5 and $10, or $ 3 $ at most.\n"))
    page = await open_signed_in(browser, web_app)
    csp = csp_messages(page)
    await send(page, "prices")
    body = page.locator(".msg.assistant[data-state=done] .body")
    await expect(body).to_have_text("It costs $5 and $10, or $ 3 $ at most.")
    assert await body.locator(".katex").count() == 0
    assert csp == []
