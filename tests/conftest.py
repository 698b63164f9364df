"""Shared fixtures: a real gateway on port 0 with a real data dir, and real clients."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway.app import App, start_app
from gateway.client import Client
from gateway.config import Config, load

TOKEN = "test-token-0123456789abcdef"


def make_config(data_dir: Path, **sections: dict[str, Any]) -> Config:
    """A config for tests: port 0, a fixed token, no file watching; sections override."""
    overrides: dict[str, dict[str, Any]] = {
        "server": {"port": 0},
        "auth": {"token": TOKEN},
        "memory": {"watch": False, "embedder": "none"},
    }
    for name, values in sections.items():
        overrides.setdefault(name, {}).update(values)
    return load(None, env={}, overrides=overrides, data_dir=data_dir)


@pytest.fixture
def config_factory(tmp_path: Path) -> Callable[..., Config]:
    def factory(**sections: dict[str, Any]) -> Config:
        return make_config(tmp_path / "data", **sections)

    return factory


@asynccontextmanager
async def running(config: Config) -> AsyncIterator[App]:
    app = await start_app(config)
    try:
        yield app
    finally:
        await app.close()


@pytest.fixture
async def app(config_factory: Callable[..., Config]) -> AsyncIterator[App]:
    async with running(config_factory()) as app:
        yield app


@pytest.fixture
async def client(app: App) -> AsyncIterator[Client]:
    async with Client.connect(app.url, TOKEN) as c:
        yield c


# The loopback OpenAI-compatible server, as a fixture for every test module.
from tests.fake_openai import FakeOpenAI, fake_openai  # noqa: E402,F401


@pytest.fixture
async def chat_app(config_factory: Callable[..., Config], fake_openai: FakeOpenAI) -> AsyncIterator[App]:
    """A gateway whose model endpoint is the loopback fake server."""
    cfg = config_factory(llm={"base_url": fake_openai.base_url, "api_key": "sk-test", "model": "fake-model",
                              "timeout_s": 5.0, "max_retries": 0})
    async with running(cfg) as app:
        yield app
