"""Where transcripts live: the one mapping between (user, session key) and a file.

A data dir holds ``sessions/<user>/<sessionKey>.jsonl``. Everything that builds or reads such a
path — the store, its index reconciliation, the memory indexer — goes through this module, so
the layout is defined once (docs/sessions.md).

A path counts as a transcript only when both names are well formed (:func:`is_user_name`,
:func:`is_session_key`): a stray file, a ``.corrupt-*`` tail or a hand-named copy is not one, for
the store and for the index alike.
"""

from __future__ import annotations

import os
from pathlib import Path

from .keys import is_session_key, is_user_name

__all__ = [
    "SESSIONS_DIR",
    "TRANSCRIPT_SUFFIX",
    "parse_transcript_relpath",
    "scan_transcripts",
    "scan_user_transcripts",
    "sessions_root",
    "transcript_file",
    "transcript_relpath",
]

SESSIONS_DIR = "sessions"
TRANSCRIPT_SUFFIX = ".jsonl"


def sessions_root(data_dir: Path) -> Path:
    """``<data_dir>/sessions``: the directory holding one sub-directory per user."""
    return Path(data_dir) / SESSIONS_DIR


def transcript_relpath(user: str, session_key: str) -> str:
    """``"<user>/<sessionKey>.jsonl"``, relative to :func:`sessions_root` (POSIX separators)."""
    return f"{user}/{session_key}{TRANSCRIPT_SUFFIX}"


def parse_transcript_relpath(relpath: str) -> tuple[str, str] | None:
    """``(user, session_key)`` for a :func:`transcript_relpath`; None for any other string."""
    user, sep, name = relpath.partition("/")
    if not sep or not name.endswith(TRANSCRIPT_SUFFIX):
        return None
    key = name[: -len(TRANSCRIPT_SUFFIX)]
    if not (is_user_name(user) and is_session_key(key)):
        return None
    return user, key


def transcript_file(root: Path, user: str, session_key: str) -> Path:
    """``<root>/<user>/<sessionKey>.jsonl``; both names must already be validated."""
    return root / user / f"{session_key}{TRANSCRIPT_SUFFIX}"


def scan_transcripts(root: Path) -> dict[tuple[str, str], int]:
    """``(user, session_key) -> size`` of every well-named transcript under ``root``; anything
    else (``.corrupt-*`` files, stray files, symlinks) is ignored. Empty if ``root`` is missing."""
    found: dict[tuple[str, str], int] = {}
    try:
        users = os.scandir(root)
    except FileNotFoundError:
        return found
    with users:
        for user_entry in users:
            if user_entry.is_dir(follow_symlinks=False) and is_user_name(user_entry.name):
                _scan_user(user_entry.path, user_entry.name, found)
    return found


def scan_user_transcripts(root: Path, user: str) -> dict[tuple[str, str], int]:
    """:func:`scan_transcripts` for one user's directory (a validated name); empty if missing."""
    found: dict[tuple[str, str], int] = {}
    path = root / user
    if path.is_dir() and not path.is_symlink():
        _scan_user(str(path), user, found)
    return found


def _scan_user(path: str, user: str, found: dict[tuple[str, str], int]) -> None:
    try:
        files = os.scandir(path)
    except FileNotFoundError:
        return  # removed while we looked
    with files:
        for entry in files:
            key = entry.name[: -len(TRANSCRIPT_SUFFIX)]
            if (
                entry.name.endswith(TRANSCRIPT_SUFFIX)
                and is_session_key(key)
                and entry.is_file(follow_symlinks=False)
            ):
                found[(user, key)] = entry.stat(follow_symlinks=False).st_size
