"""Item 16 of issue 10: ``memory.embedder = "auto"`` with an API key probes the endpoint's
/embeddings once; when it fails, the local model takes over with one clear warning, and
memory.status and gateway.health say which embedder is active and why."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.client import Client
from tests.conftest import TOKEN
from tests.fake_openai import FakeOpenAI
from tests.faults.helpers import FaultDaemon, daemon_env


def _local_installed() -> bool:
    from memory.embedders.local_embedder import unavailable_reason

    return unavailable_reason("bge-small-en-v1.5") is None


@pytest.mark.parametrize("status", [404, 501])
async def test_auto_falls_back_to_local_when_embeddings_fail(
    tmp_path: Path, fake_openai: FakeOpenAI, status: int
) -> None:
    """A chat endpoint whose /embeddings answers 404 or 501 gets one probe, one warning, and the
    local embedder; status and health name it and the failure."""
    fake_openai.configure_embeddings(status=status)
    env = daemon_env(fake_openai, RECALLD_MEMORY_EMBEDDER="auto", OPENAI_API_KEY="sk-test")
    daemon = await FaultDaemon.start(tmp_path / "data", env=env)
    try:
        async with Client.connect(daemon.url, TOKEN) as c:
            status_reply = await c.call("memory.status")
            health = (await c.call("gateway.health"))["memory"]
    finally:
        await daemon.astop()
    assert fake_openai.embedding_calls == 1, "probed more (or less) than once"
    warnings = daemon.events("memory.embedder.fallback")
    assert len(warnings) == 1 and warnings[0]["level"] == "warning"
    expected = "local" if _local_installed() else "none"
    assert status_reply["provider"] == health["provider"] == expected
    for reason in (status_reply["embedderReason"], health["embedderReason"]):
        assert f"answered {status}" in reason and "probe" in reason
    assert health["model"] == status_reply["model"]


async def test_auto_keeps_a_working_endpoint(tmp_path: Path, fake_openai: FakeOpenAI) -> None:
    """When the probe succeeds the OpenAI-compatible embedder stays, with no warning, and the
    reason says the probe answered."""
    env = daemon_env(fake_openai, RECALLD_MEMORY_EMBEDDER="auto", OPENAI_API_KEY="sk-test")
    daemon = await FaultDaemon.start(tmp_path / "data", env=env)
    try:
        async with Client.connect(daemon.url, TOKEN) as c:
            health = (await c.call("gateway.health"))["memory"]
    finally:
        await daemon.astop()
    assert health["provider"] == "openai" and "probe" in health["embedderReason"]
    assert daemon.events("memory.embedder.fallback") == []
