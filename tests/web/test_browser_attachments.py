"""Attachments in the web client, in a real Chromium against the real gateway and the loopback
model: the 📎 file input, drag-and-drop, removable chips, and the files shown in history."""

from __future__ import annotations

import pytest

pytest.importorskip("playwright.async_api",
                    reason="playwright is not installed (pip install -e '.[dev]')")

from playwright.async_api import Browser, FilePayload, expect  # noqa: E402

from gateway.app import App
from tests.fake_openai import FakeOpenAI
from tests.web.conftest import PageErrors, open_signed_in, send


async def test_attached_text_file_reaches_the_model_and_shows_in_history(
    browser: Browser, web_app: App, fake_openai: FakeOpenAI
) -> None:
    """A file picked with 📎 shows as a chip (a removed one is not sent), its text reaches the
    model with the message, and the sent message shows the file's name after a reload."""
    page = await open_signed_in(browser, web_app)
    errors = PageErrors(page)
    files: list[FilePayload] = [
        {"name": "notes.txt", "mimeType": "text/plain",
         "buffer": b"The launch code is periwinkle."},
        {"name": "drop-me.txt", "mimeType": "text/plain", "buffer": b"never sent"},
    ]
    await page.set_input_files("#attach-input", files)
    chips = page.locator("#attach-chips li")
    await expect(chips).to_have_count(2)
    await page.get_by_role("button", name="Remove drop-me.txt").click()
    await expect(chips).to_have_count(1)
    await expect(chips.first).to_contain_text("notes.txt")
    await send(page, "Read my notes")
    await expect(page.locator("#attach-chips")).to_be_hidden()
    await expect(page.locator("li.msg.assistant[data-state=done]")).to_have_count(1)
    sent = fake_openai.chat_requests[-1].json["messages"][-1]["content"]
    assert "[file: notes.txt]" in sent and "periwinkle" in sent and "never sent" not in sent
    await page.reload()
    await page.wait_for_selector("#conn-state[data-state=open]")
    await expect(page.locator("li.msg.user .msg-files li")).to_contain_text("notes.txt")
    assert errors.items == []


async def test_a_file_dropped_on_the_composer_is_attached(browser: Browser, web_app: App) -> None:
    """Dropping a file on the composer adds its chip, as the 📎 button does."""
    page = await open_signed_in(browser, web_app)
    await page.evaluate("""() => {
        const dt = new DataTransfer();
        dt.items.add(new File(["print('hi')"], "hello.py", { type: "" }));
        const form = document.getElementById("composer");
        const opts = { dataTransfer: dt, bubbles: true, cancelable: true };
        form.dispatchEvent(new DragEvent("dragover", opts));
        form.dispatchEvent(new DragEvent("drop", opts));
    }""")
    await expect(page.locator("#attach-chips li")).to_contain_text("hello.py")
