"""Remembered facts: durable statements about the user, saved by the model or the user,
de-duplicated exactly and semantically, versioned, and picked for a prompt (docs/memory.md)."""

from __future__ import annotations

from .block import BLOCK_CLOSE, BLOCK_OPEN, BlockFilter, FactBlock, MalformedBlock, parse_block
from .service import Facts
from .store import FactStore, normalise, text_hash
from .values import Action, Fact, FactChange, FactsPage, ScoredFact

__all__ = ["Action", "BLOCK_CLOSE", "BLOCK_OPEN", "BlockFilter", "FactBlock", "MalformedBlock", "parse_block",
           "Fact", "FactChange", "FactStore", "Facts", "FactsPage", "ScoredFact",
           "normalise", "text_hash"]
