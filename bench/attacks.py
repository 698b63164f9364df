"""``python -m bench.attacks``: what hostile clients make a ``recalld serve`` process hold.

Starts the daemon as its own process (``--root DIR`` runs the ``gateway`` package found in
DIR instead, to measure another checkout the same way) and runs, one after the other:

1. *big prompts*: SESSIONS sessions with PROMPT-character system prompts, then batches of 8
   ``sessions.list`` (limit 200), then a client that never reads with 32 ``sessions.list``
   in flight;
2. *ping floods*: pings of 125 bytes as fast as the socket takes them, without reading the
   pongs, for FLOOD seconds, before and after authentication;
3. *request flood*: 500 idle connections plus one connection sending 6,000 requests as fast
   as TCP takes them (a child process), while a well-behaved client times ``gateway.health``;
4. *descriptors*: under a 1024 open-file limit, 1,500 unauthenticated connections, then
   ``sessions.create`` from a client connected before.
5. *big history pages*: one session of 200 messages of 250 kB, then one batch frame of 20
   ``sessions.history`` (limit 200) — a page is capped by bytes and a batch shares one reply
   budget, where before the daemon built all 20 pages (1 GB) before refusing the reply.
6. *N1, unauthenticated sockets*: 1,100 upgrades that never authenticate, each reopened as the
   daemon closes or refuses it (0.5 s later), while 10 fresh connections with the token
   (``Authorization`` header) each try one ``gateway.health``.

7. *N2, pipelined big pages*: one user's CONNS connections (``--n2-connections``, 1 and 6 by
   default, each count a fresh daemon) each pipeline 32 ``sessions.history`` pages of a session of
   200 messages of 250 kB, never reading; RSS growth over the daemon at rest after 10 s, once the
   memory index has caught up with that session (a daemon started before, not measured).

8. *N4, big chat messages*: batches of 16 ``chat.send`` of 250 kB over 16 sessions, each
   batch sent once the last one is answered, for 15 s, against the loopback fake model; the
   bytes the data dir grew by.

9. *t16, fairness*: alice's ``sessions.list`` p50 alone, then while bob (another user, in a
   child process) keeps 32 ``sessions.list`` (limit 200) in flight on each of 8 connections,
   timed once bob has had as many answers as he has calls in flight (his process takes seconds
   to start on a loaded machine) until alice is done; bob's answers per second meanwhile say
   that the flood was on.

10. *M3, phrase-dense searches*: alice's ``memory.search`` p50 alone, then while bob keeps 4
    ``memory.search`` of 8,000 characters dense in time phrases running (his quota), in a child
    process, timed as t16 is.

11. *H1, half-sent /mcp requests*: under a 1024 open-file limit, 1,100 ``POST /mcp`` whose
    headers never end (no token; each reopened 0.5 s after the daemon closes it), then 10
    ``sessions.create`` from a client connected before and 10 fresh gateway connections.

12. *M1, half-sent page requests*: the same with 1,100 ``GET /`` on the gateway's own port;
    10 fresh connections with the token.

13. *H2, one user's connections*: bob opens 1,100 authenticated connections and holds them;
    then 10 fresh connections of alice.

14. *M2, big MCP bodies*: alice's ``sessions.list`` p50 alone, then while bob (a child process)
    keeps 2 streams of ``POST /mcp`` with 4 MiB bodies (a ``tools/call`` whose argument is one
    long string) going, each sent as the last is answered; timed as t16 is. Then again with 16
    streams of 252 KiB bodies (under ``mcp.max_request_bytes``).

``--only NAME,…`` runs some of them (names: prompts, pings, flood, descriptors, history, n1, n2, n4,
t16, m3, h1, m1, h2, m2).

For each it prints the daemon's peak resident memory (VmRSS sampled every 10 ms) and its open
descriptors. Figures only: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect

from gateway.client import Client
from testkit.gateway import TOKEN

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


class Sampler:
    """Peak VmRSS (KiB) of a process, sampled every 10 ms from a thread."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError, ValueError):
                self.peak = max(self.peak, _status(self.pid, "VmRSS"))
            self._stop.wait(0.01)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class Daemon:
    def __init__(self, data_dir: Path, root: Path | None, nofile: int | None, env: dict[str, str],
                 config: Path | None = None) -> None:
        child_env = {k: v
                     for k, v in os.environ.items() if not k.startswith(("RECALLD_", "OPENAI_"))}
        child_env.update({"RECALLD_TOKEN": TOKEN, "RECALLD_MEMORY_WATCH": "false",
                          "RECALLD_MEMORY_EMBEDDER": "none", "RECALLD_LOG_FORMAT": "json",
                          "RECALLD_SESSIONS_FSYNC": "never", **env})
        if root is not None:
            child_env["PYTHONPATH"] = str(root)

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE,
                                   (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--data-dir", str(data_dir),
             *(["--config", str(config)] if config else []), "serve", "--port", "0"],
            cwd=root or Path.cwd(), env=child_env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=limit)
        assert self.proc.stderr is not None
        self.log: list[dict[str, Any]] = []
        for line in self.proc.stderr:
            with contextlib.suppress(orjson.JSONDecodeError):
                record = orjson.loads(line)
                if isinstance(record, dict) and record.get("event") == "gateway.listening":
                    self.url = f"ws://127.0.0.1:{record['port']}/"
                    break
        else:
            raise RuntimeError("daemon exited before listening")
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with contextlib.suppress(orjson.JSONDecodeError):
                record = orjson.loads(line)
                if isinstance(record, dict):
                    self.log.append(record)

    @property
    def rss_mib(self) -> float:
        return _status(self.proc.pid, "VmRSS") / 1024

    @property
    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def _report(name: str, d: Daemon, sampler: Sampler, **extra: Any) -> None:
    more = "".join(f"; {k} {v}" for k, v in extra.items())
    print(f"{name}: peak RSS {sampler.peak / 1024:.0f} MiB, now {d.rss_mib:.0f} MiB, "
          f"{d.fds} fds{more}", flush=True)


async def big_prompts(d: Daemon, sessions: int, prompt_chars: int) -> None:
    prompt = "é" * prompt_chars
    async with Client.connect(d.url, TOKEN) as c:
        for _ in range(sessions):
            await c.call("sessions.create", {"systemPrompt": prompt})
        print(f"big prompts: {sessions} sessions of {prompt_chars} chars; "
              f"daemon at {d.rss_mib:.0f} MiB", flush=True)
        with Sampler(d.proc.pid) as s:
            sizes = []
            for round_ in range(3):
                await c.ws.send(orjson.dumps([{"id": f"r{round_}-{i}", "method": "sessions.list",
                                               "params": {"limit": 200}} for i in range(8)]),
                                text=True)
                reply = await c.events.get()
                sizes.append(len(orjson.dumps(reply)))
        _report("  batch of 8 sessions.list x3", d, s, reply_bytes=max(sizes))
    with Sampler(d.proc.pid) as s:
        ws = await connect(d.url, additional_headers=AUTH, max_size=None)
        ws.transport.pause_reading()
        for i in range(32):
            await ws.send(orjson.dumps({"id": i, "method": "sessions.list",
                                        "params": {"limit": 200}}).decode())
        await asyncio.sleep(5)
        _report("  never-reading client, 32 sessions.list in flight (5 s)", d, s)
        ws.transport.abort()


async def ping_flood(d: Daemon, seconds: float, authenticated: bool) -> None:
    with Sampler(d.proc.pid) as s:
        ws = await connect(d.url, additional_headers=AUTH if authenticated else None,
                           ping_interval=None)
        ws.transport.pause_reading()
        sent, t0 = 0, time.monotonic()
        with contextlib.suppress(Exception):
            while time.monotonic() - t0 < seconds and not ws.transport.is_closing():
                for _ in range(100):
                    ws.protocol.send_ping(sent.to_bytes(4, "big") + b"p" * 121)
                    sent += 1
                ws.send_data()
                await asyncio.sleep(0)
        closed_after = round(time.monotonic() - t0, 2) if ws.transport.is_closing() else None
        ws.transport.abort()
        await asyncio.sleep(0.5)
    _report(f"ping flood ({'authenticated' if authenticated else 'unauthenticated'}, "
            f"{seconds:g} s)", d, s,
            pings_sent=sent, closed_by_server_after_s=closed_after)


async def flood_child(url: str, connections: int, requests: int) -> None:
    """The attacker of the request flood (runs in its own process)."""
    opened = await asyncio.gather(*(connect(url, additional_headers=AUTH, open_timeout=60)
                                    for _ in range(connections)), return_exceptions=True)
    codes: Counter[str] = Counter()
    async with connect(url, additional_headers=AUTH, max_size=None) as ws:
        async def read() -> None:
            while sum(codes.values()) < requests:
                msg = orjson.loads(await ws.recv())
                codes[str(msg["error"]["code"]) if "error" in msg else "ok"] += 1

        reader = asyncio.create_task(read())
        methods = ["sessions.list", "gateway.health", "memory.status", "rpc.discover"]
        for i in range(requests):
            await ws.send(orjson.dumps({"id": i, "method": methods[i % 4]}).decode())
        await asyncio.wait_for(reader, 120)
    for w in opened:
        if isinstance(w, ClientConnection):
            await w.close()
    print(orjson.dumps({"opened": sum(isinstance(w, ClientConnection) for w in opened),
                        "codes": codes}).decode())


async def request_flood(d: Daemon) -> None:
    latencies: list[float] = []
    done = asyncio.Event()
    fds = 0

    async def probe() -> None:
        nonlocal fds
        async with Client.connect(d.url, TOKEN) as c:
            while not done.is_set():
                t0 = time.perf_counter()
                await c.call("gateway.health")
                latencies.append(time.perf_counter() - t0)
                fds = max(fds, d.fds)
                await asyncio.sleep(0.005)

    with Sampler(d.proc.pid) as s:
        task = asyncio.create_task(probe())
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.attacks", "--flood-child", d.url,
            stdout=asyncio.subprocess.PIPE)
        out, _ = await child.communicate()
        done.set()
        await task
    ordered = sorted(latencies)
    p50, p99 = ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    _report("request flood (500 connections + 6000 requests)", d, s, attacker=out.decode().strip(),
            health=f"p50 {p50 * 1000:.1f} ms p99 {p99 * 1000:.1f} ms over {len(ordered)} calls",
            peak_fds=fds)


async def descriptor_flood(root: Path | None, n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon(Path(tmp) / "data", root, 1024, {})
        opened: list[ClientConnection] = []
        try:
            async with Client.connect(d.url, TOKEN) as good:
                async def one() -> None:
                    with contextlib.suppress(Exception):
                        opened.append(await connect(d.url, open_timeout=20, ping_interval=None))

                with Sampler(d.proc.pid) as s:
                    await asyncio.gather(*(one() for _ in range(n)))
                    fds = d.fds
                    creates = Counter("ok" if "result" in r else r["error"]["message"][:60]
                                      for r in [await good.request("sessions.create")
                                                for _ in range(20)])
                accept_lines = sum("accept" in str(r.get("event", "")) + str(r.get("message", ""))
                                   for r in d.log)
                _report(f"descriptors ({n} unauthenticated connections, open-file limit 1024)",
                        d, s, opened=len(opened), fds_under_attack=fds, creates=dict(creates),
                        accept_log_lines=accept_lines)
        finally:
            await asyncio.gather(*(w.close() for w in opened), return_exceptions=True)
            d.stop()


async def _big_session(data: Path, root: Path | None, messages: int, message_chars: int) -> str:
    """A session of ``messages`` messages of ``message_chars`` characters, written while no daemon
    runs (the store's directory lock)."""
    from sessions import SessionsConfig, SessionStore

    d = Daemon(data, root, None, {})
    try:
        async with Client.connect(d.url, TOKEN) as c:
            key: str = (await c.call("sessions.create"))["sessionKey"]
    finally:
        d.stop()
    with SessionStore(data, SessionsConfig(fsync="never")) as store:
        for _ in range(messages):
            store.append_message("default", key, role="user", content="x" * message_chars)
    await _indexed(data, root)
    return key


async def _indexed(data: Path, root: Path | None) -> None:
    """Start a daemon on ``data`` until its memory index has caught up with the transcripts,
    so that the daemons measured next do not count that one-off work (indexing a 50 MB
    transcript costs the first daemon that sees it some 250 MB, more than any attack here)."""
    d = Daemon(data, root, None, {})
    try:
        async with Client.connect(d.url, TOKEN) as c:
            async with asyncio.timeout(300):
                while True:
                    status = await c.call("memory.status")
                    if status.get("syncCount", 1) >= 1 and not status.get("syncing"):
                        break
                    await asyncio.sleep(0.1)
    finally:
        d.stop()


async def big_history(root: Path | None, batch: int = 20, messages: int = 200,
                      message_chars: int = 250_000) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        key = await _big_session(data, root, messages, message_chars)
        d = Daemon(data, root, None, {})
        try:
            start = d.rss_mib
            async with Client.connect(d.url, TOKEN) as c:
                with Sampler(d.proc.pid) as s:
                    await c.ws.send(orjson.dumps([{"id": i, "method": "sessions.history",
                                                   "params": {"sessionKey": key, "limit": 200}}
                                                  for i in range(batch)]), text=True)
                    # The client hands a batch reply's entries to ``events`` one by one; a
                    # daemon that refuses the whole reply answers once.
                    answers = [await asyncio.wait_for(c.events.get(), 120)]
                    with contextlib.suppress(TimeoutError):
                        while len(answers) < batch:
                            answers.append(await asyncio.wait_for(c.events.get(), 5))
            pages = [a["result"] for a in answers if "result" in a]
            codes = Counter(a["error"]["code"] for a in answers if "error" in a)
            _report(f"big history pages: batch of {batch} sessions.history over {messages} x "
                    f"{message_chars // 1000} kB (daemon at {start:.0f} MiB before)", d, s,
                    pages=len(pages), messages_served=sum(len(p["messages"]) for p in pages),
                    errors=dict(codes), reply_bytes=len(orjson.dumps(answers)))
        finally:
            d.stop()


async def pipelined_pages(root: Path | None, conns: tuple[int, ...] = (1, 6),
                          calls: int = 32) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data"
        key = await _big_session(data, root, 200, 250_000)
        for n in conns:
            d = Daemon(data, root, None, {})
            try:
                rest = d.rss_mib
                with Sampler(d.proc.pid) as s:
                    opened = [await connect(d.url, additional_headers=AUTH, max_size=None)
                              for _ in range(n)]
                    frame = orjson.dumps({"method": "sessions.history",
                                          "params": {"sessionKey": key, "limit": 200}})
                    for ws in opened:
                        ws.transport.pause_reading()
                        for i in range(calls):
                            await ws.send(orjson.dumps({"id": i, **orjson.loads(frame)}).decode())
                    await asyncio.sleep(10)
                    for ws in opened:
                        ws.transport.abort()
                _report(f"N2 {n} connection(s) x {calls} pipelined sessions.history pages, "
                        "never read (10 s)",
                        d, s, rss_growth_mib=f"{s.peak / 1024 - rest:.0f}",
                        per_connection_mib=f"{(s.peak / 1024 - rest) / n:.0f}")
            finally:
                d.stop()


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


async def chat_bytes(root: Path | None, seconds: float = 15.0, sessions: int = 16,
                     chars: int = 250_000) -> None:
    from testkit.fake_openai import FakeOpenAI

    async with FakeOpenAI(max_recorded=16) as model:
        model.configure(reply="ok")
        with tempfile.TemporaryDirectory() as tmp:
            data = Path(tmp) / "data"
            d = await asyncio.to_thread(Daemon, data, root, None, {
                "RECALLD_LLM_BASE_URL": model.base_url, "RECALLD_LLM_API_KEY": "sk-bench",
                "RECALLD_CHAT_RECALL": "false"})
            try:
                async with Client.connect(d.url, TOKEN) as c:
                    keys = [(await c.call("sessions.create"))["sessionKey"]
                            for _ in range(sessions)]
                    start, codes, t0 = _tree_bytes(data), Counter[str](), time.monotonic()
                    with Sampler(d.proc.pid) as s:
                        while time.monotonic() - t0 < seconds:
                            await c.ws.send(orjson.dumps([{"id": f"{i}", "method": "chat.send",
                                                           "params": {"sessionKey": k,
                                                                      "message": "x" * chars}}
                                                          for i, k in enumerate(keys)]), text=True)
                            answered = 0
                            while answered < sessions:
                                msg = await asyncio.wait_for(c.events.get(), 60)
                                if "id" in msg:
                                    answered += 1
                                    codes[str(msg["error"]["code"]) if "error" in msg
                                          else "ok"] += 1
                    grown = _tree_bytes(data) - start
                _report(f"N4 batches of {sessions} chat.send of {chars // 1000} kB for "
                        f"{seconds:g} s", d, s,
                        data_dir_grew_mb=f"{grown / 1e6:.1f}", sends=dict(codes))
            finally:
                d.stop()


ALICE, BOB = "alice-bench-token-0123456789", "bob-bench-token-0123456789xx"


async def bob_child(url: str, connections: int = 8, depth: int = 32) -> None:
    """Bob's flood (runs in its own process): ``depth`` calls in flight on each connection, one
    sent as each answer arrives. Prints ``ready`` once as many answers as calls in flight have
    come back (the flood is on), goes on until its stdin closes, then prints what it was
    answered, and how many answers came after ``ready`` (``during``)."""
    answered = Counter[str]()
    stop = asyncio.Event()
    on = asyncio.Event()

    async def one() -> None:
        async with connect(url, additional_headers={"Authorization": f"Bearer {BOB}"},
                           max_size=None) as ws:
            frame = orjson.dumps({"id": 0, "method": "sessions.list",
                                  "params": {"limit": 200}}).decode()
            for _ in range(depth):
                await ws.send(frame)
            while not stop.is_set():
                msg = orjson.loads(await ws.recv())
                answered["ok" if "result" in msg else str(msg["error"]["code"])] += 1
                if answered.total() >= connections * depth:
                    on.set()
                await ws.send(frame)

    tasks = [asyncio.create_task(one()) for _ in range(connections)]
    await on.wait()
    before = answered.total()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.read)  # the parent closes it when it has measured
    during = answered.total() - before
    stop.set()
    await asyncio.wait(tasks, timeout=5)
    print(orjson.dumps({**answered, "during": during}).decode(), flush=True)


async def _alice_under_bob(d: Daemon, call: Callable[[], Awaitable[object]], samples: int,
                           child_args: list[str],
                           what: str) -> tuple[float, float, float, dict[str, int], Sampler]:
    """Alice's p50 (ms) of ``call`` alone, then while bob's child process (``python -m
    bench.attacks CHILD_ARGS``) runs; timed only once bob's flood is on, from his ``ready`` (his
    process takes seconds to start on a loaded machine) until she is done. Returns quiet p50,
    flooded p50, the seconds she was timed, what bob was answered, and the daemon's sampler."""

    async def p50() -> float:
        took = []
        for _ in range(samples):
            t0 = time.perf_counter()
            await call()
            took.append(time.perf_counter() - t0)
        return sorted(took)[len(took) // 2] * 1000

    quiet = await p50()
    with Sampler(d.proc.pid) as sampler:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.attacks", *child_args,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        assert child.stdin is not None and child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 120)
        if line.strip() != b"ready":
            raise RuntimeError(f"{what} did not start: {line!r}")
        t0 = time.monotonic()
        flooded = await p50()
        window = time.monotonic() - t0
        child.stdin.close()
        out, _ = await child.communicate()
    return quiet, flooded, window, orjson.loads(out), sampler


async def fairness(root: Path | None, samples: int = 300) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "config.toml"
        cfg.write_text(f'[auth]\nusers = [{{name = "alice", token = "{ALICE}"}}, {{name = "bob", '
                       f'token = "{BOB}"}}]\n[quotas]\nsessions_per_minute = 100000\n')
        d = Daemon(Path(tmp) / "data", root, None, {"RECALLD_TOKEN": ""}, config=cfg)
        try:
            async with Client.connect(d.url, BOB) as bob, Client.connect(d.url, ALICE) as alice:
                for i in range(200):
                    await bob.call("sessions.create", {"title": f"bob {i}"})
                for i in range(20):
                    await alice.call("sessions.create", {"title": f"alice {i}"})

                quiet, flooded, window, bob_answers, s = await _alice_under_bob(
                    d, lambda: alice.call("sessions.list", {"limit": 20}), samples,
                    ["--bob-child", d.url], "bob's flood")
            _report("t16 fairness: alice's sessions.list under bob's flood (8 connections x 32 "
                    "in flight)", d, s,
                    alice_p50_quiet_ms=f"{quiet:.1f}", alice_p50_flooded_ms=f"{flooded:.1f}",
                    ratio=f"{flooded / quiet:.1f}x", alice_timed_s=f"{window:.1f}",
                    bob_answers_per_s_meanwhile=f"{bob_answers.pop('during') / window:.0f}",
                    bob=orjson.dumps(bob_answers).decode())
        finally:
            d.stop()


# M3's question: MAX_QUERY_CHARS (8,000) characters dense in time phrases.
PHRASE_DENSE = ("yesterday morning last week in May 2023 two days ago on March 3rd the past 3 "
                "months recently 2024-01-02 last Monday in 2022 summer 2021 ") * 80


async def search_child(url: str, depth: int = 4) -> None:
    """Bob's phrase-dense searches (runs in its own process): ``depth`` ``memory.search`` in
    flight (quotas.max_searches_per_user), one sent as each answer arrives; prints ``ready``
    after ``depth`` answers, goes on until its stdin closes, then prints what it was answered."""
    answered = Counter[str]()
    stop = asyncio.Event()
    on = asyncio.Event()
    frame = orjson.dumps({"id": 0, "method": "memory.search",
                          "params": {"query": PHRASE_DENSE[:8000]}}).decode()
    async with connect(url, additional_headers={"Authorization": f"Bearer {BOB}"},
                       max_size=None) as ws:
        async def run() -> None:
            for _ in range(depth):
                await ws.send(frame)
            while not stop.is_set():
                msg = orjson.loads(await ws.recv())
                answered["ok" if "result" in msg else str(msg["error"]["code"])] += 1
                if answered.total() >= depth:
                    on.set()
                await ws.send(frame)

        task = asyncio.create_task(run())
        await on.wait()
        before = answered.total()
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.read)
        during = answered.total() - before
        stop.set()
        await asyncio.wait([task], timeout=5)
    print(orjson.dumps({**answered, "during": during}).decode(), flush=True)


async def phrase_searches(root: Path | None, samples: int = 300) -> None:
    """M3: alice's ``memory.search`` p50 alone, then while bob keeps 4 phrase-dense searches
    running."""
    from sessions import SessionsConfig, SessionStore

    with tempfile.TemporaryDirectory() as tmp:
        cfg, data = Path(tmp) / "config.toml", Path(tmp) / "data"
        cfg.write_text(f'[auth]\nusers = [{{name = "alice", token = "{ALICE}"}}, {{name = "bob", '
                       f'token = "{BOB}"}}]\n')
        # something to find, for both
        with SessionStore(data, SessionsConfig(fsync="never")) as store:
            for user in ("alice", "bob"):
                for i in range(100):
                    key = store.create(user, title=f"{user} {i}").session_key
                    for j in range(10):
                        store.append_message(user, key, role="user" if j % 2 == 0 else "assistant",
                                             content=f"we planned the trip to Lisbon {i} with "
                                                     f"Anna, step {j}: trains, {j + 2} days, "
                                                     f"the museum on day {i % 7}")
        d = Daemon(data, root, None, {"RECALLD_TOKEN": ""}, config=cfg)
        try:
            async with Client.connect(d.url, ALICE) as alice:
                async with asyncio.timeout(300):  # the index caught up before anything is timed
                    while True:
                        status = await alice.call("memory.status")
                        if (status.get("chunks", 0) and status.get("syncCount", 1) >= 1
                                and not status.get("syncing")):
                            break
                        await asyncio.sleep(0.2)

                quiet, flooded, window, bob_answers, s = await _alice_under_bob(
                    d, lambda: alice.call("memory.search",
                                          {"query": "what did Anna say about the trip to Lisbon"}),
                    samples, ["--search-child", d.url], "bob's searches")
            _report("M3 phrase-dense searches: alice's memory.search while bob keeps 4 of 8,000 "
                    "characters running",
                    d, s, alice_p50_quiet_ms=f"{quiet:.1f}", alice_p50_flooded_ms=f"{flooded:.1f}",
                    ratio=f"{flooded / quiet:.1f}x", alice_timed_s=f"{window:.1f}",
                    bob_searches_per_s_meanwhile=f"{bob_answers.pop('during') / window:.0f}",
                    bob=orjson.dumps(bob_answers).decode())
        finally:
            d.stop()


async def preauth_flood(root: Path | None, n: int = 1100, fresh: int = 10) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon(Path(tmp) / "data", root, None, {})
        stop = asyncio.Event()
        held = Counter[str]()

        async def squat() -> None:
            while not stop.is_set():
                try:
                    ws = await connect(d.url, open_timeout=20, ping_interval=None)
                except Exception:
                    held["refused"] += 1
                    await asyncio.sleep(0.5)
                    continue
                held["opened"] += 1
                with contextlib.suppress(Exception):
                    await ws.wait_closed()  # the daemon closes it at auth.timeout_s
                await asyncio.sleep(0.5)

        try:
            with Sampler(d.proc.pid) as s:
                squatters = [asyncio.create_task(squat()) for _ in range(n)]
                await asyncio.sleep(3)  # every squatter has tried once
                outcomes: Counter[str] = Counter()
                for _ in range(fresh):
                    try:
                        async with Client.connect(d.url, TOKEN) as c:
                            await c.call("gateway.health")
                            outcomes["ok"] += 1
                    except Exception as exc:
                        outcomes[type(exc).__name__ + " " + str(exc)[:40]] += 1
                stop.set()
                for t in squatters:
                    t.cancel()
                await asyncio.gather(*squatters, return_exceptions=True)
            _report(f"N1 unauthenticated sockets ({n} held and reopened)", d, s,
                    authenticated_ok=f"{outcomes['ok']}/{fresh}", outcomes=dict(outcomes),
                    squatter_upgrades=held["opened"], squatter_refusals=held["refused"])
        finally:
            d.stop()


async def _half_sent(port: int, head: bytes, stop: asyncio.Event, held: Counter[str]) -> None:
    """Send ``head`` (a request's headers without their end) and wait; reopen 0.5 s after the
    daemon closes it."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            held["refused"] += 1
            await asyncio.sleep(0.5)
            continue
        held["opened"] += 1
        try:
            writer.write(head)
            await reader.read()
            held["closed_by_daemon"] += 1
        except OSError:
            held["reset_by_daemon"] += 1
        finally:
            writer.close()
        await asyncio.sleep(0.5)


async def _fresh(url: str, token: str, n: int) -> Counter[str]:
    outcomes: Counter[str] = Counter()
    for _ in range(n):
        try:
            async with asyncio.timeout(15), Client.connect(url, token) as c:
                await c.call("gateway.health")
                outcomes["ok"] += 1
        except Exception as exc:
            outcomes[type(exc).__name__ + " " + str(exc)[:40]] += 1
    return outcomes


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def slowloris(root: Path | None, on_mcp: bool, n: int = 1100, fresh: int = 10) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mcp_port = _free_port()
        d = Daemon(Path(tmp) / "data", root, 1024,
                   {"RECALLD_MCP_PORT": str(mcp_port)} if on_mcp else {})
        stop = asyncio.Event()
        held = Counter[str]()
        try:
            async with asyncio.timeout(30):
                while on_mcp and not any(r.get("event") == "mcp.listening" for r in d.log):
                    await asyncio.sleep(0.05)
            port = mcp_port if on_mcp else int(d.url.rsplit(":", 1)[1].strip("/"))
            head = (f"{'POST /mcp' if on_mcp else 'GET /'} HTTP/1.1\r\n"
                    f"Host: 127.0.0.1:{port}\r\n").encode()
            async with Client.connect(d.url, TOKEN) as good:
                with Sampler(d.proc.pid) as s:
                    squatters = [asyncio.create_task(_half_sent(port, head, stop, held))
                                 for _ in range(n)]
                    await asyncio.sleep(3)  # every squatter has tried once
                    fds = d.fds
                    creates = Counter("ok" if "result" in r else r["error"]["message"][:60]
                                      for r in [await good.request("sessions.create")
                                                for _ in range(fresh)])
                    outcomes = await _fresh(d.url, TOKEN, fresh)
                    stop.set()
                    for t in squatters:
                        t.cancel()
                    await asyncio.gather(*squatters, return_exceptions=True)
            name = "H1 half-sent POST /mcp" if on_mcp else "M1 half-sent GET / (gateway port)"
            _report(f"{name} ({n} held and reopened, open-file limit 1024)", d, s,
                    fresh_gateway_ok=f"{outcomes['ok']}/{fresh}", outcomes=dict(outcomes),
                    creates=dict(creates), fds_under_attack=fds, squatters=dict(held))
        finally:
            d.stop()


async def user_connections(root: Path | None, n: int = 1100, fresh: int = 10) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "config.toml"
        cfg.write_text(f'[auth]\nusers = [{{name = "alice", token = "{ALICE}"}}, {{name = "bob", '
                       f'token = "{BOB}"}}]\n')
        d = Daemon(Path(tmp) / "data", root, None, {"RECALLD_TOKEN": ""}, config=cfg)
        opened: list[ClientConnection] = []
        refused: Counter[str] = Counter()

        async def bob() -> None:
            try:
                opened.append(await connect(d.url,
                                            additional_headers={"Authorization": f"Bearer {BOB}"},
                                            open_timeout=30, ping_interval=None))
            except Exception as exc:
                refused[type(exc).__name__ + " " + str(exc)[:60]] += 1

        try:
            with Sampler(d.proc.pid) as s:
                t0 = time.monotonic()
                # in waves, as a client opening them as fast as it can would
                for i in range(0, n, 100):
                    await asyncio.gather(*(bob() for _ in range(min(100, n - i))))
                took = time.monotonic() - t0
                outcomes = await _fresh(d.url, ALICE, fresh)
            _report(f"H2 bob holds authenticated connections ({n} tried)", d, s,
                    alice_ok=f"{outcomes['ok']}/{fresh}", outcomes=dict(outcomes),
                    bob_held=len(opened), bob_opening_s=f"{took:.1f}", bob_refused=dict(refused))
        finally:
            await asyncio.gather(*(w.close() for w in opened), return_exceptions=True)
            d.stop()


async def mcp_child(url: str, streams: int = 2, body_bytes: int = 4 * 1024 * 1024 - 4096) -> None:
    """Bob's big MCP bodies (runs in its own process): ``streams`` kept-alive connections, each
    POSTing a ``tools/call`` of ``body_bytes`` as the last is answered; prints ``ready`` after
    each stream's first answer, goes on until stdin closes, then prints the statuses it got."""
    answered = Counter[str]()
    stop = asyncio.Event()
    on = asyncio.Event()
    host, port = url.removeprefix("http://").split("/")[0].rsplit(":", 1)
    filler = "x" * (body_bytes - 200)
    body = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                         "params": {"name": "search_memory", "arguments": {"query": filler}}})
    head = (f"POST /mcp HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {BOB}\r\n"
            f"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()

    async def one() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while not stop.is_set():
                writer.write(head + body)
                await writer.drain()
                status = (await reader.readline()).split(b" ")[1].decode()
                length, close = 0, False
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode().partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                    close |= name.lower() == "connection" and "close" in value.lower()
                await reader.readexactly(length)
                answered[status] += 1
                if answered.total() >= streams:
                    on.set()
                if close:  # the listener ended the connection after answering: open another
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, int(port))
        finally:
            writer.close()

    tasks = [asyncio.create_task(one()) for _ in range(streams)]
    await on.wait()
    before = answered.total()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.read)
    during = answered.total() - before
    stop.set()
    await asyncio.wait(tasks, timeout=5)
    print(orjson.dumps({**answered, "during": during}).decode(), flush=True)


async def mcp_bodies(root: Path | None, samples: int = 3000, streams: int = 2,
                     body_bytes: int = 4 * 1024 * 1024 - 4096) -> None:
    """M2: alice's ``sessions.list`` p50 alone, then while bob keeps ``streams`` streams of MCP
    bodies of ``body_bytes`` going."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg, mcp_port = Path(tmp) / "config.toml", _free_port()
        cfg.write_text(f'[auth]\nusers = [{{name = "alice", token = "{ALICE}"}}, {{name = "bob", '
                       f'token = "{BOB}"}}]\n[mcp]\nport = {mcp_port}\n')
        d = Daemon(Path(tmp) / "data", root, None, {"RECALLD_TOKEN": ""}, config=cfg)
        try:
            async with asyncio.timeout(30):
                while not any(r.get("event") == "mcp.listening" for r in d.log):
                    await asyncio.sleep(0.05)
            async with Client.connect(d.url, ALICE) as alice:
                for i in range(20):
                    await alice.call("sessions.create", {"title": f"alice {i}"})

                quiet, flooded, window, bob_answers, s = await _alice_under_bob(
                    d, lambda: alice.call("sessions.list", {"limit": 20}), samples,
                    ["--mcp-child", f"http://127.0.0.1:{mcp_port}/", "--mcp-streams", str(streams),
                     "--mcp-body", str(body_bytes)], "bob's MCP bodies")
            _report(f"M2 big MCP bodies: alice's sessions.list while bob keeps {streams} streams "
                    f"of {body_bytes / 1024:,.0f} KiB POST /mcp",
                    d, s, alice_p50_quiet_ms=f"{quiet:.1f}", alice_p50_flooded_ms=f"{flooded:.1f}",
                    ratio=f"{flooded / quiet:.1f}x", alice_timed_s=f"{window:.1f}",
                    bob_bodies_per_s_meanwhile=f"{bob_answers.pop('during') / window:.0f}",
                    bob=orjson.dumps(bob_answers).decode())
        finally:
            d.stop()


ATTACKS = ("prompts", "pings", "flood", "descriptors", "history", "n1", "n2", "n4", "t16", "m3",
           "h1", "m1", "h2", "m2")


async def main(args: argparse.Namespace) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    root = Path(args.root).resolve() if args.root else None
    only = set(args.only.split(",")) if args.only else set(ATTACKS)
    if only & {"prompts", "pings", "flood"}:
        with tempfile.TemporaryDirectory() as tmp:
            # Quotas off for the set-up: 200 sessions are created as fast as the socket goes; the
            # request flood's 500 connections are one user's (server.max_connections_per_user,
            # which an older checkout measured with --root does not know: unknown keys are errors).
            env = {"RECALLD_QUOTAS_SESSIONS_PER_MINUTE": "1000000"}
            if "max_connections_per_user" in ((root or Path.cwd()) / "gateway"
                                              / "sections.py").read_text():
                env["RECALLD_SERVER_MAX_CONNECTIONS_PER_USER"] = "1024"
            d = Daemon(Path(tmp) / "data", root, None, env)
            try:
                print(f"daemon {'from ' + str(root) if root else '(this checkout)'}: "
                      f"{d.rss_mib:.0f} MiB at start",
                      flush=True)
                if "prompts" in only:
                    await big_prompts(d, args.sessions, args.prompt_chars)
                if "pings" in only:
                    await ping_flood(d, args.flood_s, authenticated=False)
                    await ping_flood(d, args.flood_s, authenticated=True)
                if "flood" in only:
                    await request_flood(d)
                print("daemon VmHWM (peak over the whole run): "
                      f"{_status(d.proc.pid, 'VmHWM') / 1024:.0f} MiB")
            finally:
                d.stop()
    if "descriptors" in only:
        await descriptor_flood(root, args.connections)
    if "history" in only:
        await big_history(root)
    if "n1" in only:
        await preauth_flood(root)
    if "n2" in only:
        await pipelined_pages(root, tuple(int(n) for n in args.n2_connections.split(",")))
    if "n4" in only:
        await chat_bytes(root)
    if "t16" in only:
        await fairness(root)
    if "m3" in only:
        await phrase_searches(root)
    if "h1" in only:
        await slowloris(root, on_mcp=True)
    if "m1" in only:
        await slowloris(root, on_mcp=False)
    if "h2" in only:
        await user_connections(root)
    if "m2" in only:
        await mcp_bodies(root)  # the review's attack: 4 MiB bodies
        # under mcp.max_request_bytes, more streams
        await mcp_bodies(root, streams=16, body_bytes=252 * 1024)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", help="run the gateway package of this checkout instead")
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--prompt-chars", type=int, default=64 * 1024)
    parser.add_argument("--flood-s", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=1500)
    parser.add_argument("--n2-connections", default="1,6",
                        help="N2's connection counts, comma-separated")
    parser.add_argument("--flood-child", metavar="URL")
    parser.add_argument("--bob-child", metavar="URL")
    parser.add_argument("--search-child", metavar="URL")
    parser.add_argument("--mcp-child", metavar="URL")
    parser.add_argument("--mcp-streams", type=int, default=2)
    parser.add_argument("--mcp-body", type=int, default=4 * 1024 * 1024 - 4096)
    parser.add_argument("--only", help=f"comma-separated, of: {', '.join(ATTACKS)}")
    args = parser.parse_args()
    if args.flood_child:
        asyncio.run(flood_child(args.flood_child, 500, 6000))
    elif args.bob_child:
        asyncio.run(bob_child(args.bob_child))
    elif args.search_child:
        asyncio.run(search_child(args.search_child))
    elif args.mcp_child:
        asyncio.run(mcp_child(args.mcp_child, args.mcp_streams, args.mcp_body))
    else:
        asyncio.run(main(args))
