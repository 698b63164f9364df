"""The model picker, fed by models.list: with one model allowed the welcome names it; with
several a "Model" select chooses the model of the next new session (sessions.create {model}),
remembered for later new chats."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

pytest.importorskip("playwright.async_api",
                    reason="playwright is not installed (pip install -e '.[dev]')")

from playwright.async_api import Browser, expect  # noqa: E402

from gateway.app import App
from gateway.client import Client
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.fake_openai import FakeOpenAI
from tests.web.conftest import PageErrors, new_session, open_session_key, open_signed_in, send
from tests.web.test_browser_audit import serious


@pytest.fixture
async def two_model_app(config_factory: Callable[..., Config],
                        fake_openai: FakeOpenAI) -> AsyncIterator[App]:
    """The gateway with the loopback model as default and a second one sessions may pick."""
    cfg = config_factory(
        llm={"base_url": fake_openai.base_url, "api_key": "sk-test", "model": "fake-model",
             "models": ["fake-large"], "timeout_s": 10.0, "max_retries": 0},
        memory={"embedder": "openai", "debounce_ms": 20},
    )
    async with running(cfg) as app:
        yield app


async def session_model(app: App, key: str) -> str | None:
    async with Client.connect(app.url, TOKEN) as c:
        model = (await c.call("sessions.get", {"sessionKey": key})).get("model")
    return None if model is None else str(model)


def asked_with(fake: FakeOpenAI, text: str) -> set[str]:
    """The models upstream was asked for by the runs whose prompt held ``text``."""
    return {r.json["model"] for r in fake.chat_requests if text in str(r.json["messages"])}


async def test_one_model_is_named_without_a_picker(browser: Browser, web_app: App) -> None:
    """With only llm.model allowed there is nothing to pick: the welcome names the model."""
    page = await open_signed_in(browser, web_app)
    await expect(page.locator("#welcome")).to_contain_text("Replies come from fake-model.")
    await expect(page.get_by_role("combobox", name="Model")).to_have_count(0)


async def test_picked_model_is_used_by_the_next_new_session(browser: Browser, two_model_app: App,
                                                            fake_openai: FakeOpenAI) -> None:
    """The "Model" select lists the allowed models with the default chosen; the model picked
    there is the new session's (its runs ask upstream for it), stays picked for the next new
    chat and after a reload, and picking the default again creates a session without a model."""
    page = await open_signed_in(browser, two_model_app)
    errors = PageErrors(page)
    picker = page.get_by_role("combobox", name="Model")
    await expect(picker).to_be_visible()
    await expect(picker.locator("option")).to_have_text(["fake-model", "fake-large"])
    await expect(picker).to_have_value("fake-model")
    await picker.select_option("fake-large")
    await send(page, "Which model answers?")
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(1)
    key = await open_session_key(page)
    assert await session_model(two_model_app, key) == "fake-large"
    assert asked_with(fake_openai, "Which model answers?") == {"fake-large"}
    await new_session(page)
    await expect(picker).to_have_value("fake-large")
    await page.reload()
    await page.wait_for_selector("#conn-state[data-state=open]")
    await new_session(page)
    await expect(picker).to_have_value("fake-large")
    await picker.select_option("fake-model")
    await send(page, "And now?")
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(1)
    second = await open_session_key(page)
    assert second != key
    assert await session_model(two_model_app, second) is None
    assert asked_with(fake_openai, "And now?") == {"fake-model"}
    assert errors.items == []


async def test_welcome_with_the_picker_passes_axe(browser: Browser, two_model_app: App) -> None:
    """The welcome holding the "Model" select has no serious or critical axe-core violation."""
    ctx = await browser.new_context(bypass_csp=True)  # for the injected audit script only
    page = await open_signed_in(browser, two_model_app, context=ctx)
    await expect(page.get_by_role("combobox", name="Model")).to_be_visible()
    assert await serious(page, "welcome with the model picker") == []
