"""The page as an installable app: Chromium's own installability check finds nothing missing."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("playwright.async_api",
                    reason="playwright is not installed (pip install -e '.[dev]')")

from playwright.async_api import async_playwright  # noqa: E402

from gateway.app import App  # noqa: E402
from tests.web.conftest import CHROMIUM, page_url  # noqa: E402


async def test_chromium_offers_install_app(web_app: App, tmp_path: Path) -> None:
    """In a normal (non-incognito) profile, Page.getInstallabilityErrors reports no error, and
    the parsed manifest names the app, its start URL, standalone display and both PNG icons."""
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    async with async_playwright() as p:
        # A persistent profile: Chromium never offers installation from an incognito context.
        ctx = await p.chromium.launch_persistent_context(str(tmp_path / "profile"),
                                                         executable_path=CHROMIUM,
                                                         args=["--no-sandbox"])
        try:
            page = await ctx.new_page()
            await page.goto(page_url(web_app))
            await page.wait_for_selector("#signin:not([hidden])")
            cdp = await ctx.new_cdp_session(page)
            assert (await cdp.send("Page.getInstallabilityErrors"))["installabilityErrors"] == []
            manifest = (await cdp.send("Page.getAppManifest"))["manifest"]
            assert manifest["name"] == "recalld" and manifest["display"] == "kStandalone"
            assert manifest["startUrl"] == page_url(web_app)
            assert {i["sizes"] for i in manifest["icons"]} >= {"192x192", "512x512"}
        finally:
            await ctx.close()
