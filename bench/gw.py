"""Starting the real gateway for a benchmark (port 0, a fixed token): in-process, or as its
own ``recalld serve`` process when the client's view of latency must not share an event loop
with the gateway."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from gateway.config import Config
from tests.conftest import TOKEN, make_config
from tests.conftest import running as running_gateway

__all__ = ["TOKEN", "gateway_config", "gateway_process", "running_gateway"]


def gateway_config(data_dir: Path, *, user: str | None = None, **sections: dict[str, Any]) -> Config:
    """The tests' config (port 0, fixed token, no watcher); ``user`` names the token's user."""
    if user:
        auth = {**sections.get("auth", {}), "token": None, "users": [{"name": user, "token": TOKEN}]}
        sections = {**sections, "auth": auth}
    return make_config(data_dir, **sections)


@asynccontextmanager
async def gateway_process(data_dir: Path, env: dict[str, str]) -> AsyncIterator[str]:
    """``recalld serve --port 0`` as a child process; yields its URL.

    ``env`` adds ``RECALLD_*`` settings. The listening line is read from stderr to learn the
    port; the rest of stderr is drained so the pipe never fills.
    """
    import orjson

    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLD_", "OPENAI_"))}
    child_env.update({"RECALLD_TOKEN": TOKEN, "RECALLD_MEMORY_WATCH": "false",
                      "RECALLD_MEMORY_EMBEDDER": "none", "RECALLD_LOG_FORMAT": "json", **env})
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "--data-dir", str(data_dir), "serve", "--port", "0",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE, env=child_env,
    )
    assert proc.stderr is not None
    try:
        async with asyncio.timeout(30):
            while True:
                line = await proc.stderr.readline()
                if not line:
                    raise RuntimeError(f"gateway exited with {await proc.wait()} before listening")
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if record.get("event") == "gateway.listening":
                    break
        drain = asyncio.create_task(proc.stderr.read())  # keep the pipe flowing
        yield f"ws://127.0.0.1:{record['port']}/"
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
        if "drain" in locals():
            await drain
