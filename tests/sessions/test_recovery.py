"""Torn and garbage tails left by a crash: moved aside, logged, every valid line kept."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from sessions import SessionNotFound, SessionStore

from .conftest import LogList, fill

_VALID_LINE = orjson.dumps(
    {"type": "message", "id": "x" * 32, "role": "user", "content": "half", "ts":
     "2024-01-01T00:00:00.000Z", "runId": None}
) + b"\n"

TAILS: dict[str, bytes] = {
    "half_a_line": _VALID_LINE[: len(_VALID_LINE) // 2],
    "nul_bytes": b"\x00" * 4096,
    "nul_bytes_then_newline": b"\x00" * 100 + b"\n",
    "invalid_utf8_line": b'{"type":"message","content":"\xff\xfe"}\n',
    "invalid_utf8_torn": b'{"type":"message","content":"\xc3',
    "garbage_lines_after_valid": b"garbage\nmore garbage\n{not json\n[1,2]\n",
    "json_but_not_a_line": b'"just a string"\n42\n',
    "huge_line_without_newline": b'{"type":"message","content":"' + b"x" * 3_000_000,
}

# Transcript files, their recovery and the index cache: the file store alone.
pytestmark = pytest.mark.jsonl_only


def _session_with_messages(data_dir: Path, n: int = 3) -> tuple[str, Path, bytes]:
    with SessionStore(data_dir) as s:
        key = s.create("alice").session_key
        fill(s, "alice", key, n)
        path = s.transcript_path("alice", key)
    return key, path, path.read_bytes()


def _asides(path: Path) -> list[Path]:
    return sorted(path.parent.glob(path.name + ".corrupt-*"))


def _events(logs: LogList, name: str) -> LogList:
    return [e for e in logs if e["event"] == name]


@pytest.mark.parametrize("when", ["at_start", "on_first_use"])
@pytest.mark.parametrize("shape", list(TAILS))
def test_bad_tail_is_moved_aside_and_valid_lines_kept(
    data_dir: Path, logs: LogList, shape: str, when: str
) -> None:
    """Each tail shape is cut off to <file>.corrupt-<ts> (exact bytes), logged with its byte
    count, and every valid line before it survives and stays appendable."""
    key, path, good = _session_with_messages(data_dir)
    bad = TAILS[shape]
    if when == "at_start":
        path.write_bytes(good + bad)
        store = SessionStore(data_dir)
    else:
        store = SessionStore(data_dir)
        path.write_bytes(good + bad)
    messages, _ = store.history("alice", key)
    assert [m.content for m in messages] == ["m0", "m1", "m2"]
    assert path.read_bytes() == good
    (aside,) = _asides(path)
    assert aside.read_bytes() == bad
    assert aside.name.startswith(f"{key}.jsonl.corrupt-") and aside.name.endswith("Z")
    (event,) = _events(logs, "transcript.recovered")
    assert event["bytes"] == len(bad) and event["path"] == str(path)
    assert event["log_level"] == "warning"
    store.append_message("alice", key, role="user", content="after")
    assert [m.content for m in store.history("alice", key)[0]] == ["m0", "m1", "m2", "after"]
    assert store.get("alice", key).message_count == 4
    store.close()


def test_a_whole_file_without_a_tail_is_untouched(data_dir: Path, logs: LogList) -> None:
    """A transcript that ends on a valid line is never rewritten and nothing is moved aside."""
    key, path, good = _session_with_messages(data_dir)
    with SessionStore(data_dir) as store:
        store.history("alice", key)
    assert path.read_bytes() == good and _asides(path) == []
    assert _events(logs, "transcript.recovered") == []


def test_torn_header_means_the_session_never_existed(
    data_dir: Path, logs: LogList
) -> None:
    """A transcript holding only part of its header is saved aside and removed; the key is
    not found and the store keeps working."""
    key, path, good = _session_with_messages(data_dir, n=0)
    path.write_bytes(good[:40])
    with SessionStore(data_dir) as store:
        with pytest.raises(SessionNotFound):
            store.get("alice", key)
        assert store.list("alice") == ([], None)
        assert not path.exists()
        (aside,) = _asides(path)
        assert aside.read_bytes() == good[:40]
        store.create("alice")
    assert _events(logs, "transcript.recovered")


def test_zero_length_transcript_is_removed(data_dir: Path, logs: LogList) -> None:
    """An empty .jsonl (crash between create and the header write) is not found, and removed."""
    key, path, _ = _session_with_messages(data_dir, n=0)
    path.write_bytes(b"")
    with SessionStore(data_dir) as store:
        with pytest.raises(SessionNotFound):
            store.history("alice", key)
    assert not path.exists()
    assert _events(logs, "transcript.removed_empty")


@pytest.mark.parametrize(
    "header",
    [
        b"not a header at all\n",
        b'{"type":"session","version":99}\n',
        b'{"type":"message","id":"a","role":"user","content":"x","ts":"2024-01-01T00:00:00Z"}\n',
    ],
)
def test_unreadable_header_is_not_found_and_file_left_alone(
    data_dir: Path, logs: LogList, header: bytes
) -> None:
    """A transcript whose first line is not a valid header is treated as not found, logged, and
    left on disk byte for byte (it may hold valid lines someone wants back)."""
    key, path, good = _session_with_messages(data_dir)
    damaged = header + good.split(b"\n", 1)[1]
    path.write_bytes(damaged)
    with SessionStore(data_dir) as store:
        for call in (
            lambda: store.get("alice", key),
            lambda: store.history("alice", key),
            lambda: store.append_message("alice", key, role="user", content="x"),
        ):
            with pytest.raises(SessionNotFound):
                call()
        assert store.list("alice") == ([], None)
    assert path.read_bytes() == damaged
    assert _events(logs, "transcript.unreadable")


def test_header_for_another_user_or_key_is_not_trusted(data_dir: Path) -> None:
    """A transcript copied under another user's directory or file name is not found there."""
    key, path, good = _session_with_messages(data_dir)
    bob_dir = path.parent.parent / "bob"
    bob_dir.mkdir()
    (bob_dir / path.name).write_bytes(good)
    other_key = "e" * 32
    (path.parent / f"{other_key}.jsonl").write_bytes(good)
    with SessionStore(data_dir) as store:
        with pytest.raises(SessionNotFound):
            store.history("bob", key)
        with pytest.raises(SessionNotFound):
            store.get("alice", other_key)
        assert store.list("bob") == ([], None)
        assert [s.session_key for s in store.list("alice")[0]] == [key]


def test_bad_line_in_the_middle_is_skipped_not_fatal(
    data_dir: Path, logs: LogList
) -> None:
    """A garbage line between valid lines (a hand edit) is skipped when reading and logged; the
    file is not truncated and appends continue."""
    key, path, good = _session_with_messages(data_dir)
    head, rest = good.split(b"\n", 2)[:2], good.split(b"\n", 2)[2]
    damaged = head[0] + b"\n" + head[1] + b"\n" + b"\xff garbage\n" + rest
    path.write_bytes(damaged)
    with SessionStore(data_dir) as store:
        assert [m.content for m in store.history("alice", key)[0]] == ["m0", "m1", "m2"]
        assert path.read_bytes() == damaged
        store.append_message("alice", key, role="user", content="next")
        assert [m.content for m in store.recent_messages("alice", key, 2)] == ["m2", "next"]
    assert _events(logs, "transcript.bad_line")
    assert _asides(path) == []


def test_recovery_happens_once_per_tail(data_dir: Path, logs: LogList) -> None:
    """After one recovery, later reads and a restart find nothing more to move aside."""
    key, path, good = _session_with_messages(data_dir)
    path.write_bytes(good + b"torn")
    with SessionStore(data_dir) as store:
        store.history("alice", key)
        store.get("alice", key)
    with SessionStore(data_dir) as store:
        store.history("alice", key)
    assert len(_events(logs, "transcript.recovered")) == 1
    assert len(_asides(path)) == 1


def test_other_line_types_are_skipped_silently(data_dir: Path, logs: LogList) -> None:
    """A well-formed line of another type (a later version's event) is not a message and not
    an error: history skips it without logging."""
    key, path, good = _session_with_messages(data_dir)
    path.write_bytes(good + b'{"type":"event","what":"renamed"}\n')
    with SessionStore(data_dir) as store:
        assert [m.content for m in store.history("alice", key)[0]] == ["m0", "m1", "m2"]
    assert _events(logs, "transcript.bad_line") == []
    assert _asides(path) == []


def test_transcript_removed_behind_the_store_is_not_found(store: SessionStore) -> None:
    """A transcript deleted by someone else makes the session not found, and it leaves the list."""
    s = store.create("alice")
    store.transcript_path("alice", s.session_key).unlink()
    with pytest.raises(SessionNotFound):
        store.append_message("alice", s.session_key, role="user", content="x")
    assert store.list("alice") == ([], None)
