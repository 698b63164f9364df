"""Episodic memory: dated summaries of what conversations discussed, decided or did (docs/memory.md)."""

from __future__ import annotations

from .service import Episodes, ScoredEpisode
from .store import Episode, EpisodeDraft, EpisodeJob, EpisodeStore, EpisodeWire, dated
from .writer import SUMMARY_INSTRUCTIONS, EpisodeWriter, Summarizer

__all__ = ["SUMMARY_INSTRUCTIONS", "Episode", "EpisodeDraft", "EpisodeJob", "EpisodeStore", "EpisodeWire",
           "EpisodeWriter", "Episodes", "ScoredEpisode", "Summarizer", "dated"]
