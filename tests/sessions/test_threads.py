"""The store called from many threads at once, as the gateway does through asyncio.to_thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sessions import SessionsConfig, SessionStore

from .conftest import read_lines


def test_concurrent_appends_keep_every_line(data_dir: Path) -> None:
    """Appends from eight threads to shared and separate sessions all land as whole, parseable
    lines, none lost, and each session's messageCount matches its file."""
    store = SessionStore(data_dir, SessionsConfig(fsync="batch"))
    shared = store.create("alice").session_key
    own = [store.create("alice").session_key for _ in range(4)]
    start = threading.Barrier(8)

    def work(worker: int) -> None:
        start.wait()
        for i in range(60):
            key = shared if i % 2 == 0 else own[worker % 4]
            store.append_message("alice", key, role="user", content=f"w{worker}-{i} " * 50)
            if i % 20 == 0:
                store.list("alice")
                store.history("alice", key, limit=5)
                store.flush()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(8)))

    shared_lines = read_lines(store.transcript_path("alice", shared))[1:]
    assert len(shared_lines) == 8 * 30
    assert {line["content"] for line in shared_lines} == {
        f"w{w}-{i} " * 50 for w in range(8) for i in range(0, 60, 2)
    }
    total = len(shared_lines)
    for key in own:
        lines = read_lines(store.transcript_path("alice", key))[1:]
        assert store.get("alice", key).message_count == len(lines) == 60
        total += len(lines)
    assert total == 8 * 60
    assert store.get("alice", shared).message_count == 240
    store.close()


def test_concurrent_creates_and_lists(make_store: Callable[..., SessionStore]) -> None:
    """Sessions created from many threads all get distinct keys and all appear in the list."""
    store = make_store()

    def make(_: int) -> str:
        key = store.create("alice").session_key
        store.list("alice", limit=10)
        return key

    with ThreadPoolExecutor(8) as pool:
        keys = list(pool.map(make, range(200)))
    assert len(set(keys)) == 200
    listed: list[str] = []
    cursor = None
    while True:
        page, cursor = store.list("alice", limit=200, before=cursor)
        listed += [s.session_key for s in page]
        if cursor is None:
            break
    assert sorted(listed) == sorted(keys)
    store.close()
