"""Disk failures injected at the file layer, and the fsync policies."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from sessions import (
    FileIO,
    InvalidSessionInput,
    LineTooLarge,
    SessionError,
    SessionNotFound,
    SessionsConfig,
    SessionStore,
    StorageError,
)

from .conftest import fill, read_lines

# Transcript files, their recovery and the index cache: the file store alone.
pytestmark = pytest.mark.jsonl_only


class FlakyDisk:
    """A real disk that fails on demand: ``fail`` is an errno to raise, or "short" to write
    half the bytes and report that."""

    def __init__(self) -> None:
        self.fail: int | str | None = None
        self.writes = 0
        self.fsyncs = 0
        self.fsync_fail: int | None = None

    def write(self, fd: int, data: bytes) -> int:
        self.writes += 1
        if self.fail == "short":
            return os.write(fd, data[: len(data) // 2])
        if isinstance(self.fail, int):
            raise OSError(self.fail, os.strerror(self.fail))
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        self.fsyncs += 1
        if self.fsync_fail is not None:
            raise OSError(self.fsync_fail, os.strerror(self.fsync_fail))
        os.fsync(fd)

    def io(self) -> FileIO:
        return FileIO(write=self.write, fsync=self.fsync)


@pytest.fixture
def disk() -> FlakyDisk:
    return FlakyDisk()


@pytest.mark.parametrize(
    ("fail", "expected"),
    [
        (errno.ENOSPC, "no space left on device while appending to transcript"),
        (errno.EIO, "input/output error while appending to transcript"),
        ("short", "short write"),
    ],
)
def test_failed_append_leaves_transcript_valid_and_store_usable(
    data_dir: Path, disk: FlakyDisk, fail: int | str, expected: str
) -> None:
    """ENOSPC, EIO or a short write raise StorageError saying what happened; the transcript is
    byte-for-byte what it was, and the next append (disk healthy again) works."""
    store = SessionStore(data_dir, file_io=disk.io())
    s = store.create("alice")
    fill(store, "alice", s.session_key, 2)
    path = store.transcript_path("alice", s.session_key)
    before = path.read_bytes()
    disk.fail = fail
    with pytest.raises(StorageError) as info:
        store.append_message("alice", s.session_key, role="user", content="lost " * 100)
    assert expected in str(info.value)
    assert isinstance(info.value, StorageError)
    assert info.value.errno in (errno.ENOSPC, errno.EIO)
    assert path.read_bytes() == before
    assert store.get("alice", s.session_key).message_count == 2
    disk.fail = None
    store.append_message("alice", s.session_key, role="user", content="kept")
    assert [line.get("content") for line in read_lines(path)[1:]] == ["m0", "m1", "kept"]
    assert store.get("alice", s.session_key).message_count == 3
    store.close()
    with SessionStore(data_dir) as reopened:
        assert reopened.get("alice", s.session_key).message_count == 3
        assert not list(path.parent.glob("*.corrupt-*"))


def test_failed_create_leaves_no_transcript(data_dir: Path, disk: FlakyDisk) -> None:
    """A create that hits ENOSPC raises StorageError and leaves neither file nor index row."""
    store = SessionStore(data_dir, file_io=disk.io())
    disk.fail = errno.ENOSPC
    with pytest.raises(StorageError, match="no space left on device while creating transcript"):
        store.create("alice")
    assert not list((data_dir / "sessions").rglob("*.jsonl"))
    assert store.list("alice") == ([], None)
    disk.fail = None
    store.create("alice")
    assert len(store.list("alice")[0]) == 1
    store.close()


def test_tail_that_cannot_be_saved_is_left_for_later(data_dir: Path, disk: FlakyDisk) -> None:
    """If the bad tail cannot be copied aside (disk full) the file is left untouched and the
    call fails with StorageError; once space returns the repair happens."""
    with SessionStore(data_dir) as s:
        key = s.create("alice").session_key
        fill(s, "alice", key, 2)
        path = s.transcript_path("alice", key)
    good = path.read_bytes()
    path.write_bytes(good + b"torn tail")
    disk.fail = errno.ENOSPC
    store = SessionStore(data_dir, file_io=disk.io())  # must still start
    with pytest.raises(StorageError, match="no space left on device"):
        store.history("alice", key)
    assert path.read_bytes() == good + b"torn tail"
    assert not list(path.parent.glob("*.corrupt-*"))
    disk.fail = None
    assert [m.content for m in store.history("alice", key)[0]] == ["m0", "m1"]
    assert path.read_bytes() == good
    store.close()


def test_fsync_always_syncs_every_append(data_dir: Path, disk: FlakyDisk) -> None:
    """fsync="always" fsyncs each append before returning and leaves nothing for flush()."""
    store = SessionStore(data_dir, SessionsConfig(fsync="always"), file_io=disk.io())
    s = store.create("alice")
    disk.fsyncs = 0
    fill(store, "alice", s.session_key, 5)
    assert disk.fsyncs == 5
    store.flush()
    assert disk.fsyncs == 5
    store.close()


def test_fsync_batch_syncs_on_flush_only(data_dir: Path, disk: FlakyDisk) -> None:
    """fsync="batch" never fsyncs during append; flush() fsyncs each dirty transcript once."""
    store = SessionStore(data_dir, SessionsConfig(fsync="batch"), file_io=disk.io())
    a, b = store.create("alice"), store.create("alice")
    store.flush()
    disk.fsyncs = 0
    fill(store, "alice", a.session_key, 5)
    fill(store, "alice", b.session_key, 3)
    assert disk.fsyncs == 0
    store.flush()
    assert disk.fsyncs == 2
    store.flush()
    assert disk.fsyncs == 2
    store.append_message("alice", a.session_key, role="user", content="x")
    store.close()  # close flushes what is still dirty
    assert disk.fsyncs == 3


def test_fsync_batch_makes_new_files_directory_entries_durable(
    data_dir: Path, disk: FlakyDisk
) -> None:
    """Under "batch", the flush after a create also fsyncs the directories that gained entries."""
    store = SessionStore(data_dir, SessionsConfig(fsync="batch"), file_io=disk.io())
    store.create("alice")
    disk.fsyncs = 0
    store.flush()
    assert disk.fsyncs == 3  # the transcript, sessions/alice/ and sessions/
    store.close()


def test_fsync_never_never_syncs(data_dir: Path, disk: FlakyDisk) -> None:
    """fsync="never" makes no fsync call at all, even on flush() and close()."""
    store = SessionStore(data_dir, SessionsConfig(fsync="never"), file_io=disk.io())
    s = store.create("alice")
    fill(store, "alice", s.session_key, 4)
    store.delete("alice", store.create("alice").session_key)
    store.flush()
    store.close()
    assert disk.fsyncs == 0


def test_failed_fsync_under_always_unwrites_the_line(data_dir: Path, disk: FlakyDisk) -> None:
    """Under "always" an fsync EIO fails the append and removes the line it could not sync."""
    store = SessionStore(data_dir, SessionsConfig(fsync="always"), file_io=disk.io())
    s = store.create("alice")
    path = store.transcript_path("alice", s.session_key)
    before = path.read_bytes()
    disk.fsync_fail = errno.EIO
    with pytest.raises(StorageError, match="input/output error while syncing transcript"):
        store.append_message("alice", s.session_key, role="user", content="x")
    assert path.read_bytes() == before
    disk.fsync_fail = None
    store.append_message("alice", s.session_key, role="user", content="y")
    assert store.get("alice", s.session_key).message_count == 1
    store.close()


def test_failed_flush_reports_storage_error(data_dir: Path, disk: FlakyDisk) -> None:
    """A flush whose fsync fails raises StorageError after trying every dirty file."""
    store = SessionStore(data_dir, SessionsConfig(fsync="batch"), file_io=disk.io())
    a, b = store.create("alice"), store.create("alice")
    store.flush()
    store.append_message("alice", a.session_key, role="user", content="x")
    store.append_message("alice", b.session_key, role="user", content="y")
    disk.fsync_fail = errno.EIO
    disk.fsyncs = 0
    with pytest.raises(StorageError, match="while syncing transcripts to disk"):
        store.flush()
    assert disk.fsyncs == 2
    disk.fsync_fail = None
    store.close()


def test_error_tree_for_the_gateway_mapper() -> None:
    """Every error class sits under one root; the gateway maps each class
    (tests/gateway/test_errors.py)."""
    assert LineTooLarge(10, 5).field == "message"
    for cls in (SessionNotFound, InvalidSessionInput, LineTooLarge, StorageError):
        assert issubclass(cls, SessionError)
    assert issubclass(LineTooLarge, InvalidSessionInput)
