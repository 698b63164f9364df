"""A connection storm plus a request flood, run as its own process so that the attacker's CPU
is not the measuring client's: ``python -m tests.faults.attacker URL CONNECTIONS REQUESTS``.

Opens CONNECTIONS authenticated WebSockets at once and holds them, then sends REQUESTS frames on
one more connection as fast as TCP accepts them while reading every answer. Prints one JSON
object: how long the storm took, how many connections opened, the answers by code, and whether
every request was answered exactly once.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

from tests.conftest import TOKEN

HEADERS = {"Authorization": f"Bearer {TOKEN}"}
METHODS = ["memory.search", "sessions.list", "gateway.health", "memory.status"]


async def flood(url: str, n: int) -> dict[str, Any]:
    codes: Counter[str] = Counter()
    seen: Counter[int] = Counter()
    async with connect(url, additional_headers=HEADERS, max_size=None) as ws:
        async def read() -> None:
            while sum(seen.values()) < n:
                msg = orjson.loads(await ws.recv())
                for item in msg if isinstance(msg, list) else [msg]:
                    seen[item["id"]] += 1
                    codes[str(item["error"]["code"]) if "error" in item else "ok"] += 1

        reader = asyncio.create_task(read())
        for i in range(n):
            params = {"query": f"flood {i}"} if i % 4 == 0 else {}
            await ws.send(orjson.dumps({"id": i, "method": METHODS[i % 4],
                                        "params": params}).decode())
        async with asyncio.timeout(120):
            await reader
    return {"codes": dict(codes),
            "each_once": set(seen) == set(range(n)) and max(seen.values()) == 1}


async def main(url: str, connections: int, requests: int) -> dict[str, Any]:
    t0 = time.monotonic()
    results = await asyncio.gather(*(connect(url, additional_headers=HEADERS, open_timeout=60)
                                     for _ in range(connections)), return_exceptions=True)
    storm_s = time.monotonic() - t0
    opened: list[ClientConnection] = [r for r in results if isinstance(r, ClientConnection)]
    report = {"storm_s": round(storm_s, 2), "opened": len(opened)}
    report.update(await flood(url, requests))
    await asyncio.gather(*(ws.close() for ws in opened), return_exceptions=True)
    return report


if __name__ == "__main__":
    out = asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
    print(orjson.dumps(out).decode(), flush=True)
