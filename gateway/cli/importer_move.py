"""``recalld import --from <data dir>``: move a single-node data dir's sessions (JSONL
transcripts) into the configured store — PostgreSQL, to go from one node to several.

* **Same keys**: each session keeps its key, user, title, system prompt, model, incognito flag
  and creation time; each message its role, content, time, run id, name and extra keys (a new
  message id: ids are made by the store that writes).
* **Idempotent and resumable**: a session already in the target with its first N messages gets
  the rest appended, one with all of them gets nothing; the same command run again after a
  stop finishes the work and a third run writes nothing.
* **The source is read, not moved**: its transcripts stay as they were (opening it repairs a
  torn tail, as the daemon would at start). Do not run a daemon on it meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gateway.storage import StorageConfig, open_session_store
from sessions import (
    DEFAULT_TITLE,
    MESSAGE_ROLES,
    ForwardReader,
    InvalidSessionInput,
    SessionNotFound,
    SessionsConfig,
    SessionStore,
    plain_title,
    scan_transcripts,
    sessions_root,
    transcript_file,
)

__all__ = ["MoveError", "MoveReport", "move_data_dir"]

Progress = Callable[[int, int, int, int], None]  # sessions done/total, messages written, 0


class MoveError(Exception):
    """A message the target refuses (PostgreSQL text cannot hold U+0000): the move stops there,
    so that a rerun after fixing it resumes at the same message."""


@dataclass(frozen=True, slots=True)
class MoveReport:
    sessions: int
    created: int      # new in the target
    resumed: int      # had a prefix of their messages in the target, got the rest
    unchanged: int    # already complete in the target
    unreadable: int   # transcripts whose header cannot be read: left where they are
    messages: int     # messages written
    seconds: float


def move_data_dir(source: Path, storage: StorageConfig, target_dir: Path, config: SessionsConfig,
                  progress: Progress | None = None) -> MoveReport:
    """Copy every session of the data dir ``source`` into the store ``storage`` names (blocking)."""
    started = time.perf_counter()
    found = sorted(scan_transcripts(sessions_root(source)))
    next_key: list[str] = []
    created = resumed = unchanged = unreadable = written = 0
    with SessionStore(source, config) as src, \
            open_session_store(storage, target_dir, config,
                               key_factory=lambda: next_key.pop()) as dst:
        for done, (user, key) in enumerate(found, 1):
            try:
                meta = src.get(user, key)
            except SessionNotFound:
                unreadable += 1
                continue
            # A title written before the store refused control characters is cleaned, as an
            # import cleans one, rather than stopping the move at a session nobody can fix.
            title = plain_title(meta.title) or DEFAULT_TITLE
            try:
                there = dst.get(user, key)
                have = there.message_count
                if (there.title, there.system_prompt) != (title, meta.system_prompt):
                    dst.update(user, key, title=title, system_prompt=meta.system_prompt)
            except SessionNotFound:
                next_key.append(key)
                dst.create(user, title=title, system_prompt=meta.system_prompt, model=meta.model,
                           created_at=meta.created_at, memory=meta.memory)
                have = -1
            count = 0
            for entry in ForwardReader(transcript_file(sessions_root(source), user, key)):
                m = entry.message
                if m.role not in MESSAGE_ROLES:
                    continue  # an old role the store no longer
                              # writes: the target would refuse it too
                count += 1
                if count <= have:
                    continue
                try:
                    dst.append_message(user, key, role=m.role, content=m.content, run_id=m.run_id,
                                       name=m.name, ts=m.ts, extra=m.extra or None)
                except InvalidSessionInput as exc:
                    raise MoveError(f"session {key} of {user}, transcript line {entry.line}: "
                                    f"{exc.field}: {exc.reason}") from exc
                written += 1
            if have == -1:
                created += 1
            elif count > have:
                resumed += 1
            else:
                unchanged += 1
            if progress is not None:
                progress(done, len(found), written, 0)
        dst.flush()
    return MoveReport(len(found), created, resumed, unchanged, unreadable, written,
                      time.perf_counter() - started)
