"""Which of the tests under a folder run on PostgreSQL, and which open any storage at all.

Issue 30 asks that at least 40% of the tests under ``tests/memory`` run on PostgreSQL. This
counts, from pytest's own collection (nothing is run): every collected test; those that run on
PostgreSQL (parametrised ``postgres`` by ``memory_backend``, or under a ``pg/`` folder); and those
that open a storage at all (they ask for a fixture that makes one: ``memory_backend``, ``service``,
``tmp_path``, the PostgreSQL fixtures); and the first count again per test function (the rows of
a parametrised table counted once). A test that opens none checks a rule on values (time
phrases, the facts block, chunking) and runs on no backend.

    .venv/bin/python -m research.backend_census [tests/memory]
"""

from __future__ import annotations

import argparse
import collections
from typing import Any

import pytest

# Fixtures that make a storage for the test (an index, a database, a data directory).
STORAGE = frozenset({"memory_backend", "memory_service", "service", "tmp_path", "tmp_path_factory",
                     "pg_index", "pool", "postgres_server", "pg_dsn"})


class _Census:
    def __init__(self) -> None:
        self.rows: list[tuple[str, bool, bool]] = []

    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        for item in items:
            pg = "postgres" in item.nodeid or "/pg/" in item.nodeid
            opens = pg or bool(set(getattr(item, "fixturenames", ())) & STORAGE)
            self.rows.append((item.nodeid, pg, opens))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default="tests/memory")
    args = parser.parse_args(argv)
    census = _Census()
    code = pytest.main(["-q", "--collect-only", "-p", "no:randomly", args.folder],
                       plugins=[census])
    if code not in (0, 5):
        return int(code)
    rows = census.rows
    pg = sum(1 for _, on_pg, _ in rows if on_pg)
    opening = [r for r in rows if r[2]]
    pg_opening = sum(1 for _, on_pg, _ in opening if on_pg)
    print(f"\n{args.folder}: {len(rows)} tests, {pg} on PostgreSQL ({pg / len(rows):.1%})")
    # The same count per test function: a parametrised table (131 time phrases) is one.
    functions: dict[str, bool] = {}
    for nodeid, on_pg, _ in rows:
        name = nodeid.split("[", 1)[0]
        functions[name] = functions.get(name, False) or on_pg
    on_pg_functions = sum(functions.values())
    print(f"  by test function: {len(functions)}, {on_pg_functions} on PostgreSQL "
          f"({on_pg_functions / len(functions):.1%})")
    print(f"  that open a storage: {len(opening)}, {pg_opening} on PostgreSQL "
          f"({pg_opening / max(1, len(opening)):.1%})")
    sqlite_only = collections.Counter(
        nodeid.split("::")[0] for nodeid, on_pg, opens in opening
        if not on_pg and "[sqlite" not in nodeid and "-sqlite" not in nodeid)
    print(f"  that open a storage and run on SQLite alone: {sum(sqlite_only.values())}",
          dict(sqlite_only.most_common()))
    none = collections.Counter(nodeid.split("::")[0] for nodeid, _, opens in rows if not opens)
    print(f"  that open none: {sum(none.values())}", dict(none.most_common()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
