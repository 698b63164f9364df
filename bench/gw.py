"""Starting the real gateway in-process for a benchmark (port 0, a fixed token)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from gateway.app import App, start_app
from gateway.config import Config, load

TOKEN = "bench-token-0123456789abcdef"


def gateway_config(data_dir: Path, *, user: str | None = None, **sections: dict[str, Any]) -> Config:
    overrides: dict[str, dict[str, Any]] = {
        "server": {"port": 0},
        "auth": {"users": [{"name": user, "token": TOKEN}]} if user else {"token": TOKEN},
        "memory": {"watch": False, "embedder": "none"},
    }
    for name, values in sections.items():
        overrides.setdefault(name, {}).update(values)
    return load(None, env={}, overrides=overrides, data_dir=data_dir)


@asynccontextmanager
async def running_gateway(config: Config) -> AsyncIterator[App]:
    app = await start_app(config)
    try:
        yield app
    finally:
        await app.close()
