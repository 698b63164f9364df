"""One-time sign-in codes (issue 22 N7): ``auth.code`` issues one to an authenticated user,
``auth {code}`` redeems it once on another connection for that user and its token, and a used,
expired or unknown code answers -32001."""

from __future__ import annotations

from collections.abc import Callable

from websockets.asyncio.client import connect

from gateway.auth import MAX_CODES_PER_USER, SignInCodes
from gateway.client import Client
from gateway.config import Config
from tests.conftest import running

ALICE = "alice-token-0123456789abcdefghij"
BOB = "bob-token-0123456789abcdefghijkl"
USERS = [{"name": "alice", "token": ALICE}, {"name": "bob", "token": BOB}]


async def test_a_code_signs_in_once_as_its_user(config_factory: Callable[..., Config]) -> None:
    """Alice's code authenticates a fresh connection as alice and returns her token once; the
    same code then answers -32001 saying it was used or expired, on any connection."""
    async with running(config_factory(auth={"users": USERS, "token": None})) as app, \
            Client.connect(app.url, ALICE) as alice:
        mine = (await alice.call("sessions.create"))["sessionKey"]
        issued = await alice.call("auth.code")
        assert issued["expiresInS"] == app.config.auth.code_ttl_s
        assert ALICE not in issued["code"] and len(issued["code"]) >= 32
        async with connect(app.url) as ws:
            page = Client(ws)
            reply = await page.call("auth", {"code": issued["code"]})
            assert (reply["user"], reply["token"]) == ("alice", ALICE)
            assert ([s["sessionKey"] for s in (await page.call("sessions.list"))["sessions"]]
                    == [mine])
        async with connect(app.url) as ws:
            again = await Client(ws).request("auth", {"code": issued["code"]})
        assert again["error"]["code"] == -32001
        assert "already used or has expired" in again["error"]["message"]
        assert "recalld open" in again["error"]["message"]


async def test_a_token_reply_carries_no_token(client: Client) -> None:
    """`auth {token}` answers as before, without a token; neither or both of token and code
    is -32602."""
    from tests.conftest import TOKEN

    assert "token" not in await client.call("auth", {"token": TOKEN})
    assert (await client.request("auth", {}))["error"]["code"] == -32602
    code = (await client.call("auth.code"))["code"]
    assert (await client.request("auth", {"token": TOKEN, "code": code}))["error"]["code"] == -32602


async def test_codes_need_an_authenticated_connection_and_unknown_codes_fail(
    config_factory: Callable[..., Config]
) -> None:
    """An unauthenticated connection cannot ask for a code, and a made-up code is refused."""
    async with running(config_factory()) as app, connect(app.url) as ws:
        anon = Client(ws)
        assert (await anon.request("auth.code"))["error"]["code"] == -32001
        made_up = await anon.request("auth", {"code": "x" * 43})
        assert made_up["error"]["code"] == -32001


def test_codes_expire_and_are_bounded_per_user() -> None:
    """A code past its ttl is refused; a user holding MAX_CODES_PER_USER codes who asks for
    another loses their oldest, and other users' codes are untouched."""
    now = [100.0]
    codes = SignInCodes(30.0, clock=lambda: now[0])
    late = codes.issue("alice")
    now[0] += 30.0
    assert codes.redeem(late) is None
    bobs = codes.issue("bob")
    alices = [codes.issue("alice") for _ in range(MAX_CODES_PER_USER + 1)]
    assert len(codes) == MAX_CODES_PER_USER + 1
    assert codes.redeem(alices[0]) is None
    assert [codes.redeem(c) for c in alices[1:]] == ["alice"] * MAX_CODES_PER_USER
    assert codes.redeem(bobs) == "bob"
    assert len(codes) == 0


def test_wrong_codes_count_as_failures_and_a_lockout_spares_right_ones() -> None:
    """Wrong codes count toward the address's lockout like wrong tokens; once locked out, a
    wrong code is refused with the time left, and a right code still signs in, once."""
    from gateway.auth import Authenticator
    from gateway.config import AuthConfig

    auth = Authenticator(AuthConfig(token=ALICE, max_failures=2))
    code = auth.codes.issue("default")
    assert auth.redeem_code("wrong", "127.0.0.1").user is None
    locked = auth.redeem_code("wrong-again", "127.0.0.2")
    assert locked.user is None and locked.retry_after_s > 0
    assert auth.redeem_code(code, "127.0.0.1").user == "default"
    assert auth.redeem_code(code, "127.0.0.1").user is None
    assert auth.token_of("default") == ALICE
