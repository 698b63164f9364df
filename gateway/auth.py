"""Tokens, users, and the failed-attempt limiter. No sockets here.

* Every configured token maps to a user (``[[auth.users]]``); a single ``auth.token`` (or
  ``RECALLD_TOKEN``, or the generated token file) maps to user ``default``.
* Comparison is constant-time against every token, so timing says nothing about which
  token, or which prefix, was close.
* Tokens are never logged; :func:`gateway.logs.token_fingerprint` is.
* Failed attempts are counted per client address in a sliding window; past the limit the
  address is locked out for ``lockout_s`` and even a right token is refused meanwhile.
  Loopback is limited like any address: a browser page on any site can reach 127.0.0.1, and
  a local client that knows the token never fails.
"""

from __future__ import annotations

import hmac
import os
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gateway.config import AuthConfig

__all__ = ["Authenticator", "FailureLimiter", "load_or_create_token", "rotate_token", "token_path"]

DEFAULT_USER = "default"


def token_path(data_dir: Path) -> Path:
    return data_dir / "token"


def _write_token(path: Path, token: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    # Created 0600 from the start: never a moment where another user could read it.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (token + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def load_or_create_token(data_dir: Path) -> tuple[str, bool]:
    """The generated token, created on first use; returns (token, created)."""
    path = token_path(data_dir)
    try:
        token = path.read_text(encoding="utf-8").strip()
        if token:
            return token, False
    except FileNotFoundError:
        pass
    token = secrets.token_urlsafe(32)
    _write_token(path, token)
    return token, True


def rotate_token(data_dir: Path) -> str:
    token = secrets.token_urlsafe(32)
    _write_token(token_path(data_dir), token)
    return token


@dataclass(frozen=True, slots=True)
class Verdict:
    user: str | None
    retry_after_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.user is not None


class FailureLimiter:
    """Sliding-window count of failures per address, with a lockout past the limit."""

    def __init__(
        self,
        max_failures: int,
        window_s: float,
        lockout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max = max_failures
        self._window = window_s
        self._lockout = lockout_s
        self._clock = clock
        self._failures: dict[str, deque[float]] = {}
        self._locked_until: dict[str, float] = {}

    def locked_for(self, address: str) -> float:
        """Seconds of lockout left for ``address`` (0 when not locked)."""
        until = self._locked_until.get(address)
        if until is None:
            return 0.0
        left = until - self._clock()
        if left <= 0:
            del self._locked_until[address]
            return 0.0
        return left

    def record_failure(self, address: str) -> None:
        now = self._clock()
        q = self._failures.setdefault(address, deque())
        q.append(now)
        while q and q[0] <= now - self._window:
            q.popleft()
        if len(q) >= self._max:
            self._locked_until[address] = now + self._lockout
            q.clear()
        self._prune(now)

    def record_success(self, address: str) -> None:
        self._failures.pop(address, None)

    def _prune(self, now: float) -> None:
        # Bounded memory under a spray of addresses: drop idle entries now and then.
        if len(self._failures) > 10_000:
            for addr in [a for a, q in self._failures.items() if not q or q[-1] <= now - self._window]:
                del self._failures[addr]


class Authenticator:
    """Maps tokens to users, in constant time, with the failure limiter in front."""

    def __init__(self, config: AuthConfig, generated_token: str | None = None) -> None:
        self.mode = config.mode
        pairs: list[tuple[str, str]] = [(u.token, u.name) for u in config.users]
        if config.token:
            pairs.append((config.token, DEFAULT_USER))
        if not pairs and generated_token:
            pairs.append((generated_token, DEFAULT_USER))
        self._pairs = [(t.encode(), user) for t, user in pairs]
        self.limiter = FailureLimiter(config.max_failures, config.failure_window_s, config.lockout_s)

    def check(self, token: str | None, address: str) -> Verdict:
        """Verdict for a token presented from ``address``; counts failures."""
        if self.mode == "none":
            return Verdict(DEFAULT_USER)
        locked = self.limiter.locked_for(address)
        if locked:
            return Verdict(None, locked)
        user = self._match(token or "")
        if user is None:
            self.limiter.record_failure(address)
            return Verdict(None, self.limiter.locked_for(address))
        self.limiter.record_success(address)
        return Verdict(user)

    def _match(self, token: str) -> str | None:
        presented = token.encode()
        found: str | None = None
        # Compare against every token, never stopping early, so timing reveals nothing.
        for candidate, user in self._pairs:
            if hmac.compare_digest(presented, candidate) and found is None:
                found = user
        return found
