"""``python -m research.rpcprofile [--per-conn N] [--mode pipelined|ping-pong] [-- WRAPPER…]``:
the CPU a ``recalld serve`` process spends per ``gateway.health`` request, the figure behind
``bench --only rpc``'s ratios.

``bench --only rpc`` runs the gateway, the echo and the client in one process on a shared
2-core machine, and its ratio moves by ±0.1 from run to run; the gateway process's own CPU time
per request (``/proc/PID/stat`` user + system), under the same client as the RPC section (16
connections, a window of 32 requests in flight or 1), moves far less, so changes to the
per-frame path are compared with it. Everything after ``--`` wraps the gateway command, e.g.
``.venv/bin/py-spy record -r 1000 -f raw -o /tmp/rpc.txt --`` (py-spy is not a dependency).
Linux only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.rpc import CONNECTIONS, drive
from testkit.gateway import TOKEN, gateway_child

MODES = {"pipelined": 32, "ping-pong": 1}


def _cpu_s(pid: int) -> tuple[float, float]:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


async def _run(per_conn: int, modes: Sequence[str], wrapper: Sequence[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with gateway_child(Path(tmp), {}, wrapper) as (url, proc):
            pid = proc.pid
            if wrapper:  # the gateway is the wrapper's child
                children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                          text=True, check=False).stdout.split()
                pid = int(children[0]) if children else proc.pid
            auth = {"Authorization": f"Bearer {TOKEN}"}
            await drive([url], "gateway.health", None, headers=auth, per_conn=50,
                        window=32)  # warm-up
            for mode in modes:
                (u0, s0), t0 = _cpu_s(pid), time.perf_counter()
                rate, _ = await drive([url], "gateway.health", None, headers=auth,
                                      per_conn=per_conn, window=MODES[mode])
                (u1, s1), wall = _cpu_s(pid), time.perf_counter() - t0
                n = CONNECTIONS * per_conn
                print(f"{mode}: {rate:,.0f} req/s over {wall:.1f} s; gateway CPU per request "
                      f"{1e6 * (u1 - u0) / n:.1f} µs user + {1e6 * (s1 - s0) / n:.1f} µs system")


def main(argv: Sequence[str] | None = None) -> None:
    args = list(argv if argv is not None else sys.argv[1:])
    wrapper: list[str] = []
    if "--" in args:
        wrapper, args = args[args.index("--") + 1:], args[: args.index("--")]
    p = argparse.ArgumentParser(prog="python -m research.rpcprofile")
    p.add_argument("--per-conn", type=int, default=2000, help="requests per connection and mode")
    p.add_argument("--mode", choices=sorted(MODES), action="append", help="default: both")
    ns = p.parse_args(args)
    asyncio.run(_run(ns.per_conn, ns.mode or list(MODES), wrapper))


if __name__ == "__main__":
    main()
