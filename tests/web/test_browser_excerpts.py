"""Memory excerpts in a real Chromium read as plain text: a markdown table as its cells, a
fenced block's code on its own lines."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("playwright.async_api",
                    reason="playwright is not installed (pip install -e '.[dev]')")

from playwright.async_api import Browser, expect  # noqa: E402

from gateway.app import App
from gateway.client import Client
from tests.conftest import TOKEN
from tests.web.conftest import PageErrors, open_signed_in, wait_indexed

REPLY = ("Here is the comparison you asked for:\n\n"
         "| lang | typing |\n| --- | :---: |\n| Rust | **static** |\n| Python | dynamic |\n\n"
         "And the greeting:\n\n```python\ndef greet(name):\n"
         "    return f\"hi {name}\"  # *kept*\n```\n")


async def test_search_excerpt_shows_table_cells_and_code_lines(browser: Browser,
                                                               web_app: App) -> None:
    """A search result's excerpt drops a table's pipes and rule row, keeping its cells row by
    row, and shows fenced code line by line as written, with no fence or emphasis marks."""
    store = web_app.store
    s = await asyncio.to_thread(store.create, "default", title="Languages")
    await asyncio.to_thread(store.append_message, "default", s.session_key, role="user",
                            content="Compare the typing of Rust and Python")
    await asyncio.to_thread(store.append_message, "default", s.session_key, role="assistant",
                            content=REPLY)
    async with Client.connect(web_app.url, TOKEN) as c:  # written past the gateway:
                                                         # have it read them
        await c.call("memory.reindex")
    await wait_indexed(web_app, "typing Rust Python greeting")
    page = await open_signed_in(browser, web_app)
    errors = PageErrors(page)
    await page.get_by_role("button", name="Search memory").click()
    await page.get_by_label("Query").fill("typing Rust Python greeting")
    await page.locator("#search-form").get_by_role("button", name="Search").click()
    excerpt = page.locator("#search-results .result .excerpt").first
    await expect(excerpt).to_contain_text("lang · typing")
    lines = (await excerpt.inner_text()).splitlines()
    assert ("lang · typing" in lines and "Rust · static" in lines
            and "Python · dynamic" in lines), lines
    assert "def greet(name):" in lines and '    return f"hi {name}"  # *kept*' in lines, lines
    text = "\n".join(lines)
    assert "|" not in text and "---" not in text and "```" not in text and "**" not in text, text
    assert errors.items == []
