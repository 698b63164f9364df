"""``recalld memory status|index|search``: the memory index, from a shell.

Beside a running daemon (its ``daemon.json`` in the data dir), ``status`` and ``search`` ask it
over the gateway (``memory.status``, ``memory.search``, as the token's user): the answer is the
daemon's own, and this process imports neither the chat stack nor an embedder, so it prints in
about the time ``recalld call`` takes. Otherwise (or ``search --user NAME``, or when the daemon
does not answer) they open the index directly.

Working on the index directly is safe while the daemon runs: the index is SQLite in WAL mode
with a busy timeout, so this process and the daemon take turns as writer, and readers never
block. ``index`` shows a progress bar on a terminal (a line per phase otherwise); interrupted
with Ctrl+C it keeps every file finished so far, and the next run resumes from there. Chunks it
leaves pending (the daemon embeds with another model: gateway.cli.embedder) are handed to the
daemon with a ``memory.reindex``, which embeds them at once. With ``storage.backend =
"postgres"`` they work on the shared index in ``storage.dsn``: ``index`` runs one indexing pass
of this process beside the nodes' own (each session is claimed by one of them).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from gateway.cli.facts import add_facts_parser
from gateway.cli.target import Target, daemon_target
from gateway.config import Config

if TYPE_CHECKING:
    from memory import Memory, SyncProgress, SyncReport

__all__ = ["add_memory_parser", "import_index_summary", "status_rows"]

def add_memory_parser(sub: Any, command_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    mem = sub.add_parser("memory", help="inspect, build or search the memory index")
    command_flags(mem)
    msub = mem.add_subparsers(dest="memory_command", required=True)
    status = msub.add_parser("status", help="index and embedder state")
    command_flags(status)
    status.add_argument("--json", action="store_true", help="print JSON")
    index = msub.add_parser("index", help="bring the index up to date (resumable)")
    command_flags(index)
    index.add_argument("--full", action="store_true",
                       help="re-read every transcript from the start")
    search = msub.add_parser("search", help="search the index")
    command_flags(search)
    search.add_argument("query")
    search.add_argument("--k", type=int, default=None, help="results (default memory.default_k)")
    search.add_argument("--mode", choices=("hybrid", "keyword", "vector"), default="hybrid")
    search.add_argument("--user", default=None,
                        help="whose memory (default: the running daemon's token user, else "
                             "default); naming one reads the index directly")
    search.add_argument("--json", action="store_true", help="print JSON")
    add_facts_parser(msub)
    mem.set_defaults(run=_run)


def _run(config: Config, args: argparse.Namespace) -> int:
    if args.memory_command == "status" or (args.memory_command == "search" and args.user is None):
        daemon = daemon_target(config)
        if daemon is not None:
            answered = _ask_daemon(daemon, args)
            if answered is not None:
                return answered
    return _run_here(config, args)


# -- asking the running daemon -------------------------------------------------------------------

def _ask_daemon(target: Target, args: argparse.Namespace) -> int | None:
    """Answer ``status`` or ``search`` from the daemon; None when it cannot be reached (the
    caller then opens the index itself)."""
    from gateway.client import Client, RpcError
    from gateway.errors import Unauthorized

    async def ask() -> Any:
        async with Client.connect(target.url, target.token, ssl_context=target.ssl) as client:
            if args.memory_command == "status":
                return await client.call("memory.status")
            params: dict[str, Any] = {"query": args.query, "mode": args.mode}
            if args.k is not None:
                params["k"] = args.k
            return await client.call("memory.search", params)

    try:
        answer = asyncio.run(ask())
    except RpcError as exc:
        if exc.code == Unauthorized.code:  # no token for it here (it may take its own from the
            # environment): the index is this data dir's all the same
            print(f"recalld: the daemon at {target.url} refused this shell's token "
                  f"({exc.message}); reading the index directly", file=sys.stderr)
            return None
        print(f"recalld: the daemon at {target.url} answered: {exc.message}", file=sys.stderr)
        return 1
    except Exception as exc:  # OSError, a refused token (websockets' InvalidStatus), a timeout
        print(f"recalld: the daemon at {target.url} did not answer ({exc or type(exc).__name__}); "
              "reading the index directly", file=sys.stderr)
        return None
    if args.memory_command == "status":
        return _print_status(answer, args, daemon_url=target.url)
    return _print_search(answer, args)


async def nudge_daemon(target: Target) -> bool:
    """Ask the daemon for a sync now (``memory.reindex``), which embeds every pending chunk with
    its own embedder; False when it cannot be reached."""
    from gateway.client import Client

    try:
        async with Client.connect(target.url, target.token, ssl_context=target.ssl) as client:
            await client.call("memory.reindex")
    except Exception:  # unreachable or refused: its next sync embeds them all the same
        return False
    return True


# -- working on the index here -------------------------------------------------------------------

def _run_here(config: Config, args: argparse.Namespace) -> int:
    from gateway.cli.facts import run_facts
    from gateway.logs import configure_logging
    from gateway.storage import StorageUnavailable
    from memory import MemoryIndexError

    # Warnings only: the output of these commands is the point, not the log.
    configure_logging("warning", config.log.format)
    handler: dict[str, Callable[[Memory, argparse.Namespace], Any]] = {
        "status": _status, "search": _search, "facts": run_facts,
        # `index` hands what it leaves pending to the daemon serving this data dir, if one does.
        "index": lambda service, a: _index(service, a, daemon_target(config)),
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
    service = await open_memory(config, watch=False, catch_up=False,
                                embedder=await index_embedder(config), decides_embedder=False)
    try:
        return int(await fn(service, args))
    finally:
        await close_memory(service)


async def _status(service: Memory, args: argparse.Namespace) -> int:
    return _print_status(await service.status(), args)


def _print_status(status: dict[str, Any], args: argparse.Namespace, *,
                  daemon_url: str | None = None) -> int:
    if args.json:
        print(orjson.dumps(status, option=orjson.OPT_INDENT_2).decode())
        return 0
    for name, value in status_rows(status, daemon_url=daemon_url):
        print(f"{name:>15}  {value}")
    return 0


def status_rows(status: Mapping[str, Any], *,
                daemon_url: str | None = None) -> list[tuple[str, object]]:
    """``memory status``'s human table: (label, value) rows from the service's ``status()`` or
    the daemon's ``memory.status`` (PostgreSQL's has no file: its path row names the setting,
    its backend row pgvector; a user's own scope has no file or cache rows)."""
    vb = status["vectorBackend"]
    vs = status["vectorSearch"]
    whole = status.get("scope", "all") == "all"
    rows: list[tuple[str, object]] = []
    if daemon_url is not None:
        rows.append(("answered by", f"the daemon at {daemon_url}"))
    if whole:
        rows.append(("index", status.get("dbPath", "PostgreSQL (storage.dsn)")))
    else:
        rows.append(("scope", "your own rows (the whole index is shown to auth.admin)"))
    rows += [
        ("files", status["files"]),
        ("chunks",
         f"{status['chunks']} ({status['embedded']} embedded, {status['pending']} pending)"),
    ]
    if "cacheEntries" in status:
        rows.append(("cache entries", status["cacheEntries"]))
    rows += [
        ("embedder",
         f"{status['provider']} {status['model'] or ''} — {status['embedderReason']}".strip()),
        ("vector backend",
         ("sqlite-vec loaded" if "dbPath" in status else vb["reason"]) if vb["available"]
         else f"UNAVAILABLE: {vb['reason']}"),
        ("vector search", "ready" if vs["ready"] else f"not ready: {vs['reason']}"),
    ]
    if "dbBytes" in status:
        rows.append(("database size", f"{status['dbBytes']:,} bytes"))
    if daemon_url is not None and status.get("syncing"):
        rows.append(("sync", "running now"))
    served, rebuild = vs.get("servedBy"), vs.get("rebuild")
    if rebuild:
        by = (f"; meanwhile {served['provider']} {served['model']} (the previous model) serves "
              "vector search"
              if served and not vs["ready"] else "")
        rows.append(("vector rebuild",
                     f"{rebuild['embedded']:,} of {rebuild['total']:,} chunks embedded{by}"))
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


async def _index(service: Memory, args: argparse.Namespace, daemon: Target | None) -> int:
    bar = _Bar()
    try:
        report = await service.sync_now(progress=bar, full=args.full)
    finally:
        bar.end()
    print(
        f"indexed: {report.files_scanned} files scanned, {report.files_changed} changed, "
        f"{report.chunks_written} chunks written, {report.embedded} embedded "
        f"({report.cache_hits} from cache), {report.pending} pending, "
        f"{report.duration_ms / 1000:.1f} s"
    )
    if report.pending and daemon is not None:
        # This process did not embed them (the daemon embeds with another model, or the
        # embedder failed); the daemon would otherwise wait for the next transcript change.
        if await nudge_daemon(daemon):
            print(f"the daemon at {daemon.url} embeds the {report.pending} pending chunks now "
                  "(`recalld memory status` shows its progress)")
        else:
            print(f"recalld: the daemon at {daemon.url} did not answer: its next sync embeds the "
                  f"{report.pending} pending chunks", file=sys.stderr)
    if report.error:
        print(f"warning: {report.error}", file=sys.stderr)
    return 0


async def import_index_summary(service: Memory, report: SyncReport, took_s: float,
                               daemon: Target | None) -> str:
    """``recalld import``'s index line. When this process wrote no chunk and a daemon serves the
    data dir, the daemon's watcher had most likely indexed the new transcripts already: say that
    it keeps the index and what the index holds, rather than a "0 chunks written" that reads like
    a failure."""
    if report.chunks_written == 0 and daemon is not None:
        status = await service.status()
        return (f"indexed: nothing left to do here; the daemon at {daemon.url} keeps this index, "
                f"which holds {status['chunks']} chunks ({status['embedded']} embedded, "
                f"{status['pending']} pending)")
    return (f"indexed: {report.chunks_written} chunks written, {report.embedded} embedded "
            f"({report.cache_hits} from cache), {report.pending} pending, {took_s:.1f} s")


async def _search(service: Memory, args: argparse.Namespace) -> int:
    from gateway.wire import search_wire

    user = args.user or "default"
    response = await service.search(user, args.query, k=args.k, mode=args.mode)
    return _print_search(dict(search_wire(response)), args)


def _print_search(answer: Mapping[str, Any], args: argparse.Namespace) -> int:
    if args.json:
        print(orjson.dumps(answer, option=orjson.OPT_INDENT_2).decode())
        return 0
    if answer.get("fallbackReason"):
        print(f"(searched {answer['mode']}: {answer['fallbackReason']})", file=sys.stderr)
    results = answer["results"]
    if not results:
        print("no results")
    for i, hit in enumerate(results, 1):
        date = (hit.get("startTs") or "")[:16].replace("T", " ")
        text = " ".join(hit["content"].split())
        print(f"{i}. [{date}] session {hit['sessionKey'][:8]} lines "
              f"{hit['lineStart']}-{hit['lineEnd']} score {hit['score']:.4f}\n   {text[:300]}")
    return 0
