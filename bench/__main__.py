"""``python -m bench [--quick] [--only NAME…]``: run the speed benchmarks, print one table,
write ``bench/results/latest.json`` (figures + machine info). See bench/README.md."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import structlog

from bench import indexing, rpc, search
from bench.stats import Figure, machine_info, print_table

RESULTS = Path(__file__).resolve().parent / "results"

SECTIONS: dict[str, Callable[[bool], Awaitable[list[Figure]]]] = {
    "rpc": rpc.run_rpc,
    "chat": rpc.run_chat,
    "search": search.run,
    "query-embedding": indexing.run_query_embedding,
    "appends": indexing.run_appends,
    "backfill": indexing.run_backfill_and_loop,
    "sessions": indexing.run_sessions_list,
}


def _quiet_logs() -> None:
    # The daemon logs every connection and sync; the table is the output here.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    logging.getLogger().setLevel(logging.ERROR)


async def _main(args: argparse.Namespace) -> int:
    figures: list[Figure] = []
    timings: dict[str, float] = {}
    for name in args.only or SECTIONS:
        print(f"· {name} …", flush=True)
        t = time.perf_counter()
        figures.extend(await SECTIONS[name](args.quick))
        timings[name] = round(time.perf_counter() - t, 1)
    print()
    print_table(figures)
    info = machine_info()
    print(f"\n{info['cpuCount']} CPUs ({info['cpu']}), Python {info['python']}, "
          f"SQLite {info['sqlite']}; sections took {timings} s")
    RESULTS.mkdir(exist_ok=True)
    out = {"quick": args.quick, "at": datetime.now(UTC).isoformat(), "machine": info,
           "sectionSeconds": timings, "figures": [f.to_json() for f in figures]}
    path = RESULTS / ("latest.json" if not args.only else "latest-partial.json")
    path.write_text(json.dumps(out, indent=2, default=str))
    print(f"wrote {path}")
    return 0 if all(f.ok is not False for f in figures) else 1


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    parser.add_argument("--only", nargs="+", choices=list(SECTIONS), help="run only these sections")
    args = parser.parse_args()
    _quiet_logs()
    return asyncio.run(_main(args))


if __name__ == "__main__":
    raise SystemExit(main())
