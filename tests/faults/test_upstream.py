"""The model and embedding endpoints misbehave: refused, hanging, 429 with Retry-After, 500,
cut mid-body, malformed. Each time the acknowledged message is kept, the client learns what
happened, a bystander is served without delay, and the next request works once the fault is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from gateway.client import Client
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.faults.helpers import Acked, check_transcripts, free_port

TERMINAL = ("chat.final", "chat.error", "chat.aborted")


async def run_end(c: Client, run_id: str, timeout: float = 20.0) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            ev = await c.next_event(timeout=timeout)
            if ev["method"] in TERMINAL and ev["params"]["runId"] == run_id:
                return ev


@contextlib.asynccontextmanager
async def bystander(url: str) -> AsyncIterator[list[float]]:
    """Another user of the daemon, polling health and its own history all along."""
    latencies: list[float] = []
    stop = asyncio.Event()

    async def loop() -> None:
        async with Client.connect(url, TOKEN) as c:
            key = (await c.call("sessions.create", {"title": "bystander"}))["sessionKey"]
            while not stop.is_set():
                t0 = time.perf_counter()
                await c.call("gateway.health")
                await c.call("sessions.history", {"sessionKey": key})
                latencies.append(time.perf_counter() - t0)
                await asyncio.sleep(0.01)

    task = asyncio.create_task(loop())
    try:
        yield latencies
    finally:
        stop.set()
        await task


MODEL_FAULTS: list[tuple[str, list[Behaviour], str, int | None]] = [
    # name, scripted behaviours (max_retries=1: a fault must repeat to surface), outcome, status
    ("429-retry-after", [Behaviour(status=429, retry_after=1)], "chat.final", None),
    ("429-twice", [Behaviour(status=429, retry_after=0.2)] * 2, "chat.error", 429),
    ("500-twice", [Behaviour(status=500)] * 2, "chat.error", 500),
    ("500-once", [Behaviour(status=500)], "chat.final", None),
    ("hang", [Behaviour(hang=True)] * 2, "chat.error", None),
    ("stall-mid-stream", [Behaviour(hang_after=2, reply="a b c d e f")], "chat.error", None),
    ("cut-mid-stream", [Behaviour(cut_after=2, reply="a b c d e f")], "chat.error", None),
    ("malformed-sse", [Behaviour(malformed_sse=True, malformed_after=2, reply="a b c d e f")],
     "chat.error", None),
]


async def test_model_endpoint_faults_keep_messages_and_serve_others(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """Every model fault in turn on one daemon (SDK retries on, 1 s timeout): acked user messages
    stay in the transcript, the assistant line records the failure, Retry-After is honoured, the
    session works right after, and a bystander's calls are served throughout."""
    cfg = config_factory(llm={"base_url": fake_openai.base_url, "api_key": "sk-t",
                              "model": "fake-model", "timeout_s": 1.0, "max_retries": 1})
    acked = Acked()
    async with running(cfg) as app, bystander(app.url) as latencies, \
            Client.connect(app.url, TOKEN) as c:
        for name, behaviours, outcome, status in MODEL_FAULTS:
            fake_openai.script(*behaviours)
            key = (await c.call("sessions.create", {"title": name}))["sessionKey"]
            t0 = time.monotonic()
            run_id = (await c.call("chat.send", {"sessionKey": key,
                                                 "message": f"fault {name}"}))["runId"]
            acked.add(key, run_id, f"fault {name}")
            end = await run_end(c, run_id)
            assert end["method"] == outcome, (name, end)
            if outcome == "chat.error":
                assert end["params"]["error"]["code"] == -32010
                assert end["params"]["error"]["data"]["status"] == status, name
                assert end["params"]["error"]["retryable"] is True, name
            if name == "429-retry-after":
                assert time.monotonic() - t0 >= 0.9  # the SDK waited as told
            again = (await c.call("chat.send", {"sessionKey": key, "message": "and now?"}))["runId"]
            acked.add(key, again, "and now?")
            assert (await run_end(c, again))["method"] == "chat.final", name
        lines = check_transcripts(app.config.data_dir, acked)
        for _key, transcript in lines.items():
            title = transcript[0]["title"]
            if title == "bystander":
                continue
            first_reply = transcript[2]
            assert first_reply["role"] == "assistant"
            assert bool(first_reply.get("failed")) == (
                dict((n, o) for n, _, o, _ in MODEL_FAULTS)[title] == "chat.error")
    # The bystander kept being served (how fast is a figure for bench/, not a pass mark).
    assert len(latencies) > 20


async def test_model_endpoint_refused(config_factory: Callable[..., Config]) -> None:
    """Nothing listens at the model's address: chat.error retryable, message kept, daemon fine."""
    cfg = config_factory(llm={"base_url": f"http://127.0.0.1:{free_port()}/v1", "max_retries": 1,
                              "timeout_s": 2.0})
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        run_id = (await c.call("chat.send", {"sessionKey": key, "message": "anyone?"}))["runId"]
        end = await run_end(c, run_id)
        assert end["method"] == "chat.error" and end["params"]["error"]["retryable"] is True
        acked = Acked()
        acked.add(key, run_id, "anyone?")
        check_transcripts(app.config.data_dir, acked)
        assert (await c.call("gateway.health"))["status"] == "ok"


# --- the embedder -----------------------------------------------------------------------------

EMBED_FAULTS: dict[str, list[Behaviour] | None] = {
    "refused": None,
    "hang": [Behaviour(hang=True)] * 50,
    "429": [Behaviour(status=429, retry_after=0.2)] * 50,
    "500": [Behaviour(status=500)] * 50,
    "cut": [Behaviour(cut_after=0)] * 50,
    "malformed": [Behaviour(malformed_sse=True)] * 50,
}


async def _wait_status(c: Client, done: Callable[[dict[str, Any]], bool],
                       timeout: float = 30) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            status: dict[str, Any] = await c.call("memory.status")
            if done(status):
                return status
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("fault", list(EMBED_FAULTS))
async def test_embedder_faults_leave_chunks_pending_and_keyword_search_working(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI, fault: str
) -> None:
    """While the embedder fails, chat goes on, new chunks stay pending but are found by keyword
    (hybrid falls back and says why, promptly), memory.status shows the error; once it recovers a
    reindex embeds everything and vector search is ready."""
    fake_openai.configure_embeddings()
    embed_url = fake_openai.base_url if fault != "refused" else f"http://127.0.0.1:{free_port()}/v1"
    cfg = config_factory(
        llm={"base_url": fake_openai.base_url, "api_key": "sk-t", "model": "fake-model",
             "max_retries": 0},
        memory={"embedder": "openai", "embeddings_base_url": embed_url,
                "embeddings_model": "fake-embed", "embeddings_timeout_s": 0.5,
                "embeddings_max_retries": 1, "debounce_ms": 50})
    if EMBED_FAULTS[fault]:
        fake_openai.script_embeddings(*EMBED_FAULTS[fault])  # type: ignore[misc]
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        run_id = (await c.call("chat.send", {
            "sessionKey": key, "message": "the zebra sleeps under the mango tree"}))["runId"]
        assert (await run_end(c, run_id))["method"] == "chat.final"
        status = await _wait_status(c, lambda s: s["chunks"] > 0 and s["lastError"] is not None)
        assert status["pending"] == status["chunks"] and "embedder" in status["lastError"]
        t0 = time.perf_counter()
        found = await c.call("memory.search", {"query": "zebra mango"})
        assert time.perf_counter() - t0 < 3.0
        assert found["mode"] == "keyword" and len(found["results"]) == 1, found
        second = (await c.call("chat.send", {"sessionKey": key,
                                             "message": "still talking"}))["runId"]
        assert (await run_end(c, second))["method"] == "chat.final"
        if fault == "refused":
            return  # nothing will ever answer at that address; the rest needs a server
        fake_openai._embedding_queue.clear()  # the endpoint recovers
        await c.call("memory.reindex")
        status = await _wait_status(c, lambda s: s["pending"] == 0 and s["lastError"] is None)
        assert status["vectorSearch"]["ready"] is True
        assert (await c.call("memory.search", {"query": "zebra mango"}))["mode"] == "hybrid"
