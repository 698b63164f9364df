"""Starting the real gateway with a fixed token on port 0: in-process, or as its own
``recalld serve`` process when the client's view of latency must not share an event loop
with the gateway. The tests' fixtures and the benchmarks are built on the same helpers."""

from __future__ import annotations

import asyncio
import http.client
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from gateway.app import App, start_app
from gateway.config import Config, load

__all__ = ["TOKEN", "gateway_child", "gateway_config", "gateway_process", "http_get", "make_config",
           "running_gateway"]

TOKEN = "test-token-0123456789abcdef"


def make_config(data_dir: Path, **sections: dict[str, Any]) -> Config:
    """Port 0, the fixed token, no file watching, no embedder, no model-written titles (a test
    of them turns ``chat.auto_title`` on); ``sections`` override."""
    overrides: dict[str, dict[str, Any]] = {
        "server": {"port": 0},
        "auth": {"token": TOKEN},
        "memory": {"watch": False, "embedder": "none"},
        "chat": {"auto_title": False},
    }
    for name, values in sections.items():
        overrides.setdefault(name, {}).update(values)
    return load(None, env={}, overrides=overrides, data_dir=data_dir)


def gateway_config(data_dir: Path, *, user: str | None = None,
                   **sections: dict[str, Any]) -> Config:
    """:func:`make_config`, with ``user`` naming the token's user."""
    if user:
        auth = {**sections.get("auth", {}), "token": None,
                "users": [{"name": user, "token": TOKEN}]}
        sections = {**sections, "auth": auth}
    return make_config(data_dir, **sections)


@asynccontextmanager
async def running_gateway(config: Config, *,
                          embedder: tuple[Any, str] | None = None) -> AsyncIterator[App]:
    """The gateway of ``config``, started in this process and closed on exit; ``embedder``
    (an embedder and the reason status gives) replaces the one the config would pick."""
    app = await start_app(config, embedder=embedder)
    try:
        yield app
    finally:
        await app.close()


@asynccontextmanager
async def gateway_process(data_dir: Path, env: dict[str, str]) -> AsyncIterator[str]:
    """``recalld serve --port 0`` as a child process; yields its URL (see :func:`gateway_child`)."""
    async with gateway_child(data_dir, env) as (url, _):
        yield url


@asynccontextmanager
async def gateway_child(data_dir: Path, env: dict[str, str], wrapper: Sequence[str] = ()
                        ) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    """``recalld serve --port 0`` as a child process; yields its URL and the process.

    ``env`` adds ``RECALLD_*`` settings. The listening line is read from stderr to learn the
    port; the rest of stderr is drained so the pipe never fills. ``wrapper`` is a command the
    gateway runs under (a profiler): it is stopped with SIGINT, on which profilers write
    their output, and the gateway is its child.
    """
    import orjson

    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLD_", "OPENAI_"))}
    child_env.update({"RECALLD_TOKEN": TOKEN, "RECALLD_MEMORY_WATCH": "false",
                      "RECALLD_MEMORY_EMBEDDER": "none", "RECALLD_LOG_FORMAT": "json", **env})
    proc = await asyncio.create_subprocess_exec(
        *wrapper, sys.executable, "-m", "gateway", "--data-dir", str(data_dir), "serve",
        "--port", "0",
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
        yield f"ws://127.0.0.1:{record['port']}/", proc
    finally:
        if proc.returncode is None:
            if wrapper:
                proc.send_signal(signal.SIGINT)
            else:
                proc.terminate()
            await proc.wait()
        if "drain" in locals():
            await drain


def http_get(port: int, path: str, headers: dict[str, str] | None = None, *,
             timeout_s: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """A plain HTTP GET on loopback (blocking): status, headers (lower-case names), body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()
