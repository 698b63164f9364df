"""The soak run (``make soak``, five minutes; ``--duration 30`` for a quick try).

A real ``recalld serve`` subprocess and the loopback fake model (``testkit.fake_openai``, also a
subprocess, serving chat and embeddings); 50 clients, each a user of its own (``[[auth.users]]``
in a config file written for the run, so the per-user ``[quotas]`` apply as they would to 50
people), create sessions and chat at a steady rate while memory searches, history reads and
health checks run. Every 10 s the daemon's RSS and open file descriptors are sampled. The
report: requests served, back-pressure (-32004 answers with ``retryAfterMs``: the daemon asking
a client to slow down, counted apart), errors (everything else; target 0), p50/p99 latency per
method (and chat.send → chat.final per run), RSS and descriptors at start and end, and the RSS
trend over the second half, of all resident memory and of its anonymous part (a leak shows
as a steady slope of the latter; file-backed pages such as memory.db's mapped reads grow with
the index). Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import secrets
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from gateway.client import Client
from tests.faults.helpers import FaultDaemon, free_port, open_fds, percentile, rss_anon_kib, rss_kib

TERMINAL = ("chat.final", "chat.error", "chat.aborted")
WORDS = ("harbor lantern quartz meadow cipher ember willow falcon prism tundra saffron glacier "
         "marble thunder violet compass nectar basalt orchid canyon").split()


class Stats:
    def __init__(self) -> None:
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: Counter[str] = Counter()
        self.backpressure: Counter[str] = Counter()
        self.served = 0

    async def call(self, c: Client, method: str, params: dict[str, Any] | None = None) -> Any:
        t0 = time.perf_counter()
        try:
            reply = await c.request(method, params)
        except Exception as exc:  # a dropped connection is an error too
            self.errors[f"{method}: {type(exc).__name__}"] += 1
            raise
        self.latency[method].append(time.perf_counter() - t0)
        if "error" in reply:
            error = reply["error"]
            if error["code"] == -32004:  # a quota or limit asking this client to slow down
                self.backpressure[f"{method}: {error['message'][:60]}"] += 1
            else:
                self.errors[f"{method}: {error['code']} {error['message'][:60]}"] += 1
            return None
        self.served += 1
        return reply["result"]


async def client_loop(n: int, url: str, token: str, stats: Stats, stop: asyncio.Event,
                      period_s: float) -> None:
    rng = random.Random(n)
    await asyncio.sleep(rng.uniform(0, period_s))  # spread the clients over the period
    async with Client.connect(url, token) as c:
        keys: list[str] = []
        cycle = 0
        while not stop.is_set():
            started = time.monotonic()
            if cycle % 10 == 0 or not keys:
                created = await stats.call(c, "sessions.create", {"title": f"soak {n}.{cycle}"})
                if created:
                    keys.append(created["sessionKey"])
            key = rng.choice(keys[-3:])
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(5, 40)))
            sent = await stats.call(c, "chat.send", {"sessionKey": key,
                                                     "message": f"client {n}: {text}"})
            if sent:
                t0 = time.perf_counter()
                try:
                    async with asyncio.timeout(60):
                        while True:
                            ev = await c.next_event(timeout=60)
                            if ev["method"] in TERMINAL and ev["params"]["runId"] == sent["runId"]:
                                break
                    stats.latency["run (send → final)"].append(time.perf_counter() - t0)
                    if ev["method"] != "chat.final":
                        stats.errors[f"run: {ev['method']}"] += 1
                except TimeoutError:
                    stats.errors["run: no terminal event in 60 s"] += 1
            await stats.call(c, "memory.search", {"query": " ".join(rng.sample(WORDS, 3))})
            await stats.call(c, "sessions.history", {"sessionKey": key, "limit": 20})
            if cycle % 5 == 0:
                await stats.call(c, "sessions.list", {"limit": 20})
                await stats.call(c, "gateway.health")
            cycle += 1
            await asyncio.sleep(max(0.0, period_s - (time.monotonic() - started)))


def trend_kib_per_min(samples: list[tuple[float, int]]) -> float:
    """Least-squares slope of RSS over the second half of the run, in KiB per minute."""
    half = samples[len(samples) // 2:]
    if len(half) < 2:
        return 0.0
    mx = sum(t for t, _ in half) / len(half)
    my = sum(r for _, r in half) / len(half)
    var = sum((t - mx) ** 2 for t, _ in half)
    return 0.0 if var == 0 else sum((t - mx) * (r - my) for t, r in half) / var * 60


async def soak(duration: float, clients: int, period_s: float, sample_s: float) -> int:
    port = free_port()
    base = f"http://127.0.0.1:{port}/v1"
    env = {"RECALLD_LLM_BASE_URL": base, "RECALLD_LLM_API_KEY": "sk-soak",
           "RECALLD_LLM_MODEL": "fake-model",
           "RECALLD_MEMORY_EMBEDDER": "openai", "RECALLD_MEMORY_EMBEDDINGS_MODEL": "fake-embed",
           "RECALLD_MEMORY_DEBOUNCE_MS": "500", "RECALLD_SERVER_MAX_CONNECTIONS": "1024"}
    # One exit stack so that neither child outlives the soak, however it ends (the daemon
    # failing to start, an exception, Ctrl+C); unwound daemon first, then the data, then the model.
    async with contextlib.AsyncExitStack() as cleanup:
        model = subprocess.Popen([sys.executable, "-m", "testkit.fake_openai", "--port", str(port),
                                  "--delta-delay", "0.005"], stdout=subprocess.PIPE,
                                 stdin=subprocess.DEVNULL, text=True)
        cleanup.callback(model.wait, timeout=10)
        cleanup.callback(model.terminate)
        assert model.stdout is not None
        model.stdout.readline()  # "fake OpenAI listening on …"
        tmp = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="recalld-soak-"))
        # A user per client: quotas count per user, as they would for that many people.
        tokens = [secrets.token_urlsafe(32) for _ in range(clients)]
        config = Path(tmp) / "config.toml"
        config.write_text("[auth]\nusers = [\n" + "".join(
            f'  {{name = "soak{n}", token = "{t}"}},\n' for n, t in enumerate(tokens)) + "]\n")
        daemon = await FaultDaemon.start(Path(tmp) / "data", "--config", str(config),
                                         env={**env, "RECALLD_TOKEN": ""})
        cleanup.push_async_callback(daemon.akill)  # a no-op after the clean astop() below
        pid = daemon.proc.pid
        stats = Stats()
        stop = asyncio.Event()
        t_start = time.monotonic()
        rss: list[tuple[float, int]] = [(0.0, rss_kib(pid))]
        anon: list[tuple[float, int]] = [(0.0, rss_anon_kib(pid))]
        fds_start = open_fds(pid)
        print(f"soak: {clients} clients for {duration:.0f} s against {daemon.url} (pid {pid}); "
              f"RSS {rss[0][1] / 1024:.1f} MiB, {fds_start} fds at start", flush=True)
        tasks = [asyncio.create_task(client_loop(n, daemon.url, tokens[n], stats, stop, period_s))
                 for n in range(clients)]
        try:
            while (elapsed := time.monotonic() - t_start) < duration:
                await asyncio.sleep(min(sample_s, duration - elapsed))
                rss.append((time.monotonic() - t_start, rss_kib(pid)))
                anon.append((rss[-1][0], rss_anon_kib(pid)))
                print(f"  t={rss[-1][0]:5.0f}s RSS {rss[-1][1] / 1024:7.1f} MiB "
                      f"(anonymous {anon[-1][1] / 1024:6.1f})  "
                      f"fds {open_fds(pid):4d}  served {stats.served:7d}  "
                      f"back-pressure {sum(stats.backpressure.values())}  "
                      f"errors {sum(stats.errors.values())}", flush=True)
                if daemon.proc.poll() is not None:
                    stats.errors["daemon exited"] += 1
                    break
        finally:
            stop.set()
            results = await asyncio.gather(*tasks, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                stats.errors[f"client: {type(r).__name__}: {str(r)[:60]}"] += 1
        await asyncio.sleep(1.0)  # let the daemon settle connections before the last sample
        fds_end, rss_end = open_fds(pid), rss_kib(pid)
        code = await daemon.astop()
    wall = time.monotonic() - t_start
    print(f"\nrecalld soak report ({wall:.0f} s, {clients} clients)")
    print(f"requests served: {stats.served}  ({stats.served / wall:.1f}/s)   "
          f"back-pressure: {sum(stats.backpressure.values())}   "
          f"errors: {sum(stats.errors.values())}")
    for what, n in stats.backpressure.most_common():
        print(f"  back-pressure x{n}: {what}")
    for what, n in stats.errors.most_common():
        print(f"  error x{n}: {what}")
    print(f"{'method':<22}{'count':>8}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}")
    for method in sorted(stats.latency):
        values = stats.latency[method]
        print(f"{method:<22}{len(values):>8}{percentile(values, 50) * 1000:>10.1f}"
              f"{percentile(values, 99) * 1000:>10.1f}{max(values) * 1000:>10.1f}")
    slope = trend_kib_per_min(rss)
    print(f"RSS: start {rss[0][1] / 1024:.1f} MiB, end {rss_end / 1024:.1f} MiB; samples (MiB): "
          + " ".join(f"{r / 1024:.0f}" for _, r in rss))
    print(f"RSS trend over the second half: {slope / 1024:+.2f} MiB/min; of it anonymous "
          f"memory (what a leak grows; the rest is file-backed, memory.db's mapped pages among "
          f"them): {trend_kib_per_min(anon) / 1024:+.2f} MiB/min, "
          f"{anon[0][1] / 1024:.1f} → {anon[-1][1] / 1024:.1f} MiB")
    print(f"open fds: start {fds_start}, end {fds_end}")
    print(f"daemon exit code on SIGTERM: {code}")
    return 0 if not stats.errors and code == 0 else 1


def main() -> None:
    parser = argparse.ArgumentParser(description="Soak recalld with many chatting clients "
                                                 "(loopback only).")
    parser.add_argument("--duration", type=float, default=300.0, help="seconds (default 300)")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--period", type=float, default=2.0,
                        help="seconds per client cycle: one chat, one search, one history read "
                             "(default 2)")
    parser.add_argument("--sample", type=float, default=10.0, help="seconds between RSS/fd samples")
    args = parser.parse_args()
    sys.exit(asyncio.run(soak(args.duration, args.clients, args.period, args.sample)))


if __name__ == "__main__":
    main()
