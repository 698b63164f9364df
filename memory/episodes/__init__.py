"""Episodic memory: dated summaries of what conversations discussed, decided or did (docs/memory.md)."""

from __future__ import annotations

from .service import Episodes, ScoredEpisode
from .store import Episode, EpisodeDraft, EpisodeJob, EpisodeStore, dated

__all__ = ["Episode", "EpisodeDraft", "EpisodeJob", "EpisodeStore", "Episodes", "ScoredEpisode",
           "dated"]
