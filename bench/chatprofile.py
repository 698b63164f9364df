"""``python -m bench.chatprofile [--rounds N] [-- WRAPPER…]``: the CPU a ``recalld serve``
process spends per 500-delta chat run, the figure behind ``bench --only chat``'s ratio.

The chat section's wall-clock ratio moves by ±0.2 on a shared 2-core machine (the gateway,
the client and the loopback model server compete for two cores with whatever else runs);
the gateway process's own CPU time per run (``/proc/PID/stat`` user + system) moves far less,
so changes to the per-delta path are compared with it. Also printed: wall time, time to the
first ``chat.delta`` and how many ``chat.delta`` frames the client received (deltas that wait
in a connection's outbox leave merged, docs/protocol.md).

Everything after ``--`` wraps the gateway command, e.g. a sampling profiler::

    .venv/bin/python -m bench.chatprofile --rounds 60 -- \\
        .venv/bin/py-spy record -r 500 -f raw -o /tmp/chat.txt --

(py-spy is not a dependency: ``pip install py-spy`` into the venv to use it). Linux only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.fake_openai import FakeOpenAI
from bench.gw import TOKEN, gateway_child
from gateway.client import Client


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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    wrapper: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, wrapper = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(prog="python -m bench.chatprofile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args(argv)
    asyncio.run(_run(args.rounds, wrapper))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
