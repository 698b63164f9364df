"""Remembered facts: durable statements about the user, saved by the model or the user,
de-duplicated exactly and semantically, versioned, and picked for a prompt (docs/memory.md).

The rules (:mod:`.rules`, :mod:`.service`) serve both backends; each backend's fact store lives
in its folder (``memory.sqlite.facts``, ``memory.pg.facts``)."""

from __future__ import annotations

from .block import BLOCK_CLOSE, BLOCK_OPEN, BlockFilter, FactBlock, MalformedBlock, parse_block
from .rules import normalise, text_hash
from .service import Facts
from .values import Action, Fact, FactChange, FactsPage, ScoredFact

__all__ = ["Action", "BLOCK_CLOSE", "BLOCK_OPEN", "BlockFilter", "FactBlock", "MalformedBlock",
           "parse_block", "Fact", "FactChange", "Facts", "FactsPage", "ScoredFact",
           "normalise", "text_hash"]
