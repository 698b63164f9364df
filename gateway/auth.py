"""Tokens, users, and the failed-attempt limiter. No sockets here.

* Every configured token maps to a user (``[[auth.users]]``); a single ``auth.token`` (or
  ``RECALLD_TOKEN``, or the generated token file) maps to user ``default``.
* Comparison is constant-time against every token, so timing says nothing about which
  token, or which prefix, was close.
* Tokens are never logged; :func:`gateway.logs.token_fingerprint` is.
* Failed attempts are counted per *bucket* in a sliding window; past ``max_failures`` the
  bucket is locked out for ``lockout_s``. A bucket is one IPv4 address, one IPv6 /64 (one
  host holds a whole /64), or all of loopback together (127.0.0.0/8 and ::1: any local
  process can pick any of 2^24 loopback addresses, so per-address counting let 100 of them
  guess 100 times as often). Loopback is limited like any bucket: a browser page on any site
  can reach 127.0.0.1.
* Failures from every bucket together are limited too (``global_max_failures`` per
  ``failure_window_s``): past it every bucket is locked out for ``lockout_s``, so guesses
  spread over many addresses gain nothing.
* A lockout refuses wrong tokens and *weak* right ones (under :data:`STRONG_TOKEN_CHARS`
  characters), but never a strong right token: a strong token cannot be guessed, so the
  lockout protects nothing there, and refusing it would let any local process lock the owner
  out with ten bad tokens. A weak configured token is named (by user, never by value) in a
  warning at start.
* One-time sign-in codes (:class:`SignInCodes`, the ``auth.code`` method) let ``recalld open``
  hand a browser something other than the token: random, single use, valid ``auth.code_ttl_s``
  seconds, kept in this process's memory only, at most :data:`MAX_CODES_PER_USER` per user.
  Redeeming one goes through the same failure limiter as a token.
* Client tokens (:class:`ClientTokens`, ``recalld token add NAME``) let a user's other clients
  (an MCP agent, a phone) sign in as that user under their own name, each revocable alone and
  optionally read-only. Only their SHA-256 is kept, in ``<data dir>/clients.json`` (0600,
  replaced atomically); the daemon re-reads that file when it changes, so a token added or
  revoked takes effect without a restart.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import ipaddress
import json
import os
import re
import secrets
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gateway.config import AuthConfig

__all__ = [
    "MAX_CODES_PER_USER", "STRONG_TOKEN_CHARS", "Authenticator", "ClientToken", "ClientTokenError",
    "ClientTokens", "FailureLimiter", "SignInCodes", "bucket_of", "clients_path",
    "load_or_create_token", "rotate_token", "token_path",
]

DEFAULT_USER = "default"
# A token at least this long is never locked out (see the module docstring); a configured one
# shorter than this gets a warning at start. The generated token has 43 characters.
STRONG_TOKEN_CHARS = 32
LOOPBACK_BUCKET = "loopback"
# Past this many tracked buckets, expired entries are dropped on the next failure.
_PRUNE_AT = 1_000
# Unredeemed sign-in codes one user may hold; a further one replaces that user's oldest, so
# memory stays bounded and one user's requests never invalidate another's codes.
MAX_CODES_PER_USER = 8


def token_path(data_dir: Path) -> Path:
    return data_dir / "token"


def clients_path(data_dir: Path) -> Path:
    """Where client tokens are kept (their hashes only), next to the generated token."""
    return data_dir / "clients.json"


def _write_token(path: Path, token: str) -> None:
    _write_private(path, token + "\n")


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    # Created 0600 from the start: never a moment where another user could read it.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
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


# A client's name: what `recalld token list` shows and a saved fact records ("added by claude").
_CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_CLIENTS_VERSION = 1


class ClientTokenError(Exception):
    """A client name refused, unknown or taken, or an unreadable clients file; the message is
    written for the person at the CLI."""


@dataclass(frozen=True, slots=True)
class ClientToken:
    """One client's token, as kept: its SHA-256, never the token."""

    name: str
    user: str
    read_only: bool
    created: str  # ISO 8601, UTC
    digest: bytes


def _read_clients(path: Path) -> tuple[ClientToken, ...]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return ()
    except (OSError, ValueError) as exc:
        raise ClientTokenError(f"{path}: unreadable ({exc})") from exc
    try:
        if data.get("version") != _CLIENTS_VERSION:
            raise ClientTokenError(f"{path}: unknown version {data.get('version')!r}")
        return tuple(ClientToken(str(t["name"]), str(t["user"]), bool(t["readOnly"]),
                                 str(t["created"]), bytes.fromhex(t["sha256"]))
                     for t in data["tokens"])
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ClientTokenError(f"{path}: malformed ({exc!r})") from exc


def _write_clients(path: Path, tokens: tuple[ClientToken, ...]) -> None:
    entries = [{"name": t.name, "user": t.user, "readOnly": t.read_only, "created": t.created,
                "sha256": t.digest.hex()} for t in tokens]
    _write_private(path,
                   json.dumps({"version": _CLIENTS_VERSION, "tokens": entries}, indent=2) + "\n")


class ClientTokens:
    """The client tokens of ``<data dir>/clients.json``, re-read whenever the file changes.

    A stat per sign-in (not per call) is the whole cost of seeing a token added or revoked by
    ``recalld token`` while the daemon runs; the file is replaced atomically, so a reader sees
    the old list or the new one, never half of one. An unreadable file signs nobody in
    (fail closed) until it is fixed; ``recalld token list`` says what is wrong with it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._tokens: tuple[ClientToken, ...] = ()

    def current(self) -> tuple[ClientToken, ...]:
        try:
            st = os.stat(self.path)
        except OSError:
            self._seen, self._tokens = None, ()
            return ()
        seen = (st.st_mtime_ns, st.st_size, st.st_ino)
        if seen != self._seen:
            try:
                self._tokens = _read_clients(self.path)
            except ClientTokenError:
                self._tokens = ()
            self._seen = seen
        return self._tokens

    def listed(self) -> tuple[ClientToken, ...]:
        """Every client token, oldest first; raises :class:`ClientTokenError` for a bad file."""
        return _read_clients(self.path)

    def add(self, name: str, *, user: str = DEFAULT_USER, read_only: bool = False) -> str:
        """Mint a token for client ``name`` of ``user``; returns the token (kept nowhere else)."""
        if not _CLIENT_NAME.fullmatch(name):
            raise ClientTokenError(f"client name {name!r}: use 1-64 letters, digits, '.', '_' or "
                                   "'-', starting with a letter or digit")
        with self._locked():
            tokens = _read_clients(self.path)
            if any(t.name == name for t in tokens):
                raise ClientTokenError(f"a client named {name!r} already has a token; "
                                       f"`recalld token revoke {name}` first")
            token = secrets.token_urlsafe(32)
            created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            _write_clients(self.path,
                           (*tokens, ClientToken(name, user, read_only, created, _digest(token))))
        return token

    def revoke(self, name: str) -> ClientToken:
        with self._locked():
            tokens = _read_clients(self.path)
            gone = next((t for t in tokens if t.name == name), None)
            if gone is None:
                known = ", ".join(t.name for t in tokens) or "none"
                raise ClientTokenError(f"no client named {name!r} (clients: {known})")
            _write_clients(self.path, tuple(t for t in tokens if t is not gone))
        return gone

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # Two `recalld token add` at once must not lose one of the two writes.
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


@dataclass(frozen=True, slots=True)
class Verdict:
    user: str | None
    retry_after_s: float = 0.0
    # The client token's name (None for the user's own token) and whether it may only read.
    client: str | None = None
    read_only: bool = False

    @property
    def ok(self) -> bool:
        return self.user is not None


def bucket_of(address: str) -> str:
    """The failure-counting bucket of a peer address (see the module docstring)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address  # a Unix socket path or an unknown form: itself
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return LOOPBACK_BUCKET
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class FailureLimiter:
    """Sliding-window counts of failures per bucket and in all, with lockouts past the limits."""

    def __init__(
        self,
        max_failures: int,
        window_s: float,
        lockout_s: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        global_max_failures: int | None = None,
    ) -> None:
        self._max = max_failures
        self._window = window_s
        self._lockout = lockout_s
        self._clock = clock
        self._global_max = global_max_failures
        self._failures: dict[str, deque[float]] = {}
        self._locked_until: dict[str, float] = {}
        self._all_failures: deque[float] = deque()
        self._all_locked_until = 0.0

    @property
    def tracked(self) -> int:
        """Buckets with state kept (failures in the window or a lockout): bounded by pruning."""
        return len(self._failures) + len(self._locked_until)

    def locked_for(self, bucket: str) -> float:
        """Seconds of lockout left for ``bucket`` or for everyone (0 when not locked)."""
        now = self._clock()
        left = max(0.0, self._all_locked_until - now)
        until = self._locked_until.get(bucket)
        if until is not None:
            if until <= now:
                del self._locked_until[bucket]
            else:
                left = max(left, until - now)
        return left

    def record_failure(self, bucket: str) -> None:
        now = self._clock()
        q = self._failures.setdefault(bucket, deque())
        q.append(now)
        while q and q[0] <= now - self._window:
            q.popleft()
        if len(q) >= self._max:
            self._locked_until[bucket] = now + self._lockout
            del self._failures[bucket]
        if self._global_max is not None:
            every = self._all_failures
            every.append(now)
            while every and every[0] <= now - self._window:
                every.popleft()
            if len(every) >= self._global_max:
                self._all_locked_until = now + self._lockout
                every.clear()
        self._prune(now)

    def record_success(self, bucket: str) -> None:
        self._failures.pop(bucket, None)

    def _prune(self, now: float) -> None:
        # Bounded memory under a spray of addresses: drop idle and expired entries now and then.
        if len(self._failures) > _PRUNE_AT:
            for key in [k for k, q in self._failures.items()
                        if not q or q[-1] <= now - self._window]:
                del self._failures[key]
        if len(self._locked_until) > _PRUNE_AT:
            for key in [k for k, until in self._locked_until.items() if until <= now]:
                del self._locked_until[key]


@dataclass(frozen=True, slots=True)
class _Code:
    user: str
    expires: float


class SignInCodes:
    """One-time sign-in codes: issued to a user, redeemed once for that user, expiring."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        # Keyed by the code's SHA-256, so a lookup's timing says nothing about a code's prefix.
        self._codes: dict[bytes, _Code] = {}

    def __len__(self) -> int:
        return len(self._codes)

    def issue(self, user: str) -> str:
        now = self._clock()
        self._drop_expired(now)
        mine = [k for k, c in self._codes.items() if c.user == user]
        for key in mine[: max(0, len(mine) - MAX_CODES_PER_USER + 1)]:
            del self._codes[key]  # dicts keep insertion order: these are the oldest
        code = secrets.token_urlsafe(32)
        self._codes[_digest(code)] = _Code(user, now + self.ttl_s)
        return code

    def redeem(self, code: str) -> str | None:
        """The code's user, once; None for a used, expired or unknown code."""
        found = self._codes.pop(_digest(code), None)
        if found is None or found.expires <= self._clock():
            return None
        return found.user

    def _drop_expired(self, now: float) -> None:
        for key in [k for k, c in self._codes.items() if c.expires <= now]:
            del self._codes[key]


def _digest(code: str) -> bytes:
    return hashlib.sha256(code.encode()).digest()


class Authenticator:
    """Maps tokens to users, in constant time, with the failure limiter in front."""

    def __init__(self, config: AuthConfig, generated_token: str | None = None,
                 clients: ClientTokens | None = None) -> None:
        self.mode = config.mode
        self.clients = clients
        self.codes = SignInCodes(config.code_ttl_s)
        pairs: list[tuple[str, str]] = [(u.token, u.name) for u in config.users]
        if config.token:
            pairs.append((config.token, DEFAULT_USER))
        if not pairs and generated_token:
            pairs.append((generated_token, DEFAULT_USER))
        self._pairs = [(t.encode(), user) for t, user in pairs]
        # Users whose configured token is weak (the warning at start names them).
        self.weak_token_users = tuple(sorted({user for t, user in pairs
                                              if len(t) < STRONG_TOKEN_CHARS}))
        self.limiter = FailureLimiter(config.max_failures, config.failure_window_s,
                                      config.lockout_s,
                                      global_max_failures=config.global_max_failures)

    def check(self, token: str | None, address: str) -> Verdict:
        """Verdict for a token presented from ``address``; counts failures."""
        if self.mode == "none":
            return Verdict(DEFAULT_USER)
        bucket = bucket_of(address)
        presented = token or ""
        found = self._match(presented)
        locked = self.limiter.locked_for(bucket)
        if locked:
            # Wrong tokens are not counted while locked: the lockout is already running.
            if found.user is not None and len(presented) >= STRONG_TOKEN_CHARS:
                return found
            return Verdict(None, locked)
        if found.user is None:
            self.limiter.record_failure(bucket)
            return Verdict(None, self.limiter.locked_for(bucket))
        self.limiter.record_success(bucket)
        return found

    def redeem_code(self, code: str, address: str) -> Verdict:
        """Verdict for a sign-in code presented from ``address``: its user, once. A wrong or
        spent code counts as a failure; a lockout never refuses a right code, which is as
        unguessable as a strong token (43 random characters)."""
        bucket = bucket_of(address)
        user = self.codes.redeem(code)
        locked = self.limiter.locked_for(bucket)
        if user is not None:
            if not locked:
                self.limiter.record_success(bucket)
            return Verdict(user)
        if locked:
            return Verdict(None, locked)
        self.limiter.record_failure(bucket)
        return Verdict(None, self.limiter.locked_for(bucket))

    def token_of(self, user: str) -> str | None:
        """The token that signs in as ``user`` (what a redeemed code hands the page); None
        without token authentication."""
        if self.mode == "none":
            return None
        return next((t.decode() for t, u in self._pairs if u == user), None)

    def _match(self, token: str) -> Verdict:
        presented = token.encode()
        found = Verdict(None)
        # Compare against every token, never stopping early, so timing reveals nothing.
        for candidate, user in self._pairs:
            if hmac.compare_digest(presented, candidate) and found.user is None:
                found = Verdict(user)
        if self.clients is not None:
            # Client tokens are kept as SHA-256 only: the presented token's digest is compared.
            digest = _digest(token)
            for client in self.clients.current():
                if hmac.compare_digest(digest, client.digest) and found.user is None:
                    found = Verdict(client.user, client=client.name, read_only=client.read_only)
        return found
