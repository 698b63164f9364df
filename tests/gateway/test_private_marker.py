"""The mode audit after a clean stop: only directories, and the entries of changed ones, are
looked at; without the marker (a crash) every file is."""

from __future__ import annotations

import os
import time
from pathlib import Path

from gateway.private import (
    MARKER_NAME,
    find_exposed,
    make_private_dir,
    mark_clean_stop,
    take_clean_stop,
)

_AN_HOUR_NS = 3600 * 10**9


def _private_tree(data: Path) -> Path:
    """A private data dir with one user's transcript, its directories' mtimes an hour back
    (a directory modified just before the stop is looked into, for coarse file systems)."""
    user_dir = data / "sessions" / "alice"
    make_private_dir(user_dir)
    transcript = user_dir / "a.jsonl"
    transcript.write_text("{}\n")
    transcript.chmod(0o600)
    old = time.time_ns() - _AN_HOUR_NS
    for path in (user_dir, data / "sessions", data):
        path.chmod(0o700)  # mkdir(parents=True) gives only the last one its mode
        os.utime(path, ns=(old, old))
    return transcript


def test_a_clean_stop_lets_the_audit_skip_unchanged_directories(tmp_path: Path) -> None:
    """With the marker, a file in an unchanged directory is not lstat-ed (so a chmod of it
    goes unseen: the limit the module docstring states), the marker is taken, and the audit
    without it (a crash) sees the file again."""
    data = tmp_path / "data"
    transcript = _private_tree(data)
    mark_clean_stop(data)
    transcript.chmod(0o644)  # changes no directory
    since = take_clean_stop(data)
    assert since is not None and not (data / MARKER_NAME).exists()
    assert find_exposed(data, since).count == 0
    assert take_clean_stop(data) is None
    assert find_exposed(data, None).count == 1


def test_entries_new_since_the_stop_are_audited(tmp_path: Path) -> None:
    """A file or a directory tree created while the daemon was down changed its parent's
    mtime, so the audit after a clean stop looks at all of it."""
    data = tmp_path / "data"
    _private_tree(data)
    mark_clean_stop(data)
    (data / "sessions" / "alice" / "copied.jsonl").write_text("{}\n")
    os.chmod(data / "sessions" / "alice" / "copied.jsonl", 0o644)
    restored = data / "sessions" / "bob" / "deep"
    restored.mkdir(parents=True, mode=0o755)
    (restored / "b.jsonl").write_text("{}\n")
    os.chmod(restored / "b.jsonl", 0o640)
    for made in (data / "sessions" / "bob", restored):
        os.chmod(made, 0o755)  # whatever umask an earlier test left the process with
    since = take_clean_stop(data)
    exposed = find_exposed(data, since)
    assert exposed.count == find_exposed(data, None).count == 4
    assert (any("copied.jsonl" in p for p in exposed.paths)
            and any("b.jsonl" in p for p in exposed.paths))


def test_a_directory_whose_mode_changed_is_reported(tmp_path: Path) -> None:
    """Each recorded directory is lstat-ed at every start, so its own mode is always checked."""
    data = tmp_path / "data"
    _private_tree(data)
    mark_clean_stop(data)
    os.chmod(data / "sessions", 0o755)
    exposed = find_exposed(data, take_clean_stop(data))
    assert exposed.count == 1 and str(data / "sessions") in exposed.paths[0]
