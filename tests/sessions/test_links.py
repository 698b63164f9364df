"""Issue 22, item 8 (t12b): the file store never follows a link planted in its data dir. A link
as a transcript, as a user's directory or as ``sessions.db`` is refused with
:class:`UnsafePath`, for reading and for appending, and the file it points at is neither
returned nor changed."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from sessions import SessionsConfig, SessionStore, UnsafePath
from sessions.layout import sessions_root, transcript_file

KEY = "0123456789abcdef0123456789abcdef"


def planted_transcript(path: Path, user: str, key: str, text: str) -> bytes:
    """A well-formed transcript written by hand outside the data dir; returns its bytes."""
    header = {"type": "session", "version": 1, "sessionKey": key, "user": user,
              "createdAt": "2026-11-20T09:00:00.000Z", "title": "planted"}
    message = {"type": "message", "id": "m" * 26, "role": "user", "content": text,
               "ts": "2026-11-20T09:00:01.000Z"}
    body = orjson.dumps(header) + b"\n" + orjson.dumps(message) + b"\n"
    path.write_bytes(body)
    return body


def test_a_linked_transcript_is_neither_read_nor_appended_to(
    data_dir: Path, tmp_path: Path
) -> None:
    """bob's <key>.jsonl is a link to a transcript outside: history, get, recent messages,
    append, update and delete all raise UnsafePath, and the outside file keeps its bytes."""
    outside = tmp_path / "outside.jsonl"
    body = planted_transcript(outside, "bob", KEY, "the outside secret")
    with SessionStore(data_dir, SessionsConfig()) as store:
        store.create("bob")  # makes sessions/bob/
        link = transcript_file(sessions_root(data_dir), "bob", KEY)
        link.symlink_to(outside)
        for call in (lambda: store.history("bob", KEY), lambda: store.get("bob", KEY),
                     lambda: store.recent_messages("bob", KEY, 5),
                     lambda: store.append_message("bob", KEY, role="user",
                                                  content="through the link"),
                     lambda: store.update("bob", KEY, title="renamed"),
                     lambda: store.purge_messages("bob", KEY), lambda: store.delete("bob", KEY)):
            with pytest.raises(UnsafePath, match="symbolic link"):
                call()
        assert all(s.session_key != KEY for s in store.list("bob")[0])
    assert outside.read_bytes() == body
    assert link.is_symlink()


def test_a_link_to_a_torn_file_is_not_cut_back(data_dir: Path, tmp_path: Path) -> None:
    """Tail recovery, which truncates, refuses a link: a file outside that ends in half a line
    keeps every byte, and no corrupt-tail copy is written."""
    outside = tmp_path / "notes.txt"
    body = planted_transcript(outside, "bob", KEY, "kept") + b'{"half a line'
    outside.write_bytes(body)
    with SessionStore(data_dir, SessionsConfig()) as store:
        store.create("bob")
        link = transcript_file(sessions_root(data_dir), "bob", KEY)
        link.symlink_to(outside)
        with pytest.raises(UnsafePath):
            store.history("bob", KEY)
    assert outside.read_bytes() == body
    assert list(tmp_path.glob("notes.txt.corrupt-*")) == []


def test_a_linked_user_directory_is_refused(data_dir: Path, tmp_path: Path) -> None:
    """sessions/bob is a link to a directory outside holding bob's transcript: reading,
    appending and creating there are refused, and the directory outside is unchanged."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    body = planted_transcript(elsewhere / f"{KEY}.jsonl", "bob", KEY, "the outside secret")
    with SessionStore(data_dir, SessionsConfig()) as store:
        (sessions_root(data_dir) / "bob").symlink_to(elsewhere, target_is_directory=True)
        with pytest.raises(UnsafePath, match="the user's directory"):
            store.history("bob", KEY)
        with pytest.raises(UnsafePath, match="the user's directory"):
            store.append_message("bob", KEY, role="user", content="through the link")
        with pytest.raises(UnsafePath, match="the user's directory"):
            store.create("bob")
        assert store.list("bob") == ([], None)
    assert sorted(p.name for p in elsewhere.iterdir()) == [f"{KEY}.jsonl"]
    assert (elsewhere / f"{KEY}.jsonl").read_bytes() == body


def test_a_fifo_as_a_transcript_is_refused_without_blocking(data_dir: Path) -> None:
    """A FIFO planted as a transcript would block a reader's open forever: it is refused at once."""
    with SessionStore(data_dir, SessionsConfig()) as store:
        store.create("bob")
        os.mkfifo(transcript_file(sessions_root(data_dir), "bob", KEY))
        with pytest.raises(UnsafePath):
            store.history("bob", KEY)
        with pytest.raises(UnsafePath):
            store.append_message("bob", KEY, role="user", content="into a pipe")


def test_a_linked_session_index_is_refused(data_dir: Path, tmp_path: Path) -> None:
    """sessions.db planted as a link: the store refuses to open, and writes nothing through it."""
    outside = tmp_path / "victim.db"
    outside.write_bytes(b"not yours")
    data_dir.mkdir()
    (data_dir / "sessions.db").symlink_to(outside)
    with pytest.raises(UnsafePath, match="session index"):
        SessionStore(data_dir, SessionsConfig())
    assert outside.read_bytes() == b"not yours"


def test_the_store_still_reads_and_writes_its_own_files(data_dir: Path) -> None:
    """No link anywhere: create, append, history, recovery of a torn tail all work as before."""
    with SessionStore(data_dir, SessionsConfig()) as store:
        key = store.create("bob").session_key
        store.append_message("bob", key, role="user", content="hello")
        path = store.transcript_path("bob", key)
    with path.open("ab") as fh:
        fh.write(b'{"torn')
    with SessionStore(data_dir, SessionsConfig()) as store:
        assert [m.content for m in store.history("bob", key)[0]] == ["hello"]
        store.append_message("bob", key, role="assistant", content="hi")
        assert [m.content for m in store.recent_messages("bob", key, 5)] == ["hello", "hi"]
