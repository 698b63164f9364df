"""Item 9 of issue 10: failed-auth limits that neither 127.0.0.0/8 nor many addresses get
around, that cannot lock out the owner's strong token, and whose state stays bounded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gateway.auth import LOOPBACK_BUCKET, Authenticator, FailureLimiter, bucket_of
from gateway.client import Client
from gateway.config import AuthConfig, AuthUser, Config
from tests.conftest import TOKEN, running
from tests.daemon import Daemon

STRONG = "owner-token-" + "x" * 40


async def _fail(url: str, source: str) -> int:
    with pytest.raises(InvalidStatus) as info:
        async with connect(url, additional_headers={"Authorization": "Bearer wrong-token-guess"},
                           local_addr=(source, 0)):
            pass
    return info.value.response.status_code


async def test_loopback_addresses_share_one_bucket(config_factory: Callable[..., Config]) -> None:
    """Guesses from 127.0.0.2, .3, .4 count together: past max_failures, 127.0.0.5 is locked out
    too."""
    async with running(config_factory(auth={"max_failures": 3})) as app:
        statuses = [await _fail(app.url, f"127.0.0.{i}") for i in (2, 3, 4)]
        assert statuses == [401, 401, 429]  # the third failure locks the bucket
        with pytest.raises(InvalidStatus) as info:
            async with connect(app.url, additional_headers={"Authorization": f"Bearer {TOKEN}"},
                               local_addr=("127.0.0.5", 0)):
                pass
        assert info.value.response.status_code == 429


async def test_a_strong_token_is_never_locked_out(config_factory: Callable[..., Config]) -> None:
    """Any local process can fail on purpose until loopback is locked out, yet the owner's strong
    token still connects; the weak one is refused meanwhile."""
    users = [{"name": "owner", "token": STRONG}, {"name": "weak", "token": "weak-token-0123456789"}]
    async with running(config_factory(auth={"users": users, "token": None,
                                            "max_failures": 3})) as app:
        assert [await _fail(app.url, f"127.0.0.{i}") for i in range(2, 6)][-1] == 429
        async with Client.connect(app.url, STRONG) as owner:
            assert (await owner.call("gateway.health"))["status"] == "ok"
        with pytest.raises(InvalidStatus) as info:
            async with Client.connect(app.url, users[1]["token"]):
                pass
        assert info.value.response.status_code == 429


def test_failures_spread_over_many_addresses_hit_the_global_limit() -> None:
    """A guess from each of many addresses (each under its own limit) trips the global limit,
    after which a new address is refused too, but a strong token is not."""
    auth = Authenticator(AuthConfig(users=(AuthUser("owner", STRONG), AuthUser("weak", "w" * 20)),
                                    max_failures=10, global_max_failures=50))
    verdicts = [auth.check("guess", f"198.51.100.{i}") for i in range(50)]
    assert all(v.retry_after_s == 0 for v in verdicts[:49]) and verdicts[49].retry_after_s > 0
    assert auth.check("w" * 20, "203.0.113.9").retry_after_s > 0
    assert auth.check(STRONG, "203.0.113.9").user == "owner"


def test_buckets() -> None:
    """All of loopback is one bucket (IPv4-mapped too); IPv6 counts per /64; IPv4 per address."""
    assert ({bucket_of(a) for a in ("127.0.0.1", "127.9.8.7", "::1", "::ffff:127.0.0.5")}
            == {LOOPBACK_BUCKET})
    assert bucket_of("2001:db8::1") == bucket_of("2001:db8::ffff:1") != bucket_of("2001:db8:0:1::1")
    assert bucket_of("192.0.2.1") != bucket_of("192.0.2.2")


def test_expired_lockouts_are_pruned() -> None:
    """Lockouts of thousands of buckets are dropped once expired, so memory stays bounded."""
    now = [0.0]
    limiter = FailureLimiter(1, 60.0, 300.0, clock=lambda: now[0])
    for i in range(5000):
        limiter.record_failure(f"10.{i // 250}.{i % 250}.1")
    assert limiter.tracked >= 1000
    now[0] = 1000.0
    limiter.record_failure("192.0.2.77")
    assert limiter.tracked <= 2


@pytest.mark.parametrize(("token", "warned"), [(TOKEN, True), ("s" * 43, False)])
def test_a_weak_configured_token_is_named_at_start(
    tmp_path: Path, token: str, warned: bool
) -> None:
    """A configured token under 32 characters gets one start-up warning naming its user, never
    the token; a strong one gets none."""
    daemon = Daemon(tmp_path / "data", env={"RECALLD_TOKEN": token})
    daemon.stop()
    warnings = [r for r in daemon.lines if r.get("event") == "auth.weak_token"]
    assert [w["user"] for w in warnings] == (["default"] if warned else [])
    assert all(token not in str(r) for r in daemon.lines)
