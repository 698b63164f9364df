"""``recalld memory status|index|search``: work on the index directly, without the daemon.

Safe while the daemon runs: the index is SQLite in WAL mode with a busy timeout, so this
process and the daemon take turns as writer, and readers never block. ``index`` shows a
progress bar on a terminal (a line per phase otherwise); interrupted with Ctrl+C it keeps
every file finished so far, and the next run resumes from there. With ``storage.backend =
"postgres"`` they work on the shared index in ``storage.dsn``: ``index`` runs one indexing
pass of this process beside the nodes' own (each session is claimed by one of them).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from typing import Any

import orjson

from gateway.cli.facts import add_facts_parser, run_facts
from gateway.config import Config
from gateway.storage import StorageUnavailable
from gateway.wire import search_wire
from memory import Memory, MemoryIndexError, SyncProgress

__all__ = ["add_memory_parser"]


def add_memory_parser(sub: Any, command_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    mem = sub.add_parser("memory", help="inspect, build or search the memory index directly")
    command_flags(mem)
    msub = mem.add_subparsers(dest="memory_command", required=True)
    status = msub.add_parser("status", help="index and embedder state")
    command_flags(status)
    status.add_argument("--json", action="store_true", help="print JSON")
    index = msub.add_parser("index", help="bring the index up to date (resumable)")
    command_flags(index)
    index.add_argument("--full", action="store_true", help="re-read every transcript from the start")
    search = msub.add_parser("search", help="search the index")
    command_flags(search)
    search.add_argument("query")
    search.add_argument("--k", type=int, default=None, help="results (default memory.default_k)")
    search.add_argument("--mode", choices=("hybrid", "keyword", "vector"), default="hybrid")
    search.add_argument("--user", default="default", help="whose memory (default: default)")
    search.add_argument("--json", action="store_true", help="print JSON")
    add_facts_parser(msub)
    mem.set_defaults(run=_run)


def _run(config: Config, args: argparse.Namespace) -> int:
    from gateway.logs import configure_logging

    # Warnings only: the output of these commands is the point, not the log.
    configure_logging("warning", config.log.format)
    handler: dict[str, Callable[[Memory, argparse.Namespace], Any]] = {
        "status": _status, "index": _index, "search": _search, "facts": run_facts,
    }
    try:
        return int(asyncio.run(_with_service(config, args, handler[args.memory_command])))
    except (MemoryIndexError, StorageUnavailable) as exc:
        print(f"recalld: {exc}", file=sys.stderr)
        return 1


async def _with_service(config: Config, args: argparse.Namespace,
                        fn: Callable[[Memory, argparse.Namespace], Any]) -> int:
    from gateway.app import close_memory, open_memory  # the daemon's wiring, loaded on use
    from gateway.cli.embedder import index_embedder

    # No watcher, and no catch-up sync: `index` runs the first sync itself, with progress.
    service = await open_memory(config, watch=False, catch_up=False, embedder=await index_embedder(config))
    try:
        return int(await fn(service, args))
    finally:
        await close_memory(service)


async def _status(service: Memory, args: argparse.Namespace) -> int:
    status = await service.status()
    if args.json:
        print(orjson.dumps(status, option=orjson.OPT_INDENT_2).decode())
        return 0
    for name, value in status_rows(status):
        print(f"{name:>15}  {value}")
    return 0


def status_rows(status: dict[str, Any]) -> list[tuple[str, object]]:
    """``memory status``'s human table: (label, value) rows from the service's ``status()``
    (PostgreSQL's has no file: its path row names the setting, its backend row pgvector)."""
    vb = status["vectorBackend"]
    vs = status["vectorSearch"]
    rows: list[tuple[str, object]] = [
        ("index", status.get("dbPath", "PostgreSQL (storage.dsn)")),
        ("files", status["files"]),
        ("chunks", f"{status['chunks']} ({status['embedded']} embedded, {status['pending']} pending)"),
        ("cache entries", status["cacheEntries"]),
        ("embedder", f"{status['provider']} {status['model'] or ''} — {status['embedderReason']}".strip()),
        ("vector backend", ("sqlite-vec loaded" if "dbPath" in status else vb["reason"]) if vb["available"]
         else f"UNAVAILABLE: {vb['reason']}"),
        ("vector search", "ready" if vs["ready"] else f"not ready: {vs['reason']}"),
        ("database size", f"{status['dbBytes']:,} bytes"),
    ]
    served, rebuild = vs.get("servedBy"), vs.get("rebuild")
    if rebuild:
        by = (f"; meanwhile {served['provider']} {served['model']} (the previous model) serves vector search"
              if served and not vs["ready"] else "")
        rows.append(("vector rebuild", f"{rebuild['embedded']:,} of {rebuild['total']:,} chunks embedded{by}"))
    if status.get("rebuiltFromTranscripts"):
        rows.append(("rebuilt", status["rebuiltFromTranscripts"]))
    return rows


class _Bar:
    """A one-line progress bar on a terminal; plain phase lines otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last_phase = ""

    def __call__(self, p: SyncProgress) -> None:
        if self.tty:
            done = p.files_done / p.files_total if p.files_total else 1.0
            bar = "#" * int(done * 30)
            sys.stderr.write(
                f"\r[{bar:<30}] files {p.files_done}/{p.files_total}  chunks {p.chunks_written}"
                f"  embedded {p.embedded}  pending {p.pending} "
            )
            sys.stderr.flush()
        elif p.phase != self.last_phase:
            print(f"{p.phase}: files {p.files_done}/{p.files_total}", file=sys.stderr)
        self.last_phase = p.phase

    def end(self) -> None:
        if self.tty:
            sys.stderr.write("\n")


async def _index(service: Memory, args: argparse.Namespace) -> int:
    bar = _Bar()
    try:
        report = await service.sync_now(progress=bar, full=args.full)
    finally:
        bar.end()
    print(
        f"indexed: {report.files_scanned} files scanned, {report.files_changed} changed, "
        f"{report.chunks_written} chunks written, {report.embedded} embedded "
        f"({report.cache_hits} from cache), {report.pending} pending, {report.duration_ms / 1000:.1f} s"
    )
    if report.error:
        print(f"warning: {report.error}", file=sys.stderr)
    return 0


async def _search(service: Memory, args: argparse.Namespace) -> int:
    response = await service.search(args.user, args.query, k=args.k, mode=args.mode)
    if args.json:
        print(orjson.dumps(search_wire(response), option=orjson.OPT_INDENT_2).decode())
        return 0
    if response.fallback_reason:
        print(f"(searched {response.mode}: {response.fallback_reason})", file=sys.stderr)
    if not response.results:
        print("no results")
    for i, hit in enumerate(response.results, 1):
        date = (hit.start_ts or "")[:16].replace("T", " ")
        text = " ".join(hit.content.split())
        print(f"{i}. [{date}] session {hit.session_key[:8]} lines {hit.line_start}-{hit.line_end} "
              f"score {hit.score:.4f}\n   {text[:300]}")
    return 0
