"""The forward reader, the path layout and the key factory: what readers outside the store use."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from sessions import (
    ForwardReader,
    Message,
    SessionsConfig,
    SessionStore,
    parse_transcript_relpath,
    scan_transcripts,
    sessions_root,
    transcript_file,
    transcript_relpath,
)

KEY = "0123456789abcdef0123456789abcdef"

# Transcript files, their recovery and the index cache: the file store alone.
pytestmark = pytest.mark.jsonl_only


def test_forward_reader_returns_the_stores_messages_with_lines_and_offsets(
    store: SessionStore
) -> None:
    """Read from the start, the reader yields exactly what history() returns, each with its
    1-based line number and the byte offset of its line."""
    s = store.create("alice", title="t")
    for i in range(5):
        store.append_message("alice", s.session_key, role=("user", "assistant")[i % 2],
                             content=f"m{i}", name="Ada" if i == 3 else None,
                             extra={"usage": {"n": i}} if i == 4 else None)
    path = store.transcript_path("alice", s.session_key)
    reader = ForwardReader(path)
    entries = list(reader)
    messages, _ = store.history("alice", s.session_key)
    assert [e.message for e in entries] == messages
    assert [e.line for e in entries] == [2, 3, 4, 5, 6]
    raw = path.read_bytes()
    assert [e.offset for e in entries] == [i + 1 for i, b in enumerate(raw) if b == ord("\n")][:-1]
    assert (reader.end_offset, reader.end_line, reader.skipped) == (len(raw), 6, 0)


def test_forward_reader_resumes_from_an_offset(store: SessionStore) -> None:
    """Started at a line's offset and number, the reader returns only the lines from there on."""
    s = store.create("alice")
    for i in range(4):
        store.append_message("alice", s.session_key, role="user", content=f"m{i}")
    path = store.transcript_path("alice", s.session_key)
    third = list(ForwardReader(path))[2]
    rest = list(ForwardReader(path, third.offset, third.line))
    assert [e.message.content for e in rest] == ["m2", "m3"]
    assert [e.line for e in rest] == [4, 5]


def test_forward_reader_never_consumes_a_partial_last_line(store: SessionStore) -> None:
    """A last line without its newline is not returned, and end_offset stops before it."""
    s = store.create("alice")
    store.append_message("alice", s.session_key, role="user", content="whole")
    path = store.transcript_path("alice", s.session_key)
    whole = path.stat().st_size
    line = orjson.dumps(Message("x", "user", "torn", "2026-11-22T10:00:00.000Z", None).to_line())
    with path.open("ab") as fh:
        fh.write(line)  # no newline yet
    reader = ForwardReader(path)
    assert [e.message.content for e in reader] == ["whole"]
    assert (reader.end_offset, reader.end_line) == (whole, 2)
    with path.open("ab") as fh:
        fh.write(b"\n")
    later = ForwardReader(path, reader.end_offset, reader.end_line + 1)
    assert [(e.line, e.message.content) for e in later] == [(3, "torn")]


def test_forward_reader_applies_the_stores_rules_to_each_line(tmp_path: Path) -> None:
    """Lines the store would not return (garbage, a message missing a field, content that is not
    a string) are skipped and counted; other kinds of line are passed over silently."""
    path = tmp_path / "t.jsonl"
    good = Message("m1", "user", "kept", "2026-11-22T10:00:00.000Z", None).to_line()
    lines = [
        {"type": "session", "version": 1, "sessionKey": KEY, "user": "alice",
         "createdAt": good["ts"], "title": "t"},
        good,
        {"type": "message", "role": "user", "content": "no id", "ts": good["ts"]},
        {**good, "content": [{"type": "text", "text": "parts"}]},
        {"type": "note", "text": "a later kind of line"},
    ]
    path.write_bytes(b"".join(orjson.dumps(obj) + b"\n" for obj in lines) + b"\xff garbage\n\n")
    reader = ForwardReader(path)
    assert [(e.line, e.message.content) for e in reader] == [(2, "kept")]
    assert (reader.skipped, reader.end_line, reader.end_offset) == (3, 7, path.stat().st_size)


def test_forward_reader_streams_lines_longer_than_a_block(store: SessionStore) -> None:
    """Lines spanning several 64 KiB blocks are joined whole, and offsets stay exact."""
    s = store.create("alice")
    big = "word " * 40_000  # ~200 KB
    for content in (big, "small", big + "end"):
        store.append_message("alice", s.session_key, role="user", content=content)
    path = store.transcript_path("alice", s.session_key)
    entries = list(ForwardReader(path))
    assert [e.message.content for e in entries] == [big, "small", big + "end"]
    with path.open("rb") as fh:
        for e in entries:
            fh.seek(e.offset)
            assert orjson.loads(fh.readline())["id"] == e.message.id


def test_path_layout_round_trips_and_refuses_other_names(tmp_path: Path) -> None:
    """transcript_relpath and parse_transcript_relpath are inverse; anything the store could
    not have written parses to None."""
    assert transcript_relpath("alice", KEY) == f"alice/{KEY}.jsonl"
    assert parse_transcript_relpath(transcript_relpath("alice", KEY)) == ("alice", KEY)
    for bad in ["alice/s1.jsonl", f"alice/{KEY}.json", f"../{KEY}.jsonl", f"a/b/{KEY}.jsonl",
                f"{KEY}.jsonl", f"alice/{KEY}.jsonl.corrupt-1", f"./{KEY}.jsonl",
                f"alice/{KEY.upper()}.jsonl"]:
        assert parse_transcript_relpath(bad) is None, bad
    root = sessions_root(tmp_path)
    assert root == tmp_path / "sessions"
    assert transcript_file(root, "alice", KEY) == root / "alice" / f"{KEY}.jsonl"


def test_store_and_layout_agree_on_paths(data_dir: Path) -> None:
    """The store writes where the layout says, and scan_transcripts finds exactly its files."""
    with SessionStore(data_dir, SessionsConfig()) as store:
        s = store.create("bob")
        path = store.transcript_path("bob", s.session_key)
    root = sessions_root(data_dir)
    assert path == transcript_file(root, "bob", s.session_key)
    assert path.relative_to(root).as_posix() == transcript_relpath("bob", s.session_key)
    (path.parent / "stray.jsonl").write_text("{}\n")
    os.symlink(path, path.parent / f"{'f' * 32}.jsonl")
    assert scan_transcripts(root) == {("bob", s.session_key): path.stat().st_size}
    assert scan_transcripts(tmp_missing := data_dir / "nowhere") == {} and not tmp_missing.exists()


def test_key_factory_names_new_sessions(data_dir: Path) -> None:
    """A store given a key factory uses its keys, in order; a malformed key is refused before
    anything is written."""
    keys = iter([KEY, "f" * 32, "not-a-key"])
    with SessionStore(data_dir, SessionsConfig(), key_factory=lambda: next(keys)) as store:
        assert store.create("alice").session_key == KEY
        assert store.create("alice").session_key == "f" * 32
        with pytest.raises(ValueError):
            store.create("alice")
        page, _ = store.list("alice")
    assert sorted(s.session_key for s in page) == [KEY, "f" * 32]
