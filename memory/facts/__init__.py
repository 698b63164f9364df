"""Remembered facts: durable statements about the user, saved by the model or the user,
de-duplicated exactly and semantically, versioned, and picked for a prompt (docs/memory.md)."""

from __future__ import annotations

from .block import BLOCK_CLOSE, BLOCK_OPEN, BlockFilter, FactBlock, MalformedBlock, parse_block
from .service import Facts, FactsPage, ScoredFact
from .store import Action, Fact, FactChange, FactStore, normalise, text_hash

__all__ = ["Action", "BLOCK_CLOSE", "BLOCK_OPEN", "BlockFilter", "FactBlock", "MalformedBlock", "parse_block",
           "Fact", "FactChange", "FactStore", "Facts", "FactsPage", "ScoredFact",
           "normalise", "text_hash"]
