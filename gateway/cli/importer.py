"""``recalld import FILE``: bring an existing chat history into the configured store (JSONL
transcripts, or PostgreSQL under ``[storage] backend = "postgres"``), then index it.
``recalld import --from DIR`` moves a data dir's sessions instead (:mod:`.importer_move`).

Works on the data directory directly, like ``recalld memory`` (the sessions index and the
memory index are SQLite in WAL mode, so a running daemon and this command take turns).

* **Whole file checked first** (:mod:`gateway.importing`, which the daemon's
  ``sessions.import`` shares): a malformed file is refused with the line or conversation at
  fault, and nothing is written.
* **Idempotent**: each conversation's session key is derived from the user, the format and the
  conversation's id in the file, so a second import finds its transcript and adds nothing.
* **Resumable**: a transcript holding the first N messages of its conversation (an import cut
  short) gets the rest appended; every message is one whole-line write.
* **Per user**: ``--user`` names whose sessions they become (default ``default``).
* **Skips what the store refuses, and goes on**: a title, model or system prompt the store
  refuses (too long) is left out of its session, and so is a model the daemon does not offer
  (``llm.model`` and ``llm.models``, as ``sessions.create`` checks); a message whose line would pass
  ``sessions.max_line_bytes`` is written as a one-line placeholder saying so, so the transcript
  still holds one line per message and a resumed import lines up the same way. Each is reported.

Progress (messages written, then the index's own bar) goes to stderr; the summary to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gateway.cli.importer_move import MoveError, move_data_dir
from gateway.config import Config
from gateway.importing import (
    Conversation,
    Format,
    ImportFormatError,
    ImportReport,
    Progress,
    detect,
    parse,
    session_key_for,
    write_conversations,
)
from gateway.storage import StorageConfig, StorageUnavailable, open_session_store
from memory import MemoryIndexError
from sessions import SessionError, SessionsConfig, check_user

__all__ = ["ImportReport", "add_import_parser", "import_conversations", "session_key_for"]

DEFAULT_USER = "default"


def import_conversations(data_dir: Path, config: SessionsConfig, user: str, fmt: str,
                         conversations: Sequence[Conversation], progress: Progress | None = None,
                         *, storage: StorageConfig = StorageConfig(),  # noqa: B008 - frozen
                         models: tuple[str, ...] | None = None) -> ImportReport:
    """Write ``conversations`` as ``user``'s sessions in the store ``storage`` names (by
    default the transcripts under ``data_dir``); blocking. ``models``: the models a session may
    keep (LlmConfig.choices); None: any. The writing is
    :func:`gateway.importing.write_conversations`, as the daemon's ``sessions.import`` does it."""
    user = check_user(user)
    with open_session_store(storage, data_dir, config) as store:
        return write_conversations(store, user, fmt, conversations, progress, models=models)


def add_import_parser(sub: Any, command_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser(
        "import", help="import a chat history (ChatGPT export, recalld JSONL) into transcripts")
    command_flags(p)  # --config / --data-dir after the command too
    p.add_argument("file", type=Path, nargs="?",
                   help="conversations.json from a ChatGPT export, or recalld JSONL")
    p.add_argument("--from", dest="source", type=Path, metavar="DATA_DIR",
                   help="instead of FILE: move every session of this single-node data dir into the "
                        "configured store ([storage]), idempotently")
    p.add_argument("--user", default=DEFAULT_USER,
                   help=f"whose sessions they become (default {DEFAULT_USER})")
    p.add_argument("--format", choices=("auto", "chatgpt", "jsonl"), default="auto",
                   help="file format (default: detected from the first byte)")
    p.add_argument("--no-index", action="store_true",
                   help="only write transcripts; the daemon (or `recalld memory index`) "
                        "indexes them")
    p.set_defaults(run=_run)


class _Bar:
    """Messages written, as a bar on a terminal, a line per tenth otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.tenth = -1

    def __call__(self, conv_done: int, conv_total: int, msg_done: int, msg_total: int) -> None:
        share = msg_done / msg_total if msg_total else 1.0
        if self.tty:
            sys.stderr.write(f"\rimporting [{'#' * int(share * 30):<30}] conversations"
                             f" {conv_done}/{conv_total}  messages {msg_done}/{msg_total} ")
            sys.stderr.flush()
        elif int(share * 10) > self.tenth:
            self.tenth = int(share * 10)
            print(f"importing: conversations {conv_done}/{conv_total}, messages "
                  f"{msg_done}/{msg_total}", file=sys.stderr)

    def end(self) -> None:
        if self.tty:
            sys.stderr.write("\n")


def _run(config: Config, args: argparse.Namespace) -> int:
    from gateway.logs import configure_logging

    configure_logging("warning", config.log.format)
    if (args.file is None) == (args.source is None):
        print("recalld: import needs FILE or --from DATA_DIR (one of them)", file=sys.stderr)
        return 2
    if args.source is not None:
        return _move(config, args.source)
    try:
        data = args.file.read_bytes()
    except OSError as exc:
        print(f"recalld: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    try:
        fmt: Format = detect(data) if args.format == "auto" else args.format
        conversations = parse(data, fmt)
    except ImportFormatError as exc:
        print(f"recalld: {args.file}: {exc}; nothing was imported", file=sys.stderr)
        return 1
    try:
        check_user(args.user)
    except SessionError as exc:
        print(f"recalld: --user {args.user!r}: {exc}", file=sys.stderr)
        return 2
    bar = _Bar()
    try:
        report = import_conversations(config.data_dir, config.sessions, args.user, fmt,
                                      conversations, bar, storage=config.storage,
                                      models=config.llm.choices())
    except StorageUnavailable as exc:
        bar.end()
        print(f"recalld: {exc}", file=sys.stderr)
        return 2
    except SessionError as exc:
        bar.end()
        print(f"recalld: import stopped: {exc}; what was written stays, and the same command "
              "resumes", file=sys.stderr)
        return 1
    bar.end()
    for line in report.skipped:
        print(f"recalld: {line}", file=sys.stderr)
    rate = report.messages / report.seconds if report.seconds > 0 else 0.0
    print(f"imported {report.conversations} conversations as {fmt} for user {args.user}: "
          f"{report.created} new, {report.resumed} resumed, {report.unchanged} already complete, "
          f"{report.empty} empty; {report.messages} messages written in {report.seconds:.1f} s "
          f"({rate:,.0f}/s)"
          + (f"; {len(report.skipped)} things left out (above)" if report.skipped else ""))
    if args.no_index:
        return 0
    if config.storage.backend != "sqlite":
        print("not indexed here: the daemons' indexer reads new sessions from the database")
        return 0
    try:
        return asyncio.run(_index_with(config))
    except MemoryIndexError as exc:
        print(f"recalld: indexing failed: {exc}; the transcripts are written, "
              "`recalld memory index` finishes the index", file=sys.stderr)
        return 1


def _move(config: Config, source: Path) -> int:
    if config.storage.backend == "sqlite" and source.resolve() == config.data_dir.resolve():
        print("recalld: --from names the data dir this command writes to; set [storage] "
              "backend = \"postgres\" (RECALLD_STORAGE_BACKEND) to move it into PostgreSQL",
              file=sys.stderr)
        return 2
    if not (source / "sessions").is_dir():
        print(f"recalld: {source} holds no sessions/ directory: not a recalld data dir",
              file=sys.stderr)
        return 2
    try:
        report = move_data_dir(source, config.storage, config.data_dir, config.sessions)
    except StorageUnavailable as exc:
        print(f"recalld: {exc}", file=sys.stderr)
        return 2
    except (MoveError, SessionError) as exc:
        print(f"recalld: move stopped: {exc}; what was written stays, and the same command resumes",
              file=sys.stderr)
        return 1
    print(f"moved {report.sessions} sessions from {source} into {config.storage.backend}: "
          f"{report.created} new, {report.resumed} resumed, {report.unchanged} already complete, "
          f"{report.unreadable} unreadable; {report.messages} messages written in "
          f"{report.seconds:.1f} s")
    return 0


async def _index_with(config: Config) -> int:
    from gateway.app import close_memory, open_memory
    from gateway.cli.embedder import index_embedder
    from gateway.cli.memory import _Bar as SyncBar  # the same bar as `recalld memory index`
    from gateway.cli.memory import import_index_summary
    from gateway.cli.target import daemon_target

    service = await open_memory(config, watch=False, catch_up=False,
                                embedder=await index_embedder(config), decides_embedder=False)
    bar = SyncBar()
    try:
        started = time.perf_counter()
        report = await service.sync_now(progress=bar)
        summary = await import_index_summary(service, report, time.perf_counter() - started,
                                             daemon_target(config))
    finally:
        bar.end()
        await close_memory(service)
    print(summary)
    if report.error:
        print(f"warning: {report.error}", file=sys.stderr)
    return 0
