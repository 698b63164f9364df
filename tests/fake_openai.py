"""The ``fake_openai`` fixture: a started :class:`testkit.fake_openai.FakeOpenAI` per test.

The server itself lives in ``testkit/``, which the tests and the benchmarks both import.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from testkit.fake_openai import Behaviour, FakeOpenAI

__all__ = ["Behaviour", "FakeOpenAI", "fake_openai"]


@pytest.fixture
async def fake_openai() -> AsyncIterator[FakeOpenAI]:
    """A started FakeOpenAI on a free loopback port, closed after the test."""
    server = FakeOpenAI()
    await server.start()
    try:
        yield server
    finally:
        await server.close()
