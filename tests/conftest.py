"""Shared fixtures: a real gateway on port 0 with a real data dir, and real clients."""

from __future__ import annotations

import dataclasses
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


def replace(config: Config, **changes: Any) -> Config:
    return dataclasses.replace(config, **changes)
