"""``make screenshots``: PNGs of the web client's main views, light and dark, into docs/img/.

Starts the real gateway with the loopback model on a scratch data dir, seeds a history of
conversations over several weeks (the newest recalls an older one) and a few remembered facts,
offers three models, and photographs: sign-in, the empty chat with its model picker, a chat with
recalled memories and a highlighted code block, a sidebar row's session menu, the memory search
panel, the Facts panel, and a narrow window. Needs the same Chromium as tests/web.

    python -m tests.web.screenshots [OUT_DIR]
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gateway.client import Client
from testkit.fake_openai import FakeOpenAI
from testkit.gateway import TOKEN, make_config, running_gateway

OUT = Path(__file__).resolve().parents[2] / "docs" / "img"

REPLIES = {
    "evening": "Evenings in mid-March drop to about 11 °C by the river: add a warm jumper "
               "and a scarf.",
    "flying": "Noted: **Lisbon, 14–18 March**, staying near Alfama. Want a day-by-day plan?",
    "pack": ("For Lisbon in mid-March (you fly on the 14th):\n\n"
             "- a light rain jacket: showers are common\n- comfortable shoes for Alfama's hills\n"
             "- layers: days around 17 °C, evenings cooler\n\nA quick packing check in Python:\n\n"
             "```python\ndef missing(packed: set[str]) -> list[str]:\n"
             "    needed = {\"jacket\", \"shoes\", \"charger\"}  # the essentials\n"
             "    return sorted(needed - packed)\n\nprint(missing({\"shoes\"}))\n```"),
}


# Older conversations, written straight into the store with their dates: (title, days ago, said,
# answered). Kept out of memory: the loopback model's embeddings find every text alike, and the
# shots should show the one memory that a real embedder would recall.
HISTORY = (
    ("Flaky CI job", 0, "Our CI job fails one run in ten with 'address already in use'.",
     "Two tests bind the same fixed port. Bind port 0 and read the port back instead."),
    ("Sourdough starter", 1, "My sourdough starter smells like acetone, is it dead?",
     "Not dead, just hungry: feed it twice a day at a 1:1:1 ratio for a few days."),
    ("Quarterly taxes", 3, "Remind me how the quarterly VAT return works for freelancers.",
     "You file every quarter by the 15th of the second month after it; keep every invoice."),
    ("Book club: The Overstory", 5, "Questions for our book club on The Overstory?",
     "Which character's tree stayed with you, and why does the novel start with roots?"),
    ("Half-marathon plan", 12, "I want to run a half-marathon in May. I can run 8 km now.",
     "A 12-week plan: three runs a week, one long run growing by 1-2 km each week."),
    ("Birthday ideas for Luna", 40, "Luna turns 5 in June. Ideas for a small party at home?",
     "A treasure hunt in the garden, cupcakes to decorate, and a paper-crown table."),
)

FACTS = ("I am vegetarian", "My daughter Luna is 4 years old", "I prefer window seats on flights",
         "I work as a nurse in Porto")


def reply_for(messages: list[dict[str, Any]]) -> str:
    last = next(m["content"] for m in reversed(messages) if m["role"] == "user")
    return next((text for word, text in REPLIES.items() if word in last.lower()), "Sure.")


async def seed(app: Any) -> None:
    now = datetime.now(UTC)
    for title, days, said, answered in HISTORY:
        when = now - timedelta(days=days, hours=2)
        s = await asyncio.to_thread(app.store.create, "default", title=title, created_at=when,
                                    memory=False)
        for role, text in (("user", said), ("assistant", answered)):
            await asyncio.to_thread(app.store.append_message, "default", s.session_key, role=role,
                                    content=text, ts=when)
    async with Client.connect(app.url, TOKEN) as c:
        for title, message in (("Lisbon trip",
                                "I'm flying to Lisbon on 14 March, staying near Alfama."),):
            key = (await c.call("sessions.create", {"title": title}))["sessionKey"]
            await c.call("chat.send", {"sessionKey": key, "message": message})
            await c.next_event("chat.final")
        for fact in FACTS:
            await c.call("memory.facts.add", {"text": fact})
        async with asyncio.timeout(20):
            while not (await c.call("memory.search", {"query": "Lisbon Alfama"}))["results"]:
                await asyncio.sleep(0.05)


async def shoot(out: Path) -> list[Path]:
    from playwright.async_api import async_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("screenshots: no chromium on PATH (apt-get install chromium)")
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    fake = FakeOpenAI()
    await fake.start()
    fake.configure(reply=reply_for, delta_delay_s=0.0)
    with tempfile.TemporaryDirectory() as tmp:
        llm = {"base_url": fake.base_url, "api_key": "k", "model": "gpt-4.1-mini",
               "models": ["gpt-4.1", "o4-mini"]}
        cfg = make_config(Path(tmp) / "data", llm=llm,
                          memory={"embedder": "openai", "debounce_ms": 20})
        async with running_gateway(cfg) as app, async_playwright() as p:
            await seed(app)
            url = f"http://127.0.0.1:{app.server.port}/"
            browser = await p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            for scheme in ("light", "dark"):
                ctx = await browser.new_context(viewport={"width": 1280, "height": 800},
                                                color_scheme=scheme)
                page = await ctx.new_page()
                await page.goto(url)
                await page.wait_for_selector("#signin:not([hidden])")
                written.append(await _snap(page, out / f"web-signin-{scheme}.png"))
                await page.fill("#token-input", TOKEN)
                await page.click("#signin-button")
                await page.wait_for_selector("#conn-state[data-state=open]")
                await page.click("#new-session")
                await page.wait_for_selector("#welcome:not([hidden])")
                written.append(await _snap(page, out / f"web-empty-{scheme}.png"))
                if scheme == "light":
                    await page.fill("#message-input", "What should I pack for my trip?")
                    await page.press("#message-input", "Enter")
                    await page.wait_for_selector(".msg.assistant .chip")
                    await page.click("#rename-session")
                    await page.fill("#edit-text", "Packing list")
                    await page.click("#edit-save")
                else:
                    # A follow-up in the same chat: a reply recalls live (chips are not kept in
                    # the transcript), so the dark shot shows the Recalled block too.
                    await page.click("#session-list .session")
                    await page.wait_for_selector(".msg.assistant[data-state=done]")
                    await page.fill("#message-input", "And what should I pack for the evenings?")
                    await page.press("#message-input", "Enter")
                    await page.wait_for_selector(".msg.assistant .chip")
                    await page.locator("#scroller").evaluate(
                        "el => { el.scrollTop = el.scrollHeight; }")
                await page.wait_for_selector("#memory-status:not(:empty)")
                written.append(await _snap(page, out / f"web-chat-{scheme}.png"))
                await page.get_by_role("button", name="Actions for Lisbon trip").click()
                await page.wait_for_selector("#row-menu:not([hidden])")
                written.append(await _snap(page, out / f"web-menu-{scheme}.png"))
                await page.keyboard.press("Escape")
                await page.click("#open-search")
                await page.fill("#search-query", "Lisbon Alfama")
                await page.press("#search-query", "Enter")
                await page.wait_for_selector("#search-results .result")
                written.append(await _snap(page, out / f"web-search-{scheme}.png"))
                await page.click("#open-facts")
                await page.wait_for_selector("#facts-list .fact")
                written.append(await _snap(page, out / f"web-facts-{scheme}.png"))
                await page.click("#close-facts")
                await page.set_viewport_size({"width": 390, "height": 800})
                await page.wait_for_timeout(100)
                written.append(await _snap(page, out / f"web-narrow-{scheme}.png"))
                await ctx.close()
            await browser.close()
    await fake.close()
    return written


async def _snap(page: Any, path: Path) -> Path:
    await page.wait_for_timeout(150)  # let the last frame of rendering land
    await page.screenshot(path=str(path))
    return path


def main() -> int:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    for path in asyncio.run(shoot(out)):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
