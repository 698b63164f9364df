"""An accessibility audit of the web client with axe-core (vendored in tests/web/vendor/): the
signed-in view with a reply that recalled a memory, the empty chat, the memory search panel
with results, and the 390 px view with its drawer open and closed report no serious or critical
violation."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Literal

import pytest

pytest.importorskip("playwright.async_api",
                    reason="playwright is not installed (pip install -e '.[dev]')")

from playwright.async_api import Browser, Page, expect  # noqa: E402

from gateway.app import App
from tests.web.conftest import new_session, open_signed_in, send, wait_indexed

VENDOR = Path(__file__).with_name("vendor")
AXE = VENDOR / "axe-core" / "axe.min.js"

RUN_AXE = """async () => {
  const result = await axe.run(document, { resultTypes: ["violations"] });
  return result.violations.map((v) => ({ id: v.id, impact: v.impact, help: v.help,
    nodes: v.nodes.slice(0, 5).map((n) => n.target.join(" ")) }));
}"""


def axe_source() -> str:
    """axe-core's file, checked against the sha256 vendor/README.md records."""
    recorded = re.search(r"`axe-core/axe\.min\.js` \| `([0-9a-f]{64})`",
                         (VENDOR / "README.md").read_text("utf-8"))
    assert recorded, "vendor/README.md records no hash for axe-core/axe.min.js"
    data = AXE.read_bytes()
    assert hashlib.sha256(data).hexdigest() == recorded.group(1)
    assert (VENDOR / "axe-core" / "LICENSE").is_file()
    return data.decode("utf-8")


async def serious(page: Page, view: str) -> list[str]:
    """axe's serious and critical violations on the page as it is now, one line each."""
    if not await page.evaluate("typeof window.axe === 'object'"):
        await page.add_script_tag(content=axe_source())
    found: list[dict[str, Any]] = await page.evaluate(RUN_AXE)
    return [f"{view}: {v['id']} ({v['impact']}) {v['help']} at {v['nodes']}"
            for v in found if v["impact"] in ("serious", "critical")]


@pytest.mark.parametrize("scheme", ["light", "dark"])
async def test_axe_finds_no_serious_violation(browser: Browser, web_app: App,
                                              scheme: Literal["light", "dark"]) -> None:
    """Five views, in both colour schemes, pass axe-core's rules at serious and critical impact."""
    # The audit script is injected as a tag: the page's CSP (rightly) admits no inline script
    # and its Trusted Types would refuse axe's own DOM writes; the page's behaviour is unchanged.
    ctx = await browser.new_context(bypass_csp=True, color_scheme=scheme)
    page = await open_signed_in(browser, web_app, context=ctx)
    problems = await serious(page, "empty chat")
    await send(page, "My favourite programming language is **Rust**, for its compiler.")
    await expect(page.locator(".msg.assistant[data-state=done]")).to_have_count(1)
    await wait_indexed(web_app, "favourite programming language")
    await new_session(page)
    await send(page, "Which programming language do I like?")
    await expect(page.locator(".msg.assistant .recalled .chip")).to_have_count(1)
    problems += await serious(page, "a reply with recalled memories")
    await page.get_by_role("button", name="Search memory").click()
    await page.get_by_label("Query").fill("programming language")
    await page.locator("#search-form").get_by_role("button", name="Search").click()
    await expect(page.locator("#search-results .result").first).to_be_visible()
    problems += await serious(page, "search panel")
    await page.get_by_role("button", name="Close search").click()
    await page.set_viewport_size({"width": 390, "height": 844})
    await expect(page.locator("#sidebar")).to_be_hidden()
    problems += await serious(page, "390 px")
    await page.get_by_role("button", name="Show or hide sessions").click()
    await expect(page.locator("#backdrop")).to_be_visible()
    problems += await serious(page, "390 px, sessions drawer")
    assert problems == []
