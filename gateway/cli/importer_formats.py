"""What ``recalld import`` reads: moved to :mod:`gateway.importing`, which the daemon's
``sessions.import`` parses with too (gateway/methods may not import gateway/cli). These names
stay importable from here for the callers that know this module (tests, bench/conversation.py)."""

from __future__ import annotations

from gateway.importing import Conversation, Format, ImportFormatError, Turn, detect, parse

__all__ = ["Conversation", "Format", "ImportFormatError", "Turn", "detect", "parse"]
