"""``python -m research.chatprofile [--rounds N] [--steps [--fake-process]] [-- WRAPPER…]``:
the CPU a ``recalld serve`` process spends per 500-delta chat run, the figure behind
``bench --only chat``'s ratio.

The chat section's wall-clock ratio moves by ±0.2 on a shared 2-core machine (the gateway,
the client and the loopback model server compete for two cores with whatever else runs);
the gateway process's own CPU time per run (``/proc/PID/stat`` user + system) moves far less,
so changes to the per-delta path are compared with it. Also printed: wall time, time to the
first ``chat.delta`` and how many ``chat.delta`` frames the client received (deltas that wait
in a connection's outbox leave merged, docs/protocol.md).

Everything after ``--`` wraps the gateway command, e.g. a sampling profiler::

    .venv/bin/python -m research.chatprofile --rounds 60 -- \\
        .venv/bin/py-spy record -r 500 -f raw -o /tmp/chat.txt --

(py-spy is not a dependency: ``pip install py-spy`` into the venv to use it). Linux only.

``--steps`` times the first delta's path instead: each step of a run (``chat.send`` arriving,
the user message's append, the prompt, the facts and episodes lookups, the model request
leaving and its answer, the first ``chat.delta`` published, sent, received) and of the direct
SDK's request, as p50 over the runs (bench/README.md, "Chat overhead"). ``--fake-process``
runs the fake model server in a process of its own rather than on this process's loop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from gateway.client import Client
from testkit.fake_openai import FakeOpenAI
from testkit.gateway import TOKEN, gateway_child


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _run(rounds: int, wrapper: Sequence[str]) -> None:
    async with FakeOpenAI() as fake:
        fake.configure(reply=" ".join(f"w{i}" for i in range(500)), deltas=500)
        with tempfile.TemporaryDirectory() as tmp:
            # The chat section's settings (bench/rpc.py run_chat), so the figures explain it.
            env = {"OPENAI_BASE_URL": fake.base_url, "OPENAI_API_KEY": "sk-bench",
                   "RECALLD_LLM_MODEL": "fake-model", "RECALLD_LLM_MAX_RETRIES": "0",
                   "RECALLD_CHAT_RECALL": "false"}
            async with gateway_child(Path(tmp), env, wrapper) as (url, proc):
                pid = proc.pid
                if wrapper:  # the gateway is the wrapper's child
                    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                              text=True, check=False).stdout.split()
                    pid = int(children[0]) if children else proc.pid
                await _measure(url, pid, rounds)


async def _measure(url: str, pid: int, rounds: int) -> None:
    walls: list[float] = []
    firsts: list[float] = []
    frames: list[int] = []
    async with Client.connect(url, TOKEN) as c:

        async def one() -> tuple[float, float, int]:
            key = (await c.call("sessions.create", {}))["sessionKey"]
            start = time.perf_counter()
            first = 0.0
            n = 0
            await c.call("chat.send", {"sessionKey": key, "message": "hi"})
            while True:
                ev = await c.next_event(timeout=30)
                if ev["method"] == "chat.delta":
                    n += 1
                    first = first or time.perf_counter() - start
                elif ev["method"] in ("chat.final", "chat.error", "chat.aborted"):
                    assert ev["method"] == "chat.final", ev
                    return first, time.perf_counter() - start, n

        for _ in range(3):  # warm-up: imports, first connection to the model server
            await one()
        cpu0 = _cpu_s(pid)
        for _ in range(rounds):
            first, wall, n = await one()
            firsts.append(first)
            walls.append(wall)
            frames.append(n)
        cpu1 = _cpu_s(pid)
    print(f"gateway CPU per run {1000 * (cpu1 - cpu0) / rounds:.1f} ms; wall p50 "
          f"{1000 * statistics.median(walls):.1f} ms; first delta p50 "
          f"{1000 * statistics.median(firsts):.2f} ms; chat.delta frames per run p50 "
          f"{statistics.median(frames):g} ({rounds} runs)")


# -- --steps: where the first delta's time goes ------------------------------------------------
#
# The gateway runs under this module as a wrapper (``--trace-gateway FILE``), which wraps the
# steps of the chat path in place, then starts ``recalld serve`` in the same process. Each step
# writes one line "name perf_counter_ns" to FILE. perf_counter is CLOCK_MONOTONIC on Linux, so
# the gateway's and this client's clocks are one clock. Nothing in gateway/ is changed for it.

_TRACE_FD = -1


def _mark(name: str) -> None:
    os.write(_TRACE_FD, f"{name} {time.perf_counter_ns()}\n".encode())


def _wrap_async(owner: Any, attr: str, name: str) -> None:
    inner = getattr(owner, attr)

    @functools.wraps(inner)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        _mark(f"{name}.in")
        try:
            return await inner(*args, **kwargs)
        finally:
            _mark(f"{name}.out")

    setattr(owner, attr, wrapper)


def _install_gateway_trace(path: str) -> None:
    global _TRACE_FD
    _TRACE_FD = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    import httpx2 as httpx
    import websockets.asyncio.connection as ws_connection

    import gateway.chat.finish as finish
    import gateway.chat.runs as runs
    import gateway.methods.chat as chat_methods
    import memory.episodes.service as episodes_service
    import memory.facts.service as facts_service
    from gateway.chat.llm import OpenAIChatModel
    from sessions import SessionStore

    _wrap_async(chat_methods.ChatMethods, "send", "send")
    _wrap_async(runs.ChatRuns, "_execute", "execute")
    _wrap_async(runs, "build_prompt", "prompt")
    _wrap_async(facts_service.Facts, "relevant", "facts")
    _wrap_async(episodes_service.Episodes, "search", "episodes")
    _wrap_async(OpenAIChatModel, "_open", "open")
    _wrap_async(httpx.AsyncClient, "send", "http")

    append = SessionStore.append_message

    def traced_append(self: SessionStore, *args: Any, **kwargs: Any) -> Any:
        role = kwargs.get("role")
        _mark(f"append_{role}.in")
        try:
            return append(self, *args, **kwargs)
        finally:
            _mark(f"append_{role}.out")

    SessionStore.append_message = traced_append  # type: ignore[method-assign, assignment]

    publish = finish.RunEnds.publish_delta
    state = {"first": True}

    def traced_publish(self: Any, run: Any, text: str) -> None:
        if run.seq == 0:
            _mark("delta.publish")
            state["first"] = True
        publish(self, run, text)

    finish.RunEnds.publish_delta = traced_publish  # type: ignore[method-assign]

    ws_send = ws_connection.Connection.send

    async def traced_send(self: Any, message: Any, *args: Any, **kwargs: Any) -> Any:
        if state["first"] and isinstance(message, (bytes, str)) and "chat.delta" in (
                message.decode() if isinstance(message, bytes) else message)[:200]:
            state["first"] = False
            _mark("ws.delta")
        elif isinstance(message, (bytes, str)) and "runId" in (
                message.decode() if isinstance(message, bytes) else message)[:200] and "status" in (
                message.decode() if isinstance(message, bytes) else message):
            _mark("ws.reply")
        return await ws_send(self, message, *args, **kwargs)

    ws_connection.Connection.send = traced_send  # type: ignore[method-assign]


def _read_trace(path: Path) -> list[tuple[str, int]]:
    out = []
    for line in path.read_text().splitlines():
        name, ns = line.split()
        out.append((name, int(ns)))
    return out


def _runs(events: list[tuple[str, int]], start: str) -> list[dict[str, int]]:
    """The events cut into runs at each ``start`` mark; the first occurrence of a name wins."""
    runs: list[dict[str, int]] = []
    for name, ns in events:
        if name == start:
            runs.append({})
        if runs:
            runs[-1].setdefault(name, ns)
    return runs


def _table(title: str, runs: list[dict[str, int]], order: Sequence[str]) -> None:
    print(title)
    prev = order[0]
    for name in order[1:]:
        gaps = [(r[name] - r[prev]) / 1e6 for r in runs if name in r and prev in r]
        total = [(r[name] - r[order[0]]) / 1e6 for r in runs if name in r and order[0] in r]
        if gaps:
            print(f"  {prev:>18} → {name:<18} p50 {statistics.median(gaps):7.3f} ms   "
                  f"(at {statistics.median(total):7.3f} ms)")
        prev = name if gaps else prev


@contextlib.asynccontextmanager
async def _model_server(own_process: bool) -> AsyncIterator[str]:
    """The fake model server's base URL: on this process's loop, as ``bench --only chat`` runs
    it, or (``own_process``) in a process of its own, so that streaming the 500 chunks does not
    hold up this process reading the gateway's first delta."""
    reply = " ".join(f"w{i}" for i in range(500))
    if not own_process:
        async with FakeOpenAI() as fake:
            fake.configure(reply=reply, deltas=500)
            yield fake.base_url
        return
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "testkit.fake_openai", "--port", "0", "--reply", reply,
        "--deltas", "500",
        stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        yield line.rsplit(" ", 1)[1].strip()
    finally:
        proc.terminate()
        await proc.wait()


async def _steps(rounds: int, fake_process: bool) -> None:
    from openai import AsyncOpenAI

    trace = Path(tempfile.mkdtemp()) / "gateway.trace"
    client_trace = trace.with_name("client.trace")
    global _TRACE_FD
    _TRACE_FD = os.open(client_trace, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    import httpx2 as httpx

    import testkit.fake_openai as fake_module
    _wrap_async(httpx.AsyncClient, "send", "http")
    fake_write = fake_module._Conn.write

    async def traced_write(self: Any, data: bytes) -> None:
        # The model server runs on this process's loop: when it answers and when it has
        # written the whole stream (it never waits between chunks on loopback).
        if data.startswith(b"HTTP/1.1 200"):
            _mark("fake.head")
        await fake_write(self, data)
        if data.endswith(b"0\r\n\r\n"):
            _mark("fake.end")

    fake_module._Conn.write = traced_write  # type: ignore[method-assign]
    async with _model_server(fake_process) as base_url:
        sdk = AsyncOpenAI(base_url=base_url, api_key="sk-bench", max_retries=0)
        with tempfile.TemporaryDirectory() as tmp:
            env = {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "sk-bench",
                   "RECALLD_LLM_MODEL": "fake-model", "RECALLD_LLM_MAX_RETRIES": "0",
                   "RECALLD_CHAT_RECALL": "false",
                   # A fresh session per run, as the chat section: more than its default a minute.
                   "RECALLD_QUOTAS_SESSIONS_PER_MINUTE": "100000"}
            wrapper = [sys.executable, "-m", "research.chatprofile", "--trace-gateway", str(trace),
                       "--"]
            async with gateway_child(Path(tmp), env, wrapper) as (url, _), \
                    Client.connect(url, TOKEN) as c:

                async def via_gateway() -> None:
                    key = (await c.call("sessions.create", {}))["sessionKey"]
                    _mark("client.send")
                    await c.call("chat.send", {"sessionKey": key, "message": "hi"})
                    _mark("client.ack")
                    first = True
                    while True:
                        ev = await c.next_event(timeout=30)
                        if ev["method"] == "chat.delta" and first:
                            _mark("client.delta")
                            first = False
                        if ev["method"] in ("chat.final", "chat.error", "chat.aborted"):
                            return

                async def direct() -> None:
                    _mark("direct.start")
                    stream = await sdk.chat.completions.create(
                        model="fake-model", messages=[{"role": "user", "content": "hi"}],
                        stream=True)
                    _mark("direct.open")
                    first = True
                    async for chunk in stream:
                        if first and chunk.choices and chunk.choices[0].delta.content:
                            _mark("direct.delta")
                            first = False

                for _ in range(3):
                    await via_gateway()
                    await direct()
                _mark("---")
                for _ in range(rounds):
                    await via_gateway()
                    await direct()
        await sdk.close()
    client = _read_trace(client_trace)
    gateway = _read_trace(trace)
    cut = [name for name, _ in client].index("---")
    client = client[cut + 1:]
    gw_runs = _runs([e for e in client if not e[0].startswith(("direct.", "http."))], "client.send")
    # The gateway's marks of the same runs: the last ``rounds`` runs it traced.
    server = _runs(gateway, "send.in")[-rounds:]
    for own, theirs in zip(gw_runs, server, strict=True):
        for name, ns in theirs.items():
            own.setdefault(name, ns)
    direct_runs = _runs([e for e in client if not e[0].startswith("client.")], "direct.start")
    for r in direct_runs:
        for name in ("fake.head", "fake.end"):
            if name in r:
                r[f"direct.{name}"] = r.pop(name)
    print(f"{rounds} runs; p50 of each step and of its end since the start")
    _table("gateway (client → gateway process → client):", gw_runs, [
        "client.send", "send.in", "append_user.in", "append_user.out", "send.out", "ws.reply",
        "execute.in", "prompt.in", "prompt.out", "facts.in", "facts.out", "episodes.in",
        "episodes.out", "open.in", "http.in", "fake.head", "http.out", "open.out",
        "delta.publish", "ws.delta", "fake.end", "client.delta"])
    _table("direct (this process, the SDK alone):", direct_runs, [
        "direct.start", "http.in", "direct.fake.head", "direct.fake.end", "http.out", "direct.open",
        "direct.delta"])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    wrapper: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, wrapper = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(prog="python -m research.chatprofile",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--steps", action="store_true",
                        help="time each step of the first delta's path (gateway and direct SDK)"
                             " instead")
    parser.add_argument("--fake-process", action="store_true",
                        help="with --steps: the fake model server in a process of its own")
    parser.add_argument("--trace-gateway", metavar="FILE",
                        help=argparse.SUPPRESS)  # --steps' wrapper
    args = parser.parse_args(argv)
    if args.trace_gateway:
        # Run as the gateway's wrapper: trace, then become ``python -m gateway …`` in this process.
        _install_gateway_trace(args.trace_gateway)
        sys.argv = ["recalld", *wrapper[3:]]
        runpy.run_module("gateway", run_name="__main__", alter_sys=True)
        return 0
    asyncio.run(_steps(args.rounds, args.fake_process) if args.steps
                else _run(args.rounds, wrapper))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
