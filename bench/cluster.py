"""``make bench-cluster``: one node on SQLite, one and two nodes on PostgreSQL, on this machine.

Each topology is real ``recalld serve`` processes (``testkit.gateway.gateway_child``) against
the loopback fake model (``testkit.fake_openai``, its own process, echoing the user) and, for
PostgreSQL, a fresh database on one throwaway server (``testkit.postgres``); the two nodes of
``pg-2`` start at the same moment on an empty database. Measured per topology, the clients
spread evenly over the nodes:

* RPC throughput: ``gateway.health`` over 16 connections, ping-pong (1 in flight each) and
  pipelined (32 in flight), and ``sessions.list`` pipelined (a storage read);
* chat fan-out: 100 subscribers of one session (half on each node for ``pg-2``), time from
  ``chat.send`` to the last subscriber's ``chat.final`` of a 50-word reply;
* index rate: messages appended by chat runs through every node, from the first send until
  each session's last message is found by ``memory.search`` and no vector is pending;
* CPU seconds of the nodes, the PostgreSQL server and the driver in each section.

Then search at scale (:mod:`bench.clustersearch`: the scale corpus on both backends), recall@10
on ``bench/data/sample.json``, and a cProfile of both ``pg-2`` nodes under the same load. Writes
``bench/results/cluster.json``, ``cluster.md`` and ``cluster.png`` (matplotlib, the ``bench``
extra).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.clusterreport import plot, recall_gaps, write_markdown
from bench.rpc import drive
from bench.stats import machine_info, summary_ms
from gateway.client import Client
from testkit.gateway import TOKEN, gateway_child
from testkit.postgres import PostgresServer, running_postgres

RESULTS = Path(__file__).resolve().parent / "results"
TOPOLOGIES = (("sqlite-1", "sqlite", 1), ("pg-1", "postgres", 1), ("pg-2", "postgres", 2))
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SUBSCRIBERS = 100
SECTIONS = ("rpc", "fanout", "index", "search", "recall", "profile")


@dataclass
class Sizes:
    rounds: int
    per_conn: int
    fanout_rounds: int
    sends: int
    sessions: int


QUICK = Sizes(rounds=2, per_conn=150, fanout_rounds=4, sends=40, sessions=4)
FULL = Sizes(rounds=3, per_conn=500, fanout_rounds=10, sends=160, sessions=8)


@dataclass
class Topology:
    name: str
    urls: list[str]
    pids: list[int]
    postgres: PostgresServer | None
    cpu: dict[str, dict[str, float]] = field(default_factory=dict)


# --- processes and their CPU time ------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_of(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime


def _postgres_pids(server: PostgresServer) -> list[int]:
    """The postmaster and its children (one backend per pooled connection)."""
    master = int((server.datadir / "postmaster.pid").read_text().split()[0])
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            ppid = next((int(line.split()[1]) for line in status.splitlines()
                         if line.startswith("PPid:")), 0)
            if ppid == master:
                children.append(int(entry.name))
    return [master, *children]


def cpu_snapshot(topo: Topology, fake_pid: int) -> dict[str, float]:
    own = os.times()
    snap = {"nodes": sum(_cpu_of(p) for p in topo.pids), "model": _cpu_of(fake_pid),
            "driver": own.user + own.system}
    snap["postgres"] = (sum(_cpu_of(p) for p in _postgres_pids(topo.postgres))
                        if topo.postgres else 0.0)
    return snap


@asynccontextmanager
async def cpu_section(topo: Topology, fake_pid: int, name: str) -> AsyncIterator[None]:
    before, started = cpu_snapshot(topo, fake_pid), time.perf_counter()
    yield
    after = cpu_snapshot(topo, fake_pid)
    # Summed over the rounds of a section, which alternate between topologies.
    total = topo.cpu.setdefault(name, dict.fromkeys(("wallS", *before), 0.0))
    total["wallS"] += time.perf_counter() - started
    for k in before:
        total[k] += after[k] - before[k]


@asynccontextmanager
async def fake_model() -> AsyncIterator[tuple[str, int]]:
    """The loopback model as its own process (so its CPU is not the driver's); URL and pid."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "testkit.fake_openai", "--port", "0", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        yield line.rsplit(" ", 1)[-1].strip(), proc.pid
    finally:
        proc.terminate()
        await proc.wait()


def node_env(model_url: str, backend: str, dsn: str | None) -> dict[str, str]:
    env = {"RECALLD_LLM_BASE_URL": model_url, "RECALLD_LLM_API_KEY": "sk-bench",
           "RECALLD_LLM_MODEL": "fake-model", "RECALLD_LLM_MAX_RETRIES": "0",
           "RECALLD_MEMORY_EMBEDDER": "openai",
           "RECALLD_MEMORY_EMBEDDINGS_MODEL": "fake-embed", "RECALLD_MEMORY_WATCH": "true",
           # The throwaway PostgreSQL runs with fsync off; the SQLite node skips fsync too.
           "RECALLD_SESSIONS_FSYNC": "never",
           # The fan-out's subscribers and its sender are one user's connections on one node
           # (server.max_connections_per_user is 64 by default since round 4's hardening).
           "RECALLD_SERVER_MAX_CONNECTIONS_PER_USER": str(SUBSCRIBERS + 8)}
    if backend == "postgres":
        assert dsn is not None
        env.update({"RECALLD_STORAGE_BACKEND": "postgres", "RECALLD_STORAGE_DSN": dsn})
    return env


@asynccontextmanager
async def topology(name: str, backend: str, n: int, root: Path, model_url: str,
                   server: PostgresServer,
                   profile_dir: Path | None = None) -> AsyncIterator[Topology]:
    dsn = server.create_database(name.replace("-", "_")) if backend == "postgres" else None
    async with AsyncExitStack() as stack:
        wrappers = [[sys.executable, "-m", "bench.profiled", str(profile_dir / f"node-{i}.prof")]
                    if profile_dir else [] for i in range(n)]
        # Started at the same moment: nodes on an empty database race for its migrations.
        started = await asyncio.gather(*(
            stack.enter_async_context(gateway_child(
                root / name / f"node-{i}", node_env(model_url, backend, dsn), wrappers[i]))
            for i in range(n)))
        yield Topology(name, [url for url, _ in started], [p.pid for _, p in started],
                       server if backend == "postgres" else None)


# --- RPC throughput --------------------------------------------------------------------------

RPC_CALLS: tuple[tuple[str, str, dict[str, Any] | None, int], ...] = (
    ("health ping-pong", "gateway.health", None, 1),
    ("health pipelined", "gateway.health", None, 32),
    ("sessions.list pipelined", "sessions.list", {"limit": 20}, 32))


async def rpc_section(topos: list[Topology], sizes: Sizes,
                      fake_pid: int) -> dict[str, dict[str, Any]]:
    """Each kind of call, its rounds alternating between the topologies (the machine's load
    drifts; alternating spreads the drift over every side)."""
    out: dict[str, dict[str, Any]] = {t.name: {} for t in topos}
    for label, method, params, window in RPC_CALLS:
        rates: dict[str, list[float]] = {t.name: [] for t in topos}
        lats: dict[str, list[float]] = {t.name: [] for t in topos}
        for topo in topos:
            await drive(topo.urls, method, params, headers=AUTH, per_conn=20,
                        window=window)  # warm-up
        for _ in range(sizes.rounds):
            for topo in topos:
                async with cpu_section(topo, fake_pid, "rpc"):
                    rate, lat = await drive(topo.urls, method, params, headers=AUTH,
                                            per_conn=sizes.per_conn, window=window)
                rates[topo.name].append(rate)
                lats[topo.name].extend(lat)
        for topo in topos:
            out[topo.name][label] = {"rate": statistics.median(rates[topo.name]),
                                     "rates": rates[topo.name], **summary_ms(lats[topo.name])}
    return out


# --- chat fan-out ----------------------------------------------------------------------------

class FanOut:
    """100 subscribers of one session, spread over a topology's nodes, and a sender on the
    first."""

    MESSAGE = " ".join(f"word{i}" for i in range(50))  # echoed back: 50 deltas

    def __init__(self, sender: Client, subs: list[Client], key: str) -> None:
        self.sender, self.subs, self.key = sender, subs, key
        self.last: list[float] = []
        self.first: list[float] = []

    @classmethod
    async def open(cls, topo: Topology, stack: AsyncExitStack) -> FanOut:
        sender = await stack.enter_async_context(Client.connect(topo.urls[0], TOKEN))
        key = (await sender.call("sessions.create", {"title": "fan-out"}))["sessionKey"]
        subs = [await stack.enter_async_context(
                    Client.connect(topo.urls[i % len(topo.urls)], TOKEN))
                for i in range(SUBSCRIBERS)]
        await asyncio.gather(*(s.call("sessions.subscribe", {"sessionKey": key}) for s in subs))
        return cls(sender, subs, key)

    async def round(self, record: bool = True) -> None:
        async def final_at(c: Client) -> float:
            while True:
                event = await c.next_event(timeout=120)
                if event["method"] in ("chat.final", "chat.error", "chat.aborted"):
                    if event["method"] != "chat.final":
                        raise RuntimeError(f"fan-out run ended {event['method']}: "
                                           f"{event['params']}")
                    return time.perf_counter()

        for c in [self.sender, *self.subs]:
            while not c.events.empty():
                c.events.get_nowait()
        waiters = [asyncio.create_task(final_at(s)) for s in self.subs]
        t0 = time.perf_counter()
        await self.sender.call("chat.send", {"sessionKey": self.key, "message": self.MESSAGE})
        done = await asyncio.gather(*waiters)
        if record:
            self.last.append(max(done) - t0)
            self.first.append(min(done) - t0)

    def result(self) -> dict[str, Any]:
        return {"last": summary_ms(self.last), "first": summary_ms(self.first),
                "samples": self.last}


async def fanout_section(topos: list[Topology], sizes: Sizes,
                         fake_pid: int) -> dict[str, dict[str, Any]]:
    """One warm-up round each, then rounds alternating between the topologies."""
    async with AsyncExitStack() as stack:
        benches = {t.name: await FanOut.open(t, stack) for t in topos}
        for topo in topos:
            await benches[topo.name].round(record=False)
        for _ in range(sizes.fanout_rounds):
            for topo in topos:
                async with cpu_section(topo, fake_pid, "fanout"):
                    await benches[topo.name].round()
        return {name: bench.result() for name, bench in benches.items()}


# --- index rate ------------------------------------------------------------------------------

def _token(tag: str, i: int) -> str:
    letters = ""
    i += 26 * 26
    while i:
        i, r = divmod(i, 26)
        letters = chr(97 + r) + letters
    return f"zq{tag}{letters}"


async def index_section(topo: Topology, sizes: Sizes) -> dict[str, Any]:
    tag = {"sqlite-1": "s", "pg-1": "p", "pg-2": "t"}.get(topo.name, "x")
    per = sizes.sends // sizes.sessions
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(
                       Client.connect(topo.urls[i % len(topo.urls)], TOKEN))
                   for i in range(sizes.sessions)]
        keys = [(await c.call("sessions.create", {"title": f"index {i}"}))["sessionKey"]
                for i, c in enumerate(clients)]
        last_token: dict[int, str] = {}

        async def talk(i: int) -> None:
            c = clients[i]
            for j in range(per):
                last_token[i] = _token(tag, i * per + j)
                run = await c.call("chat.send",
                                   {"sessionKey": keys[i],
                                    "message": f"index probe {last_token[i]} about the harbour"})
                while True:
                    event = await c.next_event(timeout=120)
                    if event["method"] in ("chat.final", "chat.error", "chat.aborted") \
                            and event["params"].get("runId") == run["runId"]:
                        break

        started = time.perf_counter()
        await asyncio.gather(*(talk(i) for i in range(sizes.sessions)))
        finals = time.perf_counter()
        waiting = set(range(sizes.sessions))
        async with asyncio.timeout(180):
            while True:
                for i in list(waiting):
                    hits = (await clients[i].call("memory.search", {"query": last_token[i], "k": 3,
                                                                    "mode": "keyword"}))["results"]
                    if any(last_token[i] in h["content"] for h in hits):
                        waiting.discard(i)
                pending = 0
                if not waiting:
                    for c in clients[:len(topo.urls)]:
                        pending += int((await c.call("memory.status", {}))["pending"])
                if not waiting and not pending:
                    break
                await asyncio.sleep(0.05)
        searchable = time.perf_counter()
    messages = 2 * per * sizes.sessions
    return {"messages": messages, "rate": messages / (searchable - started),
            "sendS": finals - started, "lagAfterLastFinalMs": (searchable - finals) * 1000}


# --- profile ---------------------------------------------------------------------------------

# First match wins: the waits first (idle worker threads, the idle loop, a thread blocked on a
# PostgreSQL reply), then start-up imports, then the code that does the work.
_AREAS: tuple[tuple[str, str], ...] = (
    ("<method 'get' of '_queue.SimpleQueue'", "wait: idle worker threads"),
    ("<method 'acquire' of '_thread.lock'", "wait: idle worker threads"),
    ("/threading.py", "wait: idle worker threads"), ("/concurrent/", "wait: idle worker threads"),
    ("'poll' of 'select.epoll'", "wait: idle event loop"), ("selectors", "wait: idle event loop"),
    ("psycopg/connection.py", "wait: a PostgreSQL reply (sync driver)"),
    ("psycopg/waiting.py", "wait: a PostgreSQL reply (sync driver)"),
    ("builtins.compile", "start-up imports"), ("builtins.exec", "start-up imports"),
    ("marshal.loads", "start-up imports"), ("__build_class__", "start-up imports"),
    ("<frozen importlib", "start-up imports"), ("pydantic", "start-up imports"),
    ("psycopg", "psycopg (driver)"), ("websockets", "websockets (frames)"),
    ("/asyncio/", "asyncio (loop)"), ("/gateway/", "gateway"), ("/memory/", "memory"),
    ("/sessions/", "sessions"), ("orjson", "orjson"),
    ("openai", "openai SDK"), ("httpx", "httpx/httpcore"), ("httpcore", "httpx/httpcore"),
    ("structlog", "logging"), ("/logging/", "logging"), ("ssl", "ssl"), ("socket", "sockets"),
)


def summarize_profile(path: Path, top: int = 20) -> dict[str, Any]:
    stats = pstats.Stats(str(path))
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values())
    areas: dict[str, float] = {}
    rows = []
    for (file, line, func), (_cc, calls, tottime, cumtime, _callers) in raw.items():
        where = f"{file}:{line}({func})"
        area = next((label for needle, label in _AREAS if needle in where), "other")
        areas[area] = areas.get(area, 0.0) + tottime
        rows.append((tottime, calls, cumtime, where))
    rows.sort(reverse=True)
    busy = sum(v for k, v in areas.items() if not k.startswith("wait:"))
    waits = [needle for needle, label in _AREAS if label.startswith("wait:")]
    busy_rows = [r for r in rows if not any(needle in r[3] for needle in waits)]
    return {"totalS": total, "busyS": busy,
            "areas": dict(sorted(areas.items(), key=lambda kv: -kv[1])),
            "top": [{"tottimeS": t, "calls": n, "cumtimeS": c, "where": w[-110:]}
                    for t, n, c, w in busy_rows[:top]]}


# --- driver ----------------------------------------------------------------------------------

async def run_topologies(server: PostgresServer, sizes: Sizes, only: set[str],
                         root: Path) -> dict[str, Any]:
    """Every topology up at once (idle nodes cost little), so RPC and fan-out rounds alternate
    between them; the index runs one topology at a time (its messages would wake every node)."""
    results: dict[str, Any] = {}
    async with fake_model() as (model_url, fake_pid):
        if only & {"rpc", "fanout", "index"}:
            async with AsyncExitStack() as stack:
                topos = [await stack.enter_async_context(
                             topology(name, backend, n, root, model_url, server))
                         for name, backend, n in TOPOLOGIES]
                for topo, (_, backend, n) in zip(topos, TOPOLOGIES):
                    results[topo.name] = {"nodes": n, "backend": backend, "cpu": topo.cpu}
                for section, fn in (("rpc", rpc_section), ("fanout", fanout_section)):
                    if section in only:
                        print(f"· {section}, rounds alternating over "
                              f"{', '.join(t.name for t in topos)}", flush=True)
                        for name, fig in (await fn(topos, sizes, fake_pid)).items():
                            results[name][section] = fig
                            print(f"  {name}: {_one_line(section, fig)}", flush=True)
                if "index" in only:
                    for topo in topos:
                        async with cpu_section(topo, fake_pid, "index"):
                            results[topo.name]["index"] = fig = await index_section(topo, sizes)
                        print(f"  index {topo.name}: {_one_line('index', fig)}", flush=True)
        if "profile" in only:
            print("· pg-2 under cProfile (rpc pipelined, fan-out, index)", flush=True)
            prof_dir = root / "profile"
            prof_dir.mkdir(parents=True, exist_ok=True)
            async with topology("pg-2p", "postgres", 2, root, model_url, server,
                                profile_dir=prof_dir) as topo, \
                    AsyncExitStack() as stack:
                await drive(topo.urls, "gateway.health", None, headers=AUTH,
                            per_conn=sizes.per_conn, window=32)
                fan = await FanOut.open(topo, stack)
                for _ in range(max(2, sizes.fanout_rounds // 2)):
                    await fan.round()
                await index_section(topo, sizes)
            results["profile"] = {f"node-{i}": summarize_profile(prof_dir / f"node-{i}.prof")
                                  for i in range(2) if (prof_dir / f"node-{i}.prof").exists()}
    return results


def _one_line(section: str, fig: dict[str, Any]) -> str:
    if section == "rpc":
        return ", ".join(f"{k} {v['rate']:,.0f}/s" for k, v in fig.items())
    if section == "fanout":
        return f"last subscriber p50 {fig['last']['p50']:.1f} ms, p99 {fig['last']['p99']:.1f} ms"
    return (f"{fig['messages']} messages, {fig['rate']:.1f} msg/s, lag after last final "
            f"{fig['lagAfterLastFinalMs']:.0f} ms")


def search_section(server: PostgresServer, size: int, n_queries: int) -> dict[str, Any]:
    from bench import clustersearch
    from bench.scale import _child
    from bench.scalecorpus import build

    print(f"· search at {size:,} chunks", flush=True)
    corpus = build(size, log=lambda line: print(line, flush=True))
    dsn = server.create_database(f"search_{size}")
    load = clustersearch.load_transcripts(corpus.data_dir, dsn)
    print(f"  loaded {load['messages']:,} messages into PostgreSQL in {load['loadS']:.0f} s; "
          "indexing…", flush=True)
    indexed = asyncio.run(clustersearch.index_postgres(corpus.data_dir, dsn))
    print(f"  PostgreSQL index: {indexed['keywordChunks']:,} chunks keyword-only in "
          f"{indexed['keywordS']:.1f} s "
          f"({indexed['keywordChunks'] / indexed['keywordS']:,.0f}/s), then vectors and HNSW in "
          f"{indexed['indexS']:.0f} s", flush=True)
    sqlite_build = clustersearch.sqlite_keyword_build(corpus.data_dir)
    print(f"  SQLite index rebuilt keyword-only: {sqlite_build['keywordChunks']:,} chunks in "
          f"{sqlite_build['keywordS']:.1f} s "
          f"({sqlite_build['keywordChunks'] / sqlite_build['keywordS']:,.0f}/s)",
          flush=True)
    sqlite = _child(size, n_queries, False, {})
    pg = clustersearch.measure_postgres(corpus.data_dir, dsn, n_queries)
    server.drop_database(f"search_{size}")
    return {"size": size, "chunks": {"sqlite": corpus.chunks, "postgres": indexed["chunks"]},
            "build": {"sqlite": {**corpus.build, "thisRun": sqlite_build},
                      "postgres": {**load, **indexed}},
            "sqlite": {"library": sqlite["library"], "recall10": sqlite["recall10"],
                       "restartMs": sqlite["restart"]["ms"]},
            "postgres": {"library": pg["library"], "recall10": pg.get("recall10"),
                         "restartMs": pg["restart"]["ms"], "hybridPlan": pg.get("hybridPlan")}}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and sends, 10k chunks")
    parser.add_argument("--size", type=int, default=None,
                        help="search corpus chunks (default 100000; quick 10000)")
    parser.add_argument("--queries", type=int, default=100, help="search queries per mode")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    args = parser.parse_args()
    from bench import clustersearch
    from bench.scale import structlog_quiet

    structlog_quiet()
    sizes = QUICK if args.quick else FULL
    size = args.size or (10_000 if args.quick else 100_000)
    only = set(args.only)
    started = time.perf_counter()
    stem = "cluster-partial" if args.quick or only != set(SECTIONS) else "cluster"
    RESULTS.mkdir(exist_ok=True)
    results: dict[str, Any] = {}

    def save() -> dict[str, Any]:
        # After every phase, so a run cut short still leaves what it measured.
        out = {"at": datetime.now(UTC).isoformat(), "machine": machine_info(),
               "seconds": round(time.perf_counter() - started, 1), "loadAverage": os.getloadavg(),
               "quick": args.quick, "sizes": sizes.__dict__, "searchSize": size,
               "queries": args.queries, "sections": sorted(only), "results": results}
        (RESULTS / f"{stem}.json").write_text(json.dumps(out, indent=2, default=str))
        return out

    with tempfile.TemporaryDirectory(prefix="recalld-cluster-") as tmp, \
            running_postgres() as server:
        results.update(asyncio.run(run_topologies(server, sizes, only, Path(tmp))))
        save()
        if "recall" in only:
            print("· recall@10 on bench/data/sample.json (local embedder)", flush=True)
            results["recall"] = clustersearch.recall_runs(server.dsn(), Path(tmp) / "recall")
            save()
        if "search" in only:
            results["search"] = search_section(server, size, args.queries)
    out = save()
    table = write_markdown(out, RESULTS / f"{stem}.md")
    print()
    print(table)
    drew = plot(out, RESULTS / f"{stem}.png")
    info = out["machine"]
    print(f"\n{info['cpuCount']} CPUs ({info['cpu']}), load average "
          f"{os.getloadavg()[0]:.1f} at the end; took {out['seconds']:.0f} s")
    print(f"wrote {RESULTS / (stem + '.json')}, {stem}.md"
          + (f" and {stem}.png" if drew
             else " (no plot: pip install -e '.[bench]' for matplotlib)"))
    return 0 if all(abs(v) <= 0.01 for v in recall_gaps(out).values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
