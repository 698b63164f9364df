"""Settings of the sessions store: the ``[sessions]`` section of ``config.toml``.

Keys (defaults in brackets):

``fsync`` ["batch"]
    ``"always"``: fsync every append before returning (safest, slowest).
    ``"batch"``: mark the transcript dirty; :meth:`SessionStore.flush` fsyncs it. The gateway
    calls ``flush()`` every ``fsync_interval_s`` and at the end of every run.
    ``"never"``: leave it to the OS (a power cut may lose the last seconds).
``fsync_interval_s`` [1.0]
    How often the gateway calls ``flush()`` under ``"batch"``. The store itself runs no timer.
``max_line_bytes`` [1048576]
    Largest transcript line (one message, or the header with its system prompt), in bytes of
    UTF-8 JSON including the newline. Bigger lines are refused before anything is written.
``max_page_size`` [200]
    Largest ``limit`` accepted by ``list`` and ``history``.
``max_page_bytes`` [8388608]
    Largest ``history`` page, in bytes of its messages' transcript lines: the page stops before
    the message that would pass it (always holding at least one) and its cursor resumes there,
    so one page never builds more than this whatever the messages hold. The gateway uses at
    most a quarter of ``limits.max_reply_bytes``.
``max_context_bytes`` [1048576]
    Most bytes of transcript lines ``recent_messages`` reads for one model context: the newest
    messages are kept whole, and older ones are dropped from the first that would pass the cap
    (the newest message is always kept). Far above the prompt's own history budget
    (``chat.max_context_tokens``); it stops a session of huge messages from being read whole
    for every reply.
``max_title_chars`` [200]
    Longest session title, in characters.
``max_model_chars`` [200]
    Longest model name stored with a session, in characters.
``max_name_chars`` [128]
    Longest speaker ``name`` on a message, in characters.
``min_free_bytes`` [33554432]
    Free-disk floor: while the file system holding the transcripts has less free space than
    this, creating a session, updating one or appending answers :class:`StorageError` ("disk
    almost full") before anything is written, so the disk never fills up mid-line. 0 disables
    the check. The gateway hands the memory index the same floor for its writes.
``retention_days`` [0]
    Transcripts not updated for this many days are deleted by the gateway's daily sweep; 0 never.

This module only holds values; the gateway's ``load()`` reads TOML and the environment and
builds one of these. ``__post_init__`` still refuses values that could not work, so a mistake
is caught at start with a message that names the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["FsyncPolicy", "SessionsConfig"]

FsyncPolicy = Literal["always", "batch", "never"]

_FSYNC_POLICIES: tuple[str, ...] = ("always", "batch", "never")

# A header with no system prompt is about 200 bytes; anything below this could not even hold
# an ordinary message, so it is surely a typo.
_MIN_LINE_BYTES = 1024


@dataclass(frozen=True, slots=True)
class SessionsConfig:
    """The ``[sessions]`` settings; see the module docstring for each key."""

    fsync: FsyncPolicy = "batch"
    fsync_interval_s: float = 1.0
    max_line_bytes: int = 1_048_576
    max_page_size: int = 200
    max_page_bytes: int = 8 * 1024 * 1024
    max_context_bytes: int = 1_048_576
    max_title_chars: int = 200
    max_model_chars: int = 200
    max_name_chars: int = 128
    min_free_bytes: int = 32 * 1024 * 1024
    # Whole transcripts not updated for this many days are deleted by the gateway's daily
    # retention sweep. 0 (the default): never.
    retention_days: int = 0

    def __post_init__(self) -> None:
        if self.fsync not in _FSYNC_POLICIES:
            raise ValueError(
                f"sessions.fsync must be one of {', '.join(_FSYNC_POLICIES)}, not {self.fsync!r}"
            )
        if not self.fsync_interval_s > 0:
            raise ValueError("sessions.fsync_interval_s must be greater than 0")
        if self.max_line_bytes < _MIN_LINE_BYTES:
            raise ValueError(f"sessions.max_line_bytes must be at least {_MIN_LINE_BYTES}")
        if self.min_free_bytes < 0:
            raise ValueError("sessions.min_free_bytes must be at least 0")
        if self.retention_days < 0:
            raise ValueError("sessions.retention_days must not be negative (0: never)")
        for key in ("max_page_size", "max_page_bytes", "max_context_bytes", "max_title_chars",
                    "max_model_chars", "max_name_chars"):
            if getattr(self, key) < 1:
                raise ValueError(f"sessions.{key} must be at least 1")
