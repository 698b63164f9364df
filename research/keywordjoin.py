"""The keyword leg's two statements on a one-owner scale corpus: joined to ``chunks`` (every
match's row read to check its owner) against the FTS ranking alone (what a one-owner database
now runs, memory/sqlite/search.py), and the file pages each touches.

    python -m research.keywordjoin [--size 1000000] [--queries 100]

Each statement runs in its own child process over the cached corpus (``bench.scalecorpus``;
built on first use), through a read connection that maps the file, so the pages a statement
reads show as its process's file-backed RSS. Two rounds of every query; the second round's
p50/p99 are printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import apsw

from bench.corpus import USER, queries
from memory.config import MemoryConfig
from memory.retrieval.request import SearchRequest
from memory.sqlite.search import _KEYWORD_RANKED_SQL, build_sql, keyword_match

# The search's own statements: the joined one as a search without filters builds it, and the
# one-owner ranking (both bind :fts_query; the first :user and :candidates, the second :ranked).
STATEMENTS = {
    "joined": build_sql(SearchRequest.build(MemoryConfig(), USER, "x", mode="keyword"),
                        leg="keyword")[0],
    "ranked": _KEYWORD_RANKED_SQL,
}


def _rss_file_kib() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("RssFile"))


def measure(size: int, n_queries: int, statement: str) -> dict[str, float]:
    from bench.scalecorpus import corpus_dir

    db = apsw.Connection(str(corpus_dir(size) / "memory.db"), flags=apsw.SQLITE_OPEN_READONLY)
    db.execute("PRAGMA mmap_size=1099511627776")
    config = MemoryConfig()
    # as the search builds them
    matches = [keyword_match(db, q, config) for q in queries(n_queries)]
    before = _rss_file_kib()
    for _ in range(2):
        ms = []
        for match in matches:
            t = time.perf_counter()
            db.execute(STATEMENTS[statement], {"fts_query": match, "user": USER,
                                               "candidates": config.candidates,
                                               "ranked": config.candidates}).fetchall()
            ms.append((time.perf_counter() - t) * 1000)
    touched = (_rss_file_kib() - before) / 1024  # before close(), which unmaps the file
    db.close()
    return {"p50": statistics.median(ms), "p99": sorted(ms)[int(0.99 * (len(ms) - 1))],
            "touchedMiB": touched}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m research.keywordjoin",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--statement", choices=sorted(STATEMENTS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.statement:
        print(json.dumps(measure(args.size, args.queries, args.statement)))
        return 0
    from bench.scalecorpus import build

    build(args.size, log=lambda line: print(line, flush=True))
    for name in STATEMENTS:
        out = subprocess.run([sys.executable, "-m", "research.keywordjoin", "--size",
                              str(args.size), "--queries", str(args.queries),
                              "--statement", name], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{name:7} p50 {r['p50']:6.1f} ms  p99 {r['p99']:6.1f} ms  file pages touched "
              f"{r['touchedMiB']:,.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
