"""Episodic memory: dated summaries of what conversations discussed, decided or did
(docs/memory.md).

The writer (``writer.py``) stands above the Protocols of ``memory.protocols``, which name this
package's values, so it is imported from its module, not from here."""

from __future__ import annotations

from .service import Episodes
from .values import Episode, EpisodeDraft, EpisodeJob, ScoredEpisode, dated

__all__ = ["Episode", "EpisodeDraft", "EpisodeJob", "Episodes", "ScoredEpisode",
           "dated"]
