"""``recalld memory facts [list|add|update|delete|history]``: the remembered facts, on the
index directly.

Like the other ``recalld memory`` commands it opens the index itself (safe beside a running
daemon: SQLite WAL with a busy timeout), so a user can see and remove what the assistant
remembers without a client. ``--user`` picks whose facts (default: default).
"""

from __future__ import annotations

import argparse
from typing import Any

import orjson

from gateway.wire import fact_change_wire, fact_wire
from memory import Fact, Memory

__all__ = ["add_facts_parser", "run_facts"]


def add_facts_parser(msub: Any) -> None:
    facts = msub.add_parser("facts", help="list, add, correct or delete remembered facts")
    facts.add_argument("--user", default="default", help="whose facts (default: default)")
    facts.add_argument("--json", action="store_true", help="print JSON")
    fsub = facts.add_subparsers(dest="facts_command")
    listing = fsub.add_parser("list", help="active facts, newest first (the default)")
    listing.add_argument("--all", action="store_true", help="include replaced versions")
    listing.add_argument("--limit", type=int, default=100)
    add = fsub.add_parser("add", help="remember a fact")
    add.add_argument("text")
    update = fsub.add_parser("update", help="correct a fact (the old version is kept inactive)")
    update.add_argument("id", type=int)
    update.add_argument("text")
    delete = fsub.add_parser("delete", help="forget a fact and its earlier versions")
    delete.add_argument("id", type=int)
    history = fsub.add_parser("history", help="every version of a fact")
    history.add_argument("id", type=int)


async def run_facts(service: Memory, args: argparse.Namespace) -> int:
    facts = service.facts
    command = args.facts_command or "list"
    out: Any
    if command == "list":
        page = await facts.page(args.user, limit=max(1, getattr(args, "limit", 100)),
                                include_inactive=getattr(args, "all", False))
        shown = page.facts
        out = {"facts": [fact_wire(f) for f in shown]}
    elif command == "history":
        shown = await facts.history(args.user, args.id)
        out = {"facts": [fact_wire(f) for f in shown]}
    else:
        if command == "add":
            change = await facts.add(args.user, args.text, source="user")
        elif command == "update":
            change = await facts.update(args.user, args.id, args.text)
        else:
            change = await facts.delete(args.user, args.id)
        out = fact_change_wire(change)
        shown = [change.fact]
        if not args.json:
            print(f"{change.action}: #{change.fact.id} {change.fact.text}")
            return 0
    if args.json:
        print(orjson.dumps(out, option=orjson.OPT_INDENT_2).decode())
        return 0
    if not shown:
        print("no facts remembered")
    for fact in shown:
        print(_line(fact))
    return 0


def _line(fact: Fact) -> str:
    mark = "" if fact.active else " (replaced)"
    return f"#{fact.id:<5} {fact.updated_at[:10]}  {fact.text}{mark}"
