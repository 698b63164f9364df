"""An open chat's model and reply settings in the page: the header's model select switches the
session's model (sessions.update {model}), the Reply settings popover sets its temperature and
max tokens, and a reply cut at the length limit gets a Continue button that writes it on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

pytest.importorskip("playwright.async_api",
                    reason="playwright is not installed (pip install -e '.[dev]')")

from playwright.async_api import Browser, expect  # noqa: E402

from gateway.app import App
from gateway.client import Client
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.web.conftest import PageErrors, open_session_key, open_signed_in, send


@pytest.fixture
async def tuned_app(config_factory: Callable[..., Config],
                    fake_openai: FakeOpenAI) -> AsyncIterator[App]:
    """Two models to switch between and an operator bound of 1.0 on temperature."""
    cfg = config_factory(
        llm={"base_url": fake_openai.base_url, "api_key": "sk-test", "model": "fake-model",
             "models": ["fake-large"], "timeout_s": 10.0, "max_retries": 0, "max_temperature": 1.0},
        chat={"auto_title": False, "compaction": False},
    )
    async with running(cfg) as app:
        yield app


async def _session(app: App, key: str) -> dict[str, object]:
    async with Client.connect(app.url, TOKEN) as c:
        return dict(await c.call("sessions.get", {"sessionKey": key}))


async def _until_model(app: App, key: str, model: str) -> None:
    """Wait for the page's sessions.update to land (the select answers before the gateway does)."""
    async with asyncio.timeout(10):
        while (await _session(app, key)).get("model") != model:
            await asyncio.sleep(0.05)


def _asked(fake: FakeOpenAI, text: str) -> list[dict[str, object]]:
    return [r.json for r in fake.chat_requests if text in str(r.json["messages"][-1])]


async def test_header_switches_the_model_of_an_open_chat(browser: Browser, tuned_app: App,
                                                         fake_openai: FakeOpenAI) -> None:
    """The open chat's header shows its model; choosing another stores it on the session, the
    next reply comes from it, and a reload shows it still chosen."""
    page = await open_signed_in(browser, tuned_app)
    errors = PageErrors(page)
    await send(page, "first words")
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(1)
    key = await open_session_key(page)
    header = page.get_by_role("combobox", name="Model of this chat")
    await expect(header).to_be_visible()
    await expect(header.locator("option")).to_have_text(["fake-model", "fake-large"])
    await expect(header).to_have_value("fake-model")
    await header.select_option("fake-large")
    await expect(page.locator("#tune-session")).to_have_attribute("aria-expanded", "false")
    await _until_model(tuned_app, key, "fake-large")
    await send(page, "second words")
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(2)
    assert [b["model"] for b in _asked(fake_openai, "second words")] == ["fake-large"]
    await page.reload()
    await page.wait_for_selector("#conn-state[data-state=open]")
    await expect(page.get_by_role("combobox", name="Model of this chat")).to_have_value(
        "fake-large")
    assert errors.items == []


async def test_reply_settings_set_temperature_and_max_tokens(browser: Browser, tuned_app: App,
                                                             fake_openai: FakeOpenAI) -> None:
    """The Reply settings popover saves a temperature and max tokens the next reply is asked
    with; a value past the operator's bound is refused there with the gateway's reason."""
    page = await open_signed_in(browser, tuned_app)
    errors = PageErrors(page)
    await send(page, "hello there")
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(1)
    key = await open_session_key(page)
    await page.get_by_role("button", name="Reply settings").click()
    await page.get_by_label("Temperature").fill("3")
    await page.get_by_role("button", name="Save").click()
    await expect(page.locator("#tune-error")).to_contain_text("temperature")
    await page.get_by_label("Temperature").fill("0.4")
    await page.get_by_label("Max tokens").fill("64")
    await page.get_by_role("button", name="Save").click()
    await expect(page.locator("#tune-menu")).to_be_hidden()
    session = await _session(tuned_app, key)
    assert (session["temperature"], session["maxTokens"]) == (0.4, 64)
    await send(page, "tuned words")
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(2)
    [body] = _asked(fake_openai, "tuned words")
    assert (body["temperature"], body["max_tokens"]) == (0.4, 64)
    await page.get_by_role("button", name="Reply settings").click()
    await expect(page.get_by_label("Max tokens")).to_have_value("64")
    await page.get_by_role("button", name="Defaults").click()
    await expect(page.locator("#tune-menu")).to_be_hidden()
    assert "temperature" not in await _session(tuned_app, key)
    assert errors.items == []


async def test_continue_writes_on_a_reply_cut_by_length(browser: Browser, tuned_app: App,
                                                        fake_openai: FakeOpenAI) -> None:
    """A reply that stopped at the length limit offers Continue; clicking it grows the same
    reply (one assistant message, the whole text) and the button goes once it finished."""
    page = await open_signed_in(browser, tuned_app)
    errors = PageErrors(page)
    fake_openai.script(Behaviour(reply="Once upon a time", finish_reason="length"),
                       Behaviour(reply=" they lived happily."))
    await send(page, "tell me a story")
    reply = page.locator(".msg.assistant[data-state=done]")
    await expect(reply).to_have_count(1)
    cont = page.get_by_role("button", name="Continue")
    await expect(cont).to_be_visible()
    await cont.click()
    await expect(reply.locator(".body")).to_have_text("Once upon a time they lived happily.")
    await expect(page.locator(".msg.assistant")).to_have_count(1)
    await expect(cont).to_have_count(0)
    await expect(page.get_by_role("button", name="Regenerate")).to_be_visible()
    assert errors.items == []
