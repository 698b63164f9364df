"""The clean-stop marker: a start after a clean stop skips the per-transcript walk, a start
after a crash does the full reconcile, and what changed while the store was down is found."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from sessions import SessionsConfig, SessionStore
from sessions.shutdown import MARKER_NAME

from .conftest import LogList, fill

_AN_HOUR_NS = 3600 * 10**9


def _age_dirs(data_dir: Path) -> None:
    """Set every user directory's mtime an hour back, so the marker written next vouches for
    them (a directory modified just before the stop is rescanned, for coarse file systems)."""
    old = time.time_ns() - _AN_HOUR_NS
    for user_dir in (data_dir / "sessions").iterdir():
        os.utime(user_dir, ns=(old, old))


def _open(data_dir: Path) -> SessionStore:
    return SessionStore(data_dir, SessionsConfig(), trust_clean_stop=True)


def _events(logs: LogList, name: str) -> list[dict[str, object]]:
    return [dict(e) for e in logs if e.get("event") == name]


def _counts(store: SessionStore, user: str) -> dict[str, int]:
    return {s.session_key: s.message_count for s in store.list(user)[0]}


def test_clean_restart_skips_the_walk(data_dir: Path, logs: LogList) -> None:
    """After a clean stop nothing is rescanned when no user directory changed, and every
    session is listed as it was."""
    store = _open(data_dir)
    key = store.create("alice").session_key
    fill(store, "alice", key, 3)
    _age_dirs(data_dir)
    store.close()
    assert (data_dir / MARKER_NAME).exists()
    again = _open(data_dir)
    try:
        assert again.clean_start is True
        assert not (data_dir / MARKER_NAME).exists()  # taken: a crash of this run leaves none
        (event,) = _events(logs, "sessions.clean_start")
        assert (event["users"], event["rescanned"], event["gone"]) == (1, 0, 0)
        assert _counts(again, "alice") == {key: 3}
    finally:
        again.close()


def test_without_a_marker_the_full_reconcile_runs_and_cuts_a_torn_tail(data_dir: Path) -> None:
    """A crash leaves no marker: the next open walks every transcript and cuts a torn tail,
    even where the user directory did not change."""
    store = _open(data_dir)
    key = store.create("alice").session_key
    fill(store, "alice", key, 2)
    path = store.transcript_path("alice", key)
    _age_dirs(data_dir)
    store.close()
    (data_dir / MARKER_NAME).unlink()  # as if the process had died instead of closing
    with path.open("ab") as fh:
        fh.write(b'{"type":"message","content":"torn')
    again = _open(data_dir)
    try:
        assert again.clean_start is False
        assert not path.read_bytes().endswith(b"torn")
        assert list(path.parent.glob(f"{path.name}.corrupt-*"))
        assert _counts(again, "alice") == {key: 2}
    finally:
        again.close()


def test_an_untrusting_open_still_takes_the_marker(data_dir: Path) -> None:
    """Every open removes the marker, so it never vouches for a later run that may crash."""
    store = _open(data_dir)
    store.create("alice")
    store.close()
    SessionStore(data_dir).close()  # writes a fresh marker on its own clean close
    plain = SessionStore(data_dir)
    assert plain.clean_start is False and not (data_dir / MARKER_NAME).exists()
    plain._rows.index.close()  # die without closing: no marker
    again = _open(data_dir)
    try:
        assert again.clean_start is False
    finally:
        again.close()


def test_a_transcript_copied_in_or_removed_while_down_is_found_at_open(
    data_dir: Path, tmp_path: Path
) -> None:
    """A copy into a user directory (and a removal) changes that directory's mtime, so the
    clean start rescans it and lists the copy at once."""
    store = _open(data_dir)
    kept = store.create("alice").session_key
    removed = store.create("alice").session_key
    _age_dirs(data_dir)
    store.close()
    elsewhere = SessionStore(tmp_path / "elsewhere")
    copied = elsewhere.create("alice").session_key
    fill(elsewhere, "alice", copied, 2)
    source = elsewhere.transcript_path("alice", copied)
    elsewhere.close()
    shutil.copy(source, data_dir / "sessions" / "alice" / source.name)
    (data_dir / "sessions" / "alice" / f"{removed}.jsonl").unlink()
    again = _open(data_dir)
    try:
        assert again.clean_start is True
        assert _counts(again, "alice") == {kept: 0, copied: 2}
    finally:
        again.close()


def test_a_transcript_appended_to_while_down_is_found_by_the_catch_up(data_dir: Path) -> None:
    """An append changes no directory: the background catch-up after a clean start finds it
    and the session's row follows the file."""
    store = _open(data_dir)
    key = store.create("alice").session_key
    fill(store, "alice", key, 2)
    path = store.transcript_path("alice", key)
    _age_dirs(data_dir)
    store.close()
    last_line = path.read_bytes().splitlines(keepends=True)[-1]
    with path.open("ab") as fh:
        fh.write(last_line)  # one more whole message line, written by someone else
    again = _open(data_dir)
    try:
        assert again.clean_start is True
        deadline = time.monotonic() + 30
        while _counts(again, "alice") != {key: 3} and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _counts(again, "alice") == {key: 3}
        assert again.catch_up() == 0  # nothing left for a second pass
    finally:
        again.close()


def test_the_store_implements_the_protocol_the_gateway_uses(store: SessionStore) -> None:
    """SessionStore satisfies SessionStoreLike, the seam a PostgreSQL store will implement."""
    from sessions import SessionStoreLike

    typed: SessionStoreLike = store  # mypy checks the signatures here
    assert typed.list("alice") == ([], None)
