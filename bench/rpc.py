"""1. RPC round trips: gateway.health vs a bare websockets+orjson server answering the same result.
2. Chat overhead: chat.send through the gateway vs the openai SDK streaming directly."""

from __future__ import annotations

import asyncio
import gc
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve

from bench.stats import Figure, summary_ms
from gateway.client import Client
from testkit.fake_openai import FakeOpenAI
from testkit.gateway import TOKEN, gateway_config, gateway_process, running_gateway

CONNECTIONS = 16


def echo_handler(result: dict[str, Any]) -> Callable[[ServerConnection], Awaitable[None]]:
    """The baseline server: decode each request and answer ``result`` under its id, encoded per
    call as the gateway encodes its reply. ``result`` is the gateway's own ``gateway.health``
    answer (309 bytes on the wire here), so both sides write replies of the same size; before
    round 4 the echo answered a fixed 4-field result (98 bytes) while the health reply had grown
    its ``memory`` and ``storage`` parts, and the ratio counted the larger reply as overhead."""
    async def handler(ws: ServerConnection) -> None:
        async for raw in ws:
            req = orjson.loads(raw)
            await ws.send(orjson.dumps({"jsonrpc": "2.0", "id": req["id"], "result": result}),
                          text=True)
    return handler


async def health_result(url: str, headers: dict[str, str]) -> dict[str, Any]:
    """What ``gateway.health`` answers at ``url`` now (the echo's reply)."""
    async with connect(url, additional_headers=headers, compression=None) as ws:
        await ws.send(orjson.dumps({"jsonrpc": "2.0", "id": 0, "method": "gateway.health"}),
                      text=True)
        result: dict[str, Any] = orjson.loads(await ws.recv())["result"]
        return result


async def drive(urls: list[str], method: str, params: dict[str, Any] | None, *,
                headers: dict[str, str] | None, per_conn: int,
                window: int) -> tuple[float, list[float]]:
    """CONNECTIONS connections spread over ``urls``, each sending ``per_conn`` calls with at most
    ``window`` in flight; the rate over all of them and each call's latency (bench.cluster too)."""
    latencies: list[float] = []
    body = {"jsonrpc": "2.0", "method": method, **({"params": params} if params else {})}

    async def one(ws: Any) -> None:
        sent: dict[int, float] = {}
        next_id = done = 0
        while next_id < min(window, per_conn):
            sent[next_id] = time.perf_counter()
            await ws.send(orjson.dumps({**body, "id": next_id}), text=True)
            next_id += 1
        while done < per_conn:
            reply = orjson.loads(await ws.recv())
            if "id" not in reply:
                continue  # a notification
            if "error" in reply:
                raise RuntimeError(f"{method}: {reply['error']}")
            latencies.append(time.perf_counter() - sent.pop(reply["id"]))
            done += 1
            if next_id < per_conn:
                sent[next_id] = time.perf_counter()
                await ws.send(orjson.dumps({**body, "id": next_id}), text=True)
                next_id += 1

    conns = [await connect(urls[i % len(urls)], additional_headers=headers, compression=None,
                           max_size=None)
             for i in range(CONNECTIONS)]
    try:
        started = time.perf_counter()
        await asyncio.gather(*(one(ws) for ws in conns))
        elapsed = time.perf_counter() - started
    finally:
        for ws in conns:
            await ws.close()
    return CONNECTIONS * per_conn / elapsed, latencies


async def run_rpc(quick: bool) -> list[Figure]:
    rounds = 5 if quick else 7
    per_conn = 150 if quick else 600
    figs: list[Figure] = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = gateway_config(Path(tmp))
        s = cfg.server
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with running_gateway(cfg) as app, serve(
                echo_handler(await health_result(app.url, auth)), "127.0.0.1", 0,
                compression=None, max_size=s.max_size,
                max_queue=s.max_queue, write_limit=s.write_limit,
                ping_interval=s.ping_interval_s or None,
                ping_timeout=s.ping_timeout_s or None) as base:
            port = base.sockets[0].getsockname()[1]
            base_url = f"ws://127.0.0.1:{port}/"
            for mode, window in (("ping-pong", 1), ("pipelined", 32)):
                rates: dict[str, list[float]] = {"gateway": [], "baseline": []}
                lats: dict[str, list[float]] = {"gateway": [], "baseline": []}
                await drive([app.url], "gateway.health", None, headers=auth, per_conn=20,
                            window=window)  # warm-up
                # A full collection (60-80 ms here) landing inside a quick round of 0.1-0.3 s moved
                # that round's ratio by 30% either way: what was allocated so far is frozen out of
                # the collector, and each side starts its round after a collection.
                gc.collect()
                gc.freeze()
                for _ in range(rounds):  # alternate sides, same process
                    for side, url, hdr in (("gateway", app.url, auth),
                                           ("baseline", base_url, None)):
                        gc.collect()
                        rate, lat = await drive([url], "gateway.health", None, headers=hdr,
                                                per_conn=per_conn, window=window)
                        rates[side].append(rate)
                        lats[side].extend(lat)
                ratios = sorted(g / b for g, b in zip(rates["gateway"], rates["baseline"]))
                ratio = ratios[len(ratios) // 2]
                for side in ("gateway", "baseline"):
                    m = summary_ms(lats[side])
                    rate = sorted(rates[side])[len(rates[side]) // 2]
                    figs.append(Figure("1 rpc", f"{mode} {side} req/s (p50 / p99 latency)",
                                       rate, "req/s",
                                       note=f"p50 {m['p50']:.2f} ms, p99 {m['p99']:.2f} ms",
                                       extra={"p50": m["p50"], "p99": m["p99"],
                                              "rates": rates[side]}))
                figs.append(Figure("1 rpc", f"{mode} gateway / baseline throughput", ratio, "×",
                                   "≥ 0.90", ratio >= 0.90, extra={"ratios": ratios}))
    return figs


async def run_chat(quick: bool) -> list[Figure]:
    from openai import AsyncOpenAI

    rounds = 8 if quick else 25
    reply = " ".join(f"w{i}" for i in range(500))
    figs: list[Figure] = []
    async with FakeOpenAI() as fake:
        fake.configure(reply=reply, deltas=500)
        with tempfile.TemporaryDirectory() as tmp:
            # The gateway runs as its own process, as deployed: in-process, the client would
            # only get a turn of the shared event loop when the run yields, which adds the
            # run's yield period to every client-observed figure.
            env = {"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "sk-bench",
                   "RECALLD_LLM_MODEL": "fake-model", "RECALLD_LLM_MAX_RETRIES": "0",
                   "RECALLD_CHAT_RECALL": "false"}
            sdk = AsyncOpenAI(base_url=fake.base_url, api_key="sk-bench", max_retries=0)
            ttfd: dict[str, list[float]] = {"gateway": [], "direct": []}
            total: dict[str, list[float]] = {"gateway": [], "direct": []}
            async with gateway_process(Path(tmp), env) as url, Client.connect(url, TOKEN) as c:

                async def via_gateway() -> tuple[float, float]:
                    # A fresh session per round (created before the clock starts): the model
                    # then sees the same one message as the direct side, not a growing history.
                    key = (await c.call("sessions.create", {}))["sessionKey"]
                    t = time.perf_counter()
                    await c.call("chat.send", {"sessionKey": key, "message": "hi"})
                    first = None
                    while True:
                        ev = await c.next_event(timeout=30)
                        if ev["method"] == "chat.delta" and first is None:
                            first = time.perf_counter() - t
                        if ev["method"] in ("chat.final", "chat.error", "chat.aborted"):
                            assert ev["method"] == "chat.final", ev
                            return first or 0.0, time.perf_counter() - t

                async def direct() -> tuple[float, float]:
                    t = time.perf_counter()
                    first = None
                    stream = await sdk.chat.completions.create(
                        model="fake-model", messages=[{"role": "user", "content": "hi"}],
                        stream=True)
                    async for chunk in stream:
                        if first is None and chunk.choices and chunk.choices[0].delta.content:
                            first = time.perf_counter() - t
                    return first or 0.0, time.perf_counter() - t

                await via_gateway()
                await direct()
                for _ in range(rounds):
                    for side, fn in (("gateway", via_gateway), ("direct", direct)):
                        a, b = await fn()
                        ttfd[side].append(a)
                        total[side].append(b)
            await sdk.close()
    g, d = summary_ms(ttfd["gateway"]), summary_ms(ttfd["direct"])
    gt, dt = summary_ms(total["gateway"]), summary_ms(total["direct"])
    extra = g["p50"] - d["p50"]
    ratio = gt["p50"] / dt["p50"]
    figs.append(Figure("2 chat", "time to first delta: gateway − direct (p50)", extra, "ms", "≤ +1",
                       extra <= 1, note=f"gateway {g['p50']:.2f} ms, direct {d['p50']:.2f} ms"))
    figs.append(Figure("2 chat", "500-delta run total: gateway / direct (p50)", ratio, "×",
                       "≤ 1.05", ratio <= 1.05,
                       note=f"gateway {gt['p50']:.1f} ms (p99 {gt['p99']:.1f}), "
                            f"direct {dt['p50']:.1f} ms (p99 {dt['p99']:.1f})"))
    return figs
