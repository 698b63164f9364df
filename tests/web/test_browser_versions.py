"""Versions in a real Chromium: ‹ 1/2 › on a regenerated reply browses its versions (the chosen
one what the model sees next), and Edit on an earlier user message forks, its old branch one ‹
away."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

pytest.importorskip("playwright.async_api",
                    reason="playwright is not installed (pip install -e '.[dev]')")

from playwright.async_api import Browser, expect  # noqa: E402

from gateway.app import App
from gateway.config import Config
from tests.conftest import running
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.web.conftest import PageErrors, new_session, open_signed_in, send


@pytest.fixture
async def app(config_factory: Callable[..., Config], fake_openai: FakeOpenAI) -> AsyncIterator[App]:
    """The gateway with the loopback model and no model-written titles (each request is
    scripted)."""
    cfg = config_factory(llm={"base_url": fake_openai.base_url, "api_key": "sk-test",
                              "model": "fake-model", "timeout_s": 10.0, "max_retries": 0},
                         chat={"auto_title": False})
    async with running(cfg) as a:
        yield a


async def test_regenerated_reply_versions_are_browsable(browser: Browser, app: App,
                                                        fake_openai: FakeOpenAI) -> None:
    """Regenerate shows 2/2 on the reply; ‹ brings back the first reply (1/2), and the next
    message's prompt holds that first reply, not the regenerated one."""
    page = await open_signed_in(browser, app)
    errors = PageErrors(page)
    await new_session(page)
    fake_openai.script(Behaviour(reply="Owls hunt at night."))
    await send(page, "when do owls hunt?")
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(1)
    fake_openai.script(Behaviour(reply="Owls hunt at dusk."))
    await page.get_by_role("button", name="Regenerate").click()
    reply = page.locator(".msg.assistant").last
    await expect(reply).to_contain_text("Owls hunt at dusk.")
    await expect(reply.locator(".version-index")).to_have_text("2/2")
    await reply.get_by_role("button", name="Previous version").click()
    reply = page.locator(".msg.assistant").last
    await expect(reply).to_contain_text("Owls hunt at night.")
    await expect(reply.locator(".version-index")).to_have_text("1/2")
    await expect(page.locator(".msg.assistant")).to_have_count(1)
    await send(page, "and in winter?")
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(2)
    sent = [m["content"] for m in fake_openai.chat_requests[-1].json["messages"]
            if m["role"] != "system"]
    assert sent == ["when do owls hunt?", "Owls hunt at night.", "and in winter?"]
    assert errors.items == []


async def test_edit_an_earlier_message_forks(browser: Browser, app: App) -> None:
    """Edit on the first of two user messages answers the new text with the later turn gone; the
    edited message shows 2/2, and ‹ brings the old branch back whole."""
    page = await open_signed_in(browser, app)
    errors = PageErrors(page)
    await new_session(page)
    await send(page, "one")
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(1)
    await send(page, "two")
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(2)
    await expect(page.get_by_role("button", name="Edit", exact=True)).to_have_count(2)
    await page.locator(".msg.user").first.get_by_role("button", name="Edit", exact=True).click()
    await page.get_by_role("textbox", name="Edit message").fill("uno")
    await page.get_by_role("textbox", name="Edit message").press("Enter")
    await expect(page.locator(".msg.assistant").last).to_contain_text("Echo: uno")
    await expect(page.locator(".msg")).to_have_count(2)
    first = page.locator(".msg.user").first
    await expect(first.locator(".version-index")).to_have_text("2/2")
    await first.get_by_role("button", name="Previous version").click()
    await expect(page.locator(".msg .body")).to_have_text(["one", "Echo: one", "two", "Echo: two"])
    await expect(page.locator(".msg.user").first.locator(".version-index")).to_have_text("1/2")
    assert errors.items == []
