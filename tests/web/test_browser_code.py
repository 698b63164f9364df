"""A `#code=` link (what `recalld open` hands the browser instead of the token, issue 22 N7) in
a real Chromium: the page redeems the one-time code for the session, a spent code signs nothing
in and says so, and a code for another user asks first like a `#token=` link (N6)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

pytest.importorskip("playwright.async_api",
                    reason="playwright is not installed (pip install -e '.[dev]')")

from playwright.async_api import Browser, expect  # noqa: E402

from gateway.app import App
from gateway.client import Client
from gateway.config import Config
from tests.conftest import running
from tests.web.conftest import page_url
from tests.web.test_browser_account import ALICE, BOB, signed_in_as


@pytest.fixture
async def two_users(config_factory: Callable[..., Config]) -> AsyncIterator[App]:
    users = [{"name": "alice", "token": ALICE}, {"name": "bob", "token": BOB}]
    async with running(config_factory(auth={"users": users, "token": None})) as app:
        yield app


async def code_for(app: App, token: str) -> str:
    async with Client.connect(app.url, token) as c:
        return str((await c.call("auth.code"))["code"])


async def test_a_code_link_signs_in_once(browser: Browser, two_users: App) -> None:
    """A fresh tab opened at #code= signs in as the code's user, drops the fragment and keeps the
    token for the tab; the same link in another fresh tab shows the sign-in form saying it was
    used or expired, and stores nothing."""
    code = await code_for(two_users, BOB)
    page = await (await browser.new_context()).new_page()
    await page.goto(page_url(two_users) + f"#code={code}")
    await signed_in_as(page, "bob")
    assert "code" not in page.url
    assert await page.evaluate("sessionStorage.getItem('recalld.token')") == BOB

    again = await (await browser.new_context()).new_page()
    await again.goto(page_url(two_users) + f"#code={code}")
    await expect(again.locator("#signin")).to_be_visible()
    await expect(again.locator("#signin-error")).to_contain_text("already used or has expired")
    await expect(again.locator("#app")).to_be_hidden()
    assert "code" not in again.url
    assert await again.evaluate(
        "sessionStorage.getItem('recalld.token') || localStorage.getItem('recalld.token')") is None


async def test_a_code_for_another_user_asks_first(browser: Browser, two_users: App) -> None:
    """With alice remembered, a code link of bob's asks, naming both, and changes nothing until
    confirmed; "Switch" then signs in as bob with bob's token kept, and a code of the signed-in
    user's own, followed inside the open tab, asks nothing."""
    ctx = await browser.new_context()
    page = await ctx.new_page()
    await page.goto(page_url(two_users))
    await page.get_by_label("Token", exact=True).fill(ALICE)
    await page.get_by_label("Remember on this device").check()
    await page.get_by_role("button", name="Sign in").click()
    await signed_in_as(page, "alice")

    other = await ctx.new_page()
    await other.goto(page_url(two_users) + f"#code={await code_for(two_users, BOB)}")
    question = other.locator("#switch")
    await expect(question).to_be_visible()
    await expect(question).to_contain_text("This link signs in as bob")
    await expect(question).to_contain_text("signed in as alice")
    assert "code" not in other.url
    assert await other.evaluate("localStorage.getItem('recalld.token')") == ALICE
    await other.get_by_role("button", name="Switch to bob").click()
    await signed_in_as(other, "bob")
    assert await other.evaluate("localStorage.getItem('recalld.token')") == BOB

    await other.goto(page_url(two_users) + f"#code={await code_for(two_users, BOB)}")
    await signed_in_as(other, "bob")
    await expect(question).to_be_hidden()
    assert "code" not in other.url
