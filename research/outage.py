"""Measure a PostgreSQL outage as a client sees it, on the code in the current directory.

.venv/bin/python -m research.outage [DOWN_S]   (default 20 s down; a throwaway PostgreSQL from
testkit, one gateway node on it, the fake model)
Prints JSON: per call kind, while down, the time each failing call took and what it answered;
the time from the database's return to the first successful chat.send; health/readyz seen.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from gateway.app import start_app
from gateway.client import Client, RpcError
from testkit.fake_openai import FakeOpenAI
from testkit.gateway import TOKEN, http_get, make_config
from testkit.postgres import start_postgres


def status(port: int, path: str) -> int:
    return http_get(port, path)[0]


async def main(down_s: float) -> None:
    pg = start_postgres()
    fake = FakeOpenAI()
    await fake.start()
    out: dict[str, Any] = {}
    try:
        dsn = pg.create_database("m")
        cfg = make_config(Path(tempfile.mkdtemp()) / "d",
                          storage={"backend": "postgres", "dsn": dsn},
                          memory={"enabled": True, "embedder": "none"},
                          llm={"base_url": fake.base_url, "api_key": "sk", "model": "fake-model",
                               "max_retries": 0})
        app = await start_app(cfg)
        try:
            async with Client.connect(app.url, TOKEN) as c:
                key = (await c.call("sessions.create", {}))["sessionKey"]
                await c.call("chat.send", {"sessionKey": key, "message": "before"})
                await c.next_event("chat.final", timeout=30)
                argv = shlex.split((pg.datadir / "postmaster.opts").read_text())
                opts = [a for i, a in enumerate(argv[1:], 1) if a != "-D" and argv[i - 1] != "-D"]
                pg._run("pg_ctl", "stop", "-D", str(pg.datadir), "-m", "fast", "-w")
                stopped = time.monotonic()
                calls: dict[str, Callable[[int], Awaitable[Any]]] = {
                    "chat.send": lambda n: c.call("chat.send", {"sessionKey": key,
                                                                "message": f"d{n}"}),
                    "chat.send+key": lambda n: c.call("chat.send", {"sessionKey": key,
                                                                    "message": f"k{n}",
                                                                    "idempotencyKey": f"k{n}"}),
                    "memory.status": lambda n: c.call("memory.status", {}),
                    "sessions.history": lambda n: c.call("sessions.history", {"sessionKey": key}),
                }
                seen: dict[str, list[dict[str, Any]]] = {k: [] for k in calls}
                health: list[str] = []
                readyz: list[int] = []
                n = 0
                while time.monotonic() - stopped < down_s:
                    for name, call in calls.items():
                        t = time.monotonic()
                        try:
                            await call(n)
                            seen[name].append({"s": round(time.monotonic() - t, 2), "ok": True})
                        except RpcError as e:
                            seen[name].append({"s": round(time.monotonic() - t, 2), "code": e.code,
                                               "message": e.message, "data": e.data})
                        n += 1
                    h = await c.call("gateway.health")
                    health.append(h["status"])
                    readyz.append(await asyncio.to_thread(status, app.server.port, "/readyz"))
                pg._run("pg_ctl", "start", "-D", str(pg.datadir), "-w", "-t", "60",
                        "-l", str(pg.datadir / "server.log"), "-o", shlex.join(opts))
                back = time.monotonic()

                async def first_success(name: str) -> tuple[str, float, int]:
                    tries = 0
                    while True:
                        tries += 1
                        try:
                            await calls[name](1000 + tries)
                            return name, round(time.monotonic() - back, 2), tries
                        except RpcError:
                            await asyncio.sleep(0.05)

                for name, s, tries in await asyncio.gather(*(first_success(k) for k in calls)):
                    out[f"first_success_after_back_s {name}"] = s
                    out[f"tries_after_back {name}"] = tries
                await c.next_event("chat.final", timeout=30)
                for name, rows in seen.items():
                    out[name] = {"calls": len(rows),
                                 "median_s": statistics.median(r["s"] for r in rows),
                                 "max_s": max(r["s"] for r in rows),
                                 "answers": sorted(
                                     {f'{r.get("code")} {r.get("message")} '
                                      f'errorId={"errorId" in (r.get("data") or {})} '
                                      f'retryAfterMs={(r.get("data") or {}).get("retryAfterMs")}'
                                      for r in rows})}
                out["health_while_down"] = sorted(set(health))
                out["readyz_while_down"] = sorted(set(readyz))
                out["health_after"] = (await c.call("gateway.health"))["status"]
        finally:
            await app.close()
    finally:
        await fake.close()
        pg.stop()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1]) if len(sys.argv) > 1 else 20.0))
