"""The trailing memory block of ``memory.facts = "block"``: finding it in a stream, parsing it.

Models without tool calling are asked to end a reply, when they have facts to save or forget,
with one block of this shape (docs/memory.md, "Block mode")::

    <memory_update>
    {"remember": [{"text": "My cat is called Luna", "replaces": 12}], "forget": [7]}
    </memory_update>

Only a *trailing* block counts: the opening tag at the start of a line (or of the reply), then
a closing tag followed by nothing but whitespace up to the end of the reply. Whitespace right
before the opening tag belongs to the block, so stripping it leaves no dangling blank lines.

:class:`BlockFilter` sees the reply's text deltas in order and returns what may be sent on at
once. It holds back only what could still be the start of a block: trailing whitespace, then
a prefix of the opening tag at a line start — or, once the full opening tag has been seen at a
line start, everything from there until the block is disproved (text after its closing tag, or
more than ``max_chars`` held). Ordinary text therefore streams with no delay, and for any
chunking of a reply the text sent on plus the stripped block is the reply itself.

No I/O here: :func:`parse_block` turns the block's body into a :class:`FactBlock` or raises
:class:`MalformedBlock`; the gateway's chat run (``gateway/chat/memory_tools.py``) applies it
through the same ``remember``/``forget`` code as the tools' calls, and logs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

__all__ = ["BLOCK_CLOSE", "BLOCK_OPEN", "BlockFilter", "FactBlock", "MalformedBlock",
           "RememberItem", "parse_block"]

BLOCK_OPEN = "<memory_update>"
BLOCK_CLOSE = "</memory_update>"

_OPEN_AFTER_SPACE = re.compile(r"\s*" + re.escape(BLOCK_OPEN))
_FENCE = re.compile(r"^```[A-Za-z]*\s*\n?(.*?)\n?\s*```$", re.DOTALL)


class MalformedBlock(ValueError):
    """The block is not one JSON object of the documented shape (or was never closed)."""


@dataclass(frozen=True, slots=True)
class RememberItem:
    text: str
    replaces: int | None = None


@dataclass(frozen=True, slots=True)
class FactBlock:
    remember: tuple[RememberItem, ...] = ()
    forget: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Stripped:
    """What :meth:`BlockFilter.finish` found: the text still to send, and the stripped block
    (``region`` is its exact text, whitespace included; ``body`` is None when it was never
    closed)."""

    tail: str
    region: str = ""
    body: str | None = None

    @property
    def found(self) -> bool:
        return bool(self.region)


class BlockFilter:
    """Feed the reply's text in order; send on what :meth:`feed` returns; call :meth:`finish`
    once."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self._held = ""  # text not yet sent on
        self._candidate = False  # _held is whitespace + BLOCK_OPEN + what followed it
        self._sent_any = False  # whether any non-whitespace text has been sent on

    def feed(self, text: str) -> str:
        self._held += text
        out = self._settle()
        if out:
            self._sent_any = True
        return out

    def finish(self) -> Stripped:
        held, self._held = self._held, ""
        if not self._candidate:
            return Stripped(held)  # only whitespace or a partial opening tag: ordinary text
        self._candidate = False
        start = held.index(BLOCK_OPEN) + len(BLOCK_OPEN)
        end = held.find(BLOCK_CLOSE, start)
        return Stripped("", held, held[start:end] if end >= 0 else None)

    def _settle(self) -> str:
        """Send on everything that can no longer be part of a trailing block."""
        out: list[str] = []
        while True:
            if self._candidate:
                released = self._check_candidate()
                if released is None:
                    return "".join(out)
                out.append(released)
                continue
            at_start = not self._sent_any and not "".join(out).strip()
            cut = self._find_open(self._held, at_start)
            if cut is not None:
                out.append(self._held[:cut])
                self._held = self._held[cut:]
                self._candidate = True
                continue
            keep = _hold_length(self._held, at_start)
            split = len(self._held) - keep
            out.append(self._held[:split])
            self._held = self._held[split:]
            return "".join(out)

    def _check_candidate(self) -> str | None:
        """None while the held candidate may still be a trailing block; else the text it
        releases (up to its closing tag, or its opening tag when too long), the rest re-scanned."""
        held = self._held
        open_end = held.index(BLOCK_OPEN) + len(BLOCK_OPEN)
        close = held.find(BLOCK_CLOSE, open_end)
        # The limit applies up to the end of the closing tag, so the outcome never depends on
        # how the reply was chunked.
        if close >= 0 and close + len(BLOCK_CLOSE) <= self.max_chars:
            after = close + len(BLOCK_CLOSE)
            if not held[after:].strip():
                return None
            self._candidate = False
            self._held = held[after:]
            return held[:after]
        if close < 0 and len(held) <= self.max_chars:
            return None
        self._candidate = False  # too long to be a block: it was text that looked like one
        self._held = held[open_end:]
        return held[:open_end]

    @staticmethod
    def _find_open(text: str, at_start: bool) -> int | None:
        """Where the whitespace before the first opening tag at a line start begins, if any."""
        for m in _OPEN_AFTER_SPACE.finditer(text):
            space = text[m.start():m.end() - len(BLOCK_OPEN)]
            if "\n" in space or (at_start and m.start() == 0):
                return m.start()
        return None


def _hold_length(text: str, at_start: bool) -> int:
    """How much of the end of ``text`` could still begin a block: trailing whitespace, plus a
    proper prefix of the opening tag when that prefix sits at a line start."""
    for k in range(min(len(BLOCK_OPEN) - 1, len(text)), 0, -1):
        if text.endswith(BLOCK_OPEN[:k]):
            before = text[:len(text) - k]
            space = len(before) - len(before.rstrip())
            if "\n" in before[len(before) - space:] or (at_start and space == len(before)):
                return k + space
            break  # '<' occurs once in the tag, so no shorter prefix can match as well
    return len(text) - len(text.rstrip())


def parse_block(body: str | None) -> FactBlock:
    """The block's JSON, checked against the documented shape; raises MalformedBlock."""
    if body is None:
        raise MalformedBlock("the block was never closed")
    text = body.strip()
    fenced = _FENCE.match(text)  # models like to wrap JSON in a code fence; allow it
    if fenced:
        text = fenced.group(1).strip()
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise MalformedBlock(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise MalformedBlock("not a JSON object")
    unknown = set(data) - {"remember", "forget"}
    if unknown:
        raise MalformedBlock(f"unknown keys: {sorted(unknown)}")
    remember = data.get("remember", [])
    forget = data.get("forget", [])
    if not isinstance(remember, list) or not isinstance(forget, list):
        raise MalformedBlock("remember and forget must be lists")
    items: list[RememberItem] = []
    for item in remember:
        if isinstance(item, str):
            item = {"text": item}
        if not isinstance(item, dict) or not isinstance(item.get("text"), str) \
                or set(item) - {"text", "replaces"}:
            raise MalformedBlock('each remember entry must be {"text": string, "replaces"?: id}')
        replaces = item.get("replaces")
        if replaces is not None and not _is_id(replaces):
            raise MalformedBlock("replaces must be a fact id")
        items.append(RememberItem(item["text"], replaces))
    if not all(_is_id(i) for i in forget):
        raise MalformedBlock("forget must list fact ids")
    return FactBlock(tuple(items), tuple(forget))


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
