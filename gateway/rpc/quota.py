"""Per-user quotas on methods, checked by the core before a handler runs. No I/O.

Two kinds, each keyed by (user, method): a *rate* (a bucket of ``per_minute`` calls that
refills continuously, so a burst of that size is allowed after a quiet minute) and a cap on
calls *in flight* at once. Past either, the call answers -32004 with ``retryAfterMs``. Quotas
count per user, not per connection: a client that opens more connections gains nothing.
:class:`ByteRate` is a rate of bytes rather than calls (the chat messages and system prompts a
user writes), taken by the handler that knows the size (:func:`written_size`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import orjson

from gateway.errors import RateLimited

__all__ = ["ByteRate", "Quotas", "written_size"]


def written_size(text: str) -> int:
    """The bytes ``text`` takes in a transcript line: JSON escaping makes a control character
    six bytes, so the raw length would undercount what reaches the disk."""
    try:
        return len(orjson.dumps(text)) - 2
    except orjson.JSONEncodeError:  # a lone surrogate: never written,
                                    # the store refuses it as bad input
        return len(text.encode("utf-8", "surrogatepass"))


@dataclass(slots=True)
class _Bucket:
    tokens: float
    stamp: float


@dataclass(slots=True)
class Quotas:
    """``per_minute``: method -> (calls per user per minute, the setting's name);
    ``in_flight``: method -> (calls per user running at once, the setting's name)."""

    per_minute: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    in_flight: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[tuple[str, str], _Bucket] = field(default_factory=dict)
    _running: dict[tuple[str, str], int] = field(default_factory=dict)

    def limits(self, method: str) -> bool:
        """Whether ``method`` has a quota at all; the core skips :meth:`admit` (a generator
        context manager, a measurable part of a cheap call) for the others."""
        return method in self.per_minute or method in self.in_flight

    @contextmanager
    def admit(self, user: str, method: str) -> Iterator[None]:
        """Hold one of ``user``'s places for ``method`` while the call runs; RateLimited if
        there is none."""
        key = (user, method)
        cap, cap_name = self.in_flight.get(method, (None, ""))
        if cap is not None and self._running.get(key, 0) >= cap:
            raise RateLimited(f"too many {method} calls running at once for this user "
                              f"({cap}, {cap_name})", 200)
        rate = self.per_minute.get(method)
        if rate is not None:
            self._take(key, *rate)
        if cap is None:
            yield
            return
        self._running[key] = self._running.get(key, 0) + 1
        try:
            yield
        finally:
            left = self._running[key] - 1
            if left:
                self._running[key] = left
            else:
                del self._running[key]

    def _take(self, key: tuple[str, str], per_minute: int, name: str) -> None:
        now = self.clock()
        per_s = per_minute / 60.0
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= 10_000:
                self._prune(now)  # before adding: a new bucket is full, so it would go too
            bucket = self._buckets[key] = _Bucket(float(per_minute), now)
        bucket.tokens = min(float(per_minute), bucket.tokens + (now - bucket.stamp) * per_s)
        bucket.stamp = now
        if bucket.tokens < 1.0:
            wait_ms = int((1.0 - bucket.tokens) / per_s * 1000) + 1
            raise RateLimited(
                f"too many {key[1]} calls for this user ({per_minute} a minute, {name})",
                              wait_ms)
        bucket.tokens -= 1.0

    def _prune(self, now: float) -> None:
        # A bucket that has refilled is the same as no bucket: forget it. Each by its own
        # method's rate: methods may have different ones.
        full = []
        for k, b in self._buckets.items():
            per_minute = self.per_minute[k[1]][0]
            if b.tokens + (now - b.stamp) * per_minute / 60.0 >= per_minute:
                full.append(k)
        for k in full:
            del self._buckets[k]


@dataclass(slots=True)
class ByteRate:
    """A bucket of ``per_minute`` bytes per user, refilled continuously; ``name``: the setting
    named in the -32004. Holds at least ``largest`` bytes (the biggest single write allowed),
    so that one write of the largest size always passes after a quiet minute."""

    per_minute: int
    name: str
    largest: int = 0
    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    @property
    def capacity(self) -> int:
        return max(self.per_minute, self.largest)

    def take(self, user: str, size: int) -> None:
        """Count ``size`` bytes against ``user``; RateLimited (nothing counted) if they
        do not fit."""
        now, cap = self.clock(), float(self.capacity)
        per_s = self.per_minute / 60.0
        bucket = self._buckets.get(user)
        if bucket is None:
            if len(self._buckets) >= 10_000:
                self._buckets = {u: b for u, b in self._buckets.items()
                                 if b.tokens + (now - b.stamp) * per_s < cap}
            bucket = self._buckets[user] = _Bucket(cap, now)
        bucket.tokens = min(cap, bucket.tokens + (now - bucket.stamp) * per_s)
        bucket.stamp = now
        if bucket.tokens < size:
            wait_ms = int((size - bucket.tokens) / per_s * 1000) + 1
            raise RateLimited(f"too many message bytes for this user ({self.per_minute} a minute, "
                              f"{self.name}); this message is {size}", wait_ms)
        bucket.tokens -= size

    @contextmanager
    def spending(self, user: str, size: int) -> Iterator[None]:
        """Take ``size`` bytes for a write done inside the block; given back if it raises
        (refused, failed or cancelled: nothing was written)."""
        self.take(user, size)
        try:
            yield
        except BaseException:
            self.refund(user, size)
            raise

    def refund(self, user: str, size: int) -> None:
        """Give back bytes taken for a write that did not happen."""
        bucket = self._buckets.get(user)
        if bucket is not None:
            bucket.tokens = min(float(self.capacity), bucket.tokens + size)
