"""Who is signed in, in a real Chromium: the page names the user, and a #token= link for another
user (a login CSRF) asks, naming both, before it changes anything."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

pytest.importorskip("playwright.async_api",
                    reason="playwright is not installed (pip install -e '.[dev]')")

from playwright.async_api import Browser, Page, expect  # noqa: E402

from gateway.app import App
from gateway.config import Config
from tests.conftest import running
from tests.web.conftest import page_url

ALICE = "alice-token-0123456789abcdefghij"
BOB = "bob-token-0123456789abcdefghijkl"


@pytest.fixture
async def two_users(config_factory: Callable[..., Config]) -> AsyncIterator[App]:
    users = [{"name": "alice", "token": ALICE}, {"name": "bob", "token": BOB}]
    async with running(config_factory(auth={"users": users, "token": None})) as app:
        yield app


async def signed_in_as(page: Page, user: str) -> None:
    await expect(page.locator("#conn-state")).to_have_attribute("data-state", "open")
    await expect(page.locator("#app")).to_be_visible()
    await expect(page.get_by_role("button", name=f"Account: {user}")).to_be_visible()


async def test_link_for_another_user_asks_before_switching(browser: Browser,
                                                           two_users: App) -> None:
    """With alice remembered, bob's link shows a question naming both users and leaves alice's
    token in place; "Stay" keeps alice signed in, and only "Switch" signs in as bob."""
    ctx = await browser.new_context()
    page = await ctx.new_page()
    await page.goto(page_url(two_users))
    await page.get_by_label("Token", exact=True).fill(ALICE)
    await page.get_by_label("Remember on this device").check()
    await page.get_by_role("button", name="Sign in").click()
    await signed_in_as(page, "alice")
    await page.get_by_role("button", name="Account: alice").click()
    await expect(page.locator("#account-menu")).to_contain_text("Signed in as alice")

    other = await ctx.new_page()
    await other.goto(page_url(two_users) + f"#token={BOB}")
    question = other.locator("#switch")
    await expect(question).to_be_visible()
    await expect(question).to_contain_text("This link signs in as bob")
    await expect(question).to_contain_text("signed in as alice")
    assert "token" not in other.url
    await expect(other.locator("#app")).to_be_hidden()
    assert await other.evaluate("localStorage.getItem('recalld.token')") == ALICE
    assert await other.evaluate("sessionStorage.getItem('recalld.token')") is None
    await other.get_by_role("button", name="Stay signed in as alice").click()
    await signed_in_as(other, "alice")
    assert await other.evaluate("localStorage.getItem('recalld.token')") == ALICE

    # The same link followed inside the open tab (only the fragment changes: no reload).
    await other.goto(page_url(two_users) + f"#token={BOB}")
    await expect(question).to_be_visible()
    assert await other.evaluate("localStorage.getItem('recalld.token')") == ALICE
    await other.get_by_role("button", name="Switch to bob").click()
    await signed_in_as(other, "bob")
    assert await other.evaluate("localStorage.getItem('recalld.token')") == BOB


async def test_link_for_the_same_user_signs_in_without_asking(browser: Browser,
                                                              two_users: App) -> None:
    """A link carrying the signed-in user's own token changes nothing visible: no question."""
    ctx = await browser.new_context()
    page = await ctx.new_page()
    await page.goto(page_url(two_users) + f"#token={BOB}")
    await signed_in_as(page, "bob")
    await page.goto(page_url(two_users) + "#token=" + BOB)
    await page.reload()
    await signed_in_as(page, "bob")
    await expect(page.locator("#switch")).to_be_hidden()
