"""A connection's queue of outgoing frames, with delta coalescing and a byte bound. No I/O.

The server's writer task drains it into the socket; ``websockets`` applies backpressure there
(``write_limit``), so a client that reads slowly makes the queue grow here instead of in the
run that produces events. Consecutive ``chat.delta`` events of one run are merged while they
wait, so a slow client receives fewer, larger deltas and never slows the run. Once more than
``max_bytes`` wait, the next frame reports overflow and the server closes the connection 1008.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from typing import Any

import orjson

__all__ = ["Outbox"]


class _Delta:
    """A ``chat.delta`` notification still open for merging."""

    __slots__ = ("params",)

    def __init__(self, params: Mapping[str, Any]) -> None:
        self.params = dict(params)

    def encode(self) -> bytes:
        return orjson.dumps({"jsonrpc": "2.0", "method": "chat.delta", "params": self.params})


class Outbox:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: deque[bytes | _Delta] = deque()
        self._bytes = 0
        self._ready = asyncio.Event()
        self.overflowed = False
        self.coalesced = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def pending_bytes(self) -> int:
        return self._bytes

    def put(self, frame: bytes) -> bool:
        """Queue an encoded frame; False once the bound is exceeded (the caller closes)."""
        if not self._admit():
            return False
        self._items.append(frame)
        self._grew(len(frame))
        return True

    def put_delta(self, params: Mapping[str, Any]) -> bool:
        """Queue a ``chat.delta``, merging it into the previous one of the same run if waiting."""
        if not self._admit():
            return False
        last = self._items[-1] if self._items else None
        if isinstance(last, _Delta) and last.params.get("runId") == params.get("runId"):
            text = params.get("delta", "")
            # The merged event keeps the first seq, so a client's first delta is still seq 0.
            last.params["delta"] += text
            self.coalesced += 1
            self._grew(len(text.encode()))
            return True
        self._items.append(_Delta(params))
        self._grew(len(params.get("delta", "").encode()) + 100)
        return True

    def _admit(self) -> bool:
        # The bound applies to the backlog a frame would join, not to the frame: a client that
        # keeps up must not be dropped because one chat.final is larger than the bound. Past
        # it nothing more is queued: the connection is closing, and a peer that never reads
        # must not make the queue grow meanwhile. So a queue holds at most max_bytes + 1 frame.
        if self._bytes > self.max_bytes:
            self.overflowed = True
        return not self.overflowed

    def _grew(self, n: int) -> None:
        self._bytes += n
        self._ready.set()

    async def get(self) -> bytes:
        """The next frame to write, waiting for one."""
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        item = self._items.popleft()
        frame = item.encode() if isinstance(item, _Delta) else item
        self._bytes = max(0, self._bytes - len(frame))
        return frame
