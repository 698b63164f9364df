"""Episodes: written after runs off the request path, under cooldowns and a cap, merged, checked
for novelty, retried after failures, and recalled by intent with time phrases as date filters."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from gateway.app import App
from gateway.client import Client
from gateway.config import Config
from memory import SUMMARY_INSTRUCTIONS, EpisodeDraft
from testkit.fake_openai import echo_reply
from tests.conftest import TOKEN, running
from tests.fake_openai import Behaviour, FakeOpenAI
from tests.gateway.test_memory_methods import say


def summarising(*answers: dict[str, Any] | str) -> Callable[[list[dict[str, Any]]], str]:
    """A reply function: summary requests get the next scripted answer (the last repeats),
    chat requests the echo."""
    queue = list(answers)

    def reply(messages: list[dict[str, Any]]) -> str:
        if messages and messages[0].get("content") == SUMMARY_INSTRUCTIONS:
            answer = queue.pop(0) if len(queue) > 1 else queue[0]
            return answer if isinstance(answer, str) else orjson.dumps(answer).decode()
        return echo_reply(messages)

    return reply


def config(factory: Callable[..., Config], fake: FakeOpenAI, **memory: Any) -> Config:
    values = {"debounce_ms": 20, "episode_cooldown_turns": 1, "episode_cooldown_minutes": 0,
              "episode_retry_s": 0.05, **memory}
    return factory(llm={"base_url": fake.base_url, "api_key": "sk-test", "model": "fake-model",
                        "max_retries": 0},
                   memory=values, chat={"timezone": "Europe/Berlin"})


def summary_requests(fake: FakeOpenAI) -> list[Any]:
    return [r for r in fake.chat_requests
            if r.json["messages"][0]["content"] == SUMMARY_INSTRUCTIONS]


async def episodes(app: App, c: Client) -> list[dict[str, Any]]:
    await app.runs.episodes.wait_idle()
    return list((await c.call("memory.episodes.list"))["episodes"])


async def test_an_episode_is_written_after_enough_turns(
    backend_config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """No episode before episode_cooldown_turns user turns; then one, dated in chat.timezone,
    from a non-streamed summary request that carried the conversation."""
    fake_openai.configure(reply=summarising(
        {"summary": "The user planned a trip to Kyoto in April.", "theme": "Kyoto trip",
         "same_theme": False}))
    async with running(config(backend_config_factory, fake_openai,
                              episode_cooldown_turns=2)) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        await say(c, key, "I want to visit Kyoto.")
        assert await episodes(app, c) == []
        await say(c, key, "April would be best.")
        [episode] = await episodes(app, c)
        today = datetime.now(UTC).astimezone(__import__("zoneinfo").ZoneInfo("Europe/Berlin"))
        assert (episode["text"] == "The user planned a trip to Kyoto in April."
                and episode["sessionKey"] == key)
        assert episode["date"] == today.date().isoformat() and episode["year"] == today.year
        assert episode["week"] == f"{today.isocalendar().year}-W{today.isocalendar().week:02d}"
        [request] = summary_requests(fake_openai)
        assert (request.json.get("stream") is None
                and "April would be best." in request.json["messages"][1]["content"])


async def test_cooldown_minutes_and_daily_cap_hold_back_episodes(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """Within episode_cooldown_minutes of a session's episode, and past the daily cap, no new
    episode is written (and the model is not even asked)."""
    fake_openai.configure(reply=summarising(
        {"summary": "The user talked about gardening.", "theme": "garden"},
        {"summary": "The user talked about chess openings.", "theme": "chess"}))
    async with running(config(config_factory, fake_openai, episode_cooldown_minutes=60)) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        await say(c, key, "My tomatoes are growing.")
        await episodes(app, c)
        await say(c, key, "Let's talk chess.")
        assert len(await episodes(app, c)) == 1 and len(summary_requests(fake_openai)) == 1
    fake_openai.requests.clear()
    async with running(config(config_factory, fake_openai, episode_daily_cap=1)) as app, \
            Client.connect(app.url, TOKEN) as c:
        other = (await c.call("sessions.create"))["sessionKey"]
        await say(c, other, "Another topic entirely.")
        assert len(await episodes(app, c)) == 1 and summary_requests(fake_openai) == []


async def test_same_theme_merges_and_a_repeat_is_not_novel(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """A summary continuing the latest episode merges into it; an identical summary on a new
    theme is dropped by the novelty threshold."""
    fake_openai.configure(reply=summarising(
        {"summary": "The user is choosing a laptop.", "theme": "laptop"},
        {"summary": "The user is choosing a laptop and picked 16 GB of memory.", "theme": "laptop",
         "same_theme": True},
        {"summary": "The user is choosing a laptop and picked 16 GB of memory.",
         "theme": "computers", "same_theme": False}))
    async with running(config(config_factory, fake_openai, embedder="openai")) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        await say(c, key, "Which laptop?")
        await episodes(app, c)  # turns arriving while a summary is
                                # written join one job; keep them apart
        await say(c, key, "16 GB then.")
        [merged] = await episodes(app, c)
        assert merged["merges"] == 1 and "16 GB" in merged["text"]
        await say(c, key, "Thanks.")
        assert len(await episodes(app, c)) == 1
        assert len(summary_requests(fake_openai)) == 3


async def test_a_failed_summary_is_retried_not_lost(
    backend_config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """A summary that fails (an upstream error, then JSON that is not valid) stays queued and is
    retried until it succeeds; the reply itself was never held up or failed."""
    good = {"summary": "The user asked about sourdough starters.", "theme": "baking"}
    fake_openai.configure(reply=summarising("this is not json", good))
    fake_openai.script(Behaviour(), Behaviour(status=503))  # the chat reply, then the first summary
    async with running(config(backend_config_factory, fake_openai)) as app, \
            Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        final = await say(c, key, "How do I feed a sourdough starter?")
        assert final["method"] == "chat.final"
        async with asyncio.timeout(10):
            while not (listed := await c.call("memory.episodes.list"))["episodes"]:
                await asyncio.sleep(0.05)
        assert listed["episodes"][0]["text"] == good["summary"]
        assert listed["queue"] == {"pending": 0, "failed": 0}
        assert len(summary_requests(fake_openai)) == 3  # 503, bad JSON, good


async def test_an_episode_and_the_end_of_its_job_are_one_write(
    backend_config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """Writing (or merging) the episode a queued job asked for removes the job in the same
    transaction, so no reader sees the episode beside its job still pending."""
    # The writer is off so that its retry loop does not take the job this test writes for.
    async with running(config(backend_config_factory, fake_openai, episodes=False)) as app:
        assert app.memory is not None
        episodes = app.memory.service.episodes
        moment = datetime.now(UTC)
        merge_into: int | None = None
        for _ in range(2):  # an insert, then a merge into it
            await episodes.enqueue("default", "k" * 32)
            [job] = await episodes.due()
            draft = EpisodeDraft("default", "k" * 32, "Compared two tents.", "camping", moment, 1,
                                 job_id=job.id)
            merge_into = (await episodes.write(draft, merge_into)).id
            assert await episodes.queue_state() == {"pending": 0, "failed": 0}


async def test_recall_intent_brings_episodes_of_the_named_time(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """'What did we talk about last week' puts last week's episode in the prompt and leaves out
    an older one; chat.final lists the episode ids shown."""
    async with running(config(config_factory, fake_openai, episodes=True,
                              episode_cooldown_turns=50)) as app, \
            Client.connect(app.url, TOKEN) as c:
        assert app.memory is not None
        tz = __import__("zoneinfo").ZoneInfo("Europe/Berlin")
        now = datetime.now(tz)
        last_week = now - timedelta(days=now.weekday() + 4)
        long_ago = now - timedelta(days=90)
        written = {}
        for when, text in ((last_week, "The user and the assistant compared bicycle locks."),
                           (long_ago, "The user and the assistant discussed knitting patterns.")):
            ms = int(when.timestamp() * 1000)
            e = await app.memory.service.episodes.write(
                EpisodeDraft("default", "s" * 32, text, "misc", when, ms), None)
            written[text.split()[-2]] = e.id
        key = (await c.call("sessions.create"))["sessionKey"]
        final = await say(c, key, "What did we talk about last week?")
        system = fake_openai.chat_requests[-1].json["messages"][0]["content"]
        section = system.split("<earlier_episodes>")[1]
        assert "bicycle locks" in section and "knitting" not in section
        assert final["params"]["episodes"] == [written["bicycle"]]


async def test_memory_search_kinds_episode(backend_config_factory: Callable[..., Config],
                                           fake_openai: FakeOpenAI) -> None:
    """memory.search {kinds:["episode"]} finds episodes (and only them); a bad kinds value
    is -32602."""
    import pytest

    from gateway.client import RpcError

    async with running(config(backend_config_factory, fake_openai,
                              episode_cooldown_turns=50)) as app, \
            Client.connect(app.url, TOKEN) as c:
        assert app.memory is not None
        now = datetime.now(UTC)
        await app.memory.service.episodes.write(
            EpisodeDraft("default", "s" * 32, "The user repaired a vintage typewriter.",
                         "typewriter", now, int(now.timestamp() * 1000)), None)
        found = await c.call("memory.search", {"query": "typewriter repair", "kinds": ["episode"]})
        assert [r["kind"] for r in found["results"]] == ["episode"]
        assert "typewriter" in found["results"][0]["content"]
        both = await c.call("memory.search", {"query": "typewriter", "kinds": ["chunk", "episode"]})
        assert any(r.get("kind") == "episode" for r in both["results"])
        for bad in (["poem"], [], "episode", ["episode", "episode"]):
            with pytest.raises(RpcError) as info:
                await c.call("memory.search", {"query": "x", "kinds": bad})
            assert info.value.code == -32602
