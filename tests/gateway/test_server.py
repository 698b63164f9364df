"""The real server on port 0 with a real websockets client: transport, auth and limits."""

from __future__ import annotations

import asyncio
import ssl
import urllib.request
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from gateway.app import App
from gateway.client import Client
from gateway.config import Config
from tests.conftest import TOKEN, running


async def recv_json(ws: Any, timeout: float = 5.0) -> Any:
    async with asyncio.timeout(timeout):
        return orjson.loads(await ws.recv())


async def test_health_over_bearer_header(client: Client) -> None:
    """A client with a Bearer header can call gateway.health at once."""
    result = await client.call("gateway.health")
    assert result["status"] == "ok" and result["connections"] >= 1
    assert {"version", "uptimeS", "memory"} <= set(result)


async def test_first_frame_auth_then_wscat_style_request(app: App) -> None:
    """The first-frame auth object is answered in kind; then frames without "jsonrpc" work."""
    async with connect(app.url) as ws:
        await ws.send(orjson.dumps({"type": "auth", "token": TOKEN}).decode())
        reply = await recv_json(ws)
        assert reply["type"] == "auth" and reply["ok"] is True and reply["user"] == "default"
        assert reply["server"]["name"] == "recalld"
        await ws.send('{"id":1,"method":"gateway.health"}')
        reply = await recv_json(ws)
        assert reply["jsonrpc"] == "2.0" and reply["result"]["status"] == "ok"


async def test_first_frame_auth_failure_answers_then_closes_1008(app: App) -> None:
    """A wrong token in the auth frame gets ok:false and the connection closes with 1008."""
    async with connect(app.url) as ws:
        await ws.send(orjson.dumps({"type": "auth", "token": "wrong"}).decode())
        reply = await recv_json(ws)
        assert reply == {"type": "auth", "ok": False, "error": "invalid token"}
        with pytest.raises(ConnectionClosed):
            await recv_json(ws)
        assert ws.close_code == 1008


async def test_methods_before_auth_get_32001_then_auth_method_works(app: App) -> None:
    """Before auth every method answers -32001; the auth method then authenticates."""
    async with connect(app.url) as ws:
        await ws.send('{"jsonrpc":"2.0","id":1,"method":"sessions.list"}')
        assert (await recv_json(ws))["error"]["code"] == -32001
        await ws.send(orjson.dumps({"id": 2, "method": "auth",
                                    "params": {"token": TOKEN}}).decode())
        result = (await recv_json(ws))["result"]
        assert result["user"] == "default" and result["protocol"] == 1
        await ws.send('{"id":3,"method":"sessions.list"}')
        assert "result" in await recv_json(ws)


async def test_wrong_bearer_token_is_http_401(app: App) -> None:
    """A wrong Bearer token is refused at the upgrade with HTTP 401."""
    with pytest.raises(InvalidStatus) as info:
        async with connect(app.url, additional_headers={"Authorization": "Bearer nope"}):
            pass
    assert info.value.response.status_code == 401


async def test_token_in_query_string_is_ignored(app: App) -> None:
    """A token in the URL query authenticates nothing."""
    async with connect(app.url + f"?token={TOKEN}") as ws:
        await ws.send('{"id":1,"method":"gateway.health"}')
        assert (await recv_json(ws))["error"]["code"] == -32001


async def test_auth_timeout_closes_1008(config_factory: Callable[..., Config]) -> None:
    """A connection that does not authenticate within auth.timeout_s is closed 1008."""
    async with running(config_factory(auth={"timeout_s": 0.3})) as app:
        async with connect(app.url) as ws:
            with pytest.raises(ConnectionClosed):
                await recv_json(ws, timeout=5)
            assert ws.close_code == 1008


async def test_preauth_frames_are_capped(app: App) -> None:
    """Before auth a frame larger than auth.preauth_max_size closes the connection 1009."""
    async with connect(app.url, max_size=None) as ws:
        await ws.send("x" * (70 * 1024))
        with pytest.raises(ConnectionClosed):
            await recv_json(ws)
        assert ws.close_code == 1009


async def test_failed_attempts_lock_the_address_out(config_factory: Callable[..., Config]) -> None:
    """Past auth.max_failures the address is locked: -32004, then HTTP 429 even for the
    right token."""
    async with running(config_factory(auth={"max_failures": 3})) as app:
        async with connect(app.url) as ws:
            codes = []
            for i in range(4):
                await ws.send(orjson.dumps({"id": i, "method": "auth",
                                            "params": {"token": "bad"}}).decode())
                codes.append((await recv_json(ws))["error"]["code"])
            assert codes[:2] == [-32001, -32001] and codes[3] == -32004
        with pytest.raises(InvalidStatus) as info:
            async with connect(app.url, additional_headers={"Authorization": f"Bearer {TOKEN}"}):
                pass
        assert info.value.response.status_code == 429
        assert int(info.value.response.headers["Retry-After"]) > 0


def test_lockout_is_per_address() -> None:
    """A locked-out address does not lock out another one (loopback, all one bucket, aside)."""
    from gateway.auth import Authenticator
    from gateway.config import AuthConfig

    auth = Authenticator(AuthConfig(token=TOKEN, max_failures=2))
    for _ in range(3):
        assert not auth.check("bad", "192.0.2.1").ok
    assert auth.check(TOKEN, "192.0.2.1").retry_after_s > 0
    assert auth.check(TOKEN, "192.0.2.2").user == "default"


async def test_cross_site_origin_is_403(app: App) -> None:
    """A browser Origin that is not allowed gets HTTP 403 before any WebSocket exists."""
    with pytest.raises(InvalidStatus) as info:
        async with connect(app.url, origin="http://evil.example"):  # type: ignore[arg-type]
            pass
    assert info.value.response.status_code == 403


async def test_own_origin_is_allowed(app: App) -> None:
    """The gateway's own localhost origin may connect."""
    origin = f"http://localhost:{app.server.port}"
    async with connect(app.url, origin=origin,  # type: ignore[arg-type]
                       additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        await ws.send('{"id":1,"method":"gateway.health"}')
        assert "result" in await recv_json(ws)


async def test_rebinding_host_is_421(app: App) -> None:
    """A Host header naming a foreign DNS name (DNS rebinding) gets HTTP 421."""
    url = f"ws://attacker.example:{app.server.port}/"
    with pytest.raises(InvalidStatus) as info:
        async with connect(url, host="127.0.0.1", port=app.server.port):
            pass
    assert info.value.response.status_code == 421


async def test_healthz_is_plain_http_without_details(app: App) -> None:
    """GET /healthz answers 200 "ok" over plain HTTP, no auth, no details."""
    url = f"http://127.0.0.1:{app.server.port}/healthz"
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
    assert body == b"ok\n"


async def test_oversize_frame_closes_1009_and_server_keeps_serving(
        config_factory: Callable[..., Config]) -> None:
    """A frame over server.max_size closes that connection 1009; others are unaffected."""
    async with running(config_factory(server={"max_size": 64 * 1024})) as app:
        async with Client.connect(app.url, TOKEN) as other:
            async with connect(app.url,
                               additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
                await ws.send('{"id":1,"method":"gateway.health","params":{"x":"'
                              + "a" * 70000 + '"}}')
                with pytest.raises(ConnectionClosed):
                    await recv_json(ws)
                assert ws.close_code == 1009
            assert (await other.call("gateway.health"))["status"] == "ok"


async def test_binary_frames_get_a_clear_error(client: Client) -> None:
    """A binary frame is answered -32600 saying text frames are required."""
    await client.ws.send(b'{"id":1,"method":"gateway.health"}')
    event = await client.next_event()
    assert event["error"]["code"] == -32600 and "text" in event["error"]["message"]


async def test_rpc_discover_lists_every_v1_method(client: Client) -> None:
    """rpc.discover is an OpenRPC document generated from the registry."""
    doc = await client.call("rpc.discover")
    names = {m["name"] for m in doc["methods"]}
    assert doc["openrpc"].startswith("1.")
    assert {"auth", "gateway.health", "sessions.create", "sessions.list", "sessions.get",
            "sessions.history", "sessions.delete", "chat.send", "chat.abort", "memory.search",
            "memory.status", "memory.reindex", "rpc.discover"} <= names
    search = next(m for m in doc["methods"] if m["name"] == "memory.search")
    k = next(p for p in search["params"] if p["name"] == "k")
    assert k["schema"]["oneOf"][0] == {"type": "integer", "minimum": 1, "maximum": 50}


async def test_several_users_map_to_their_tokens(config_factory: Callable[..., Config]) -> None:
    """[[auth.users]] tokens authenticate as their own user names."""
    users = [{"name": "alice", "token": "alice-token-0123456789"},
             {"name": "bob", "token": "bob-token-0123456789xx"}]
    cfg = config_factory(auth={"users": users, "token": None})
    async with running(cfg) as app:
        async with connect(app.url) as ws:
            await ws.send(orjson.dumps({"type": "auth", "token": users[1]["token"]}).decode())
            assert (await recv_json(ws))["user"] == "bob"


async def test_tls_round_trip(config_factory: Callable[..., Config], tmp_path: Any) -> None:
    """With tls.cert/tls.key the gateway speaks wss:// and a client trusting the CA connects."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    async with running(config_factory(tls={"cert": str(cert_path), "key": str(key_path)})) as app:
        assert app.url.startswith("wss://")
        ctx = ssl.create_default_context()
        ca.configure_trust(ctx)
        async with Client.connect(app.url, TOKEN, ssl_context=ctx) as c:
            assert (await c.call("gateway.health"))["status"] == "ok"


async def test_generated_token_file_is_private(config_factory: Callable[..., Config]) -> None:
    """With no token configured, the first start writes <data>/token with mode 0600 and it works."""
    cfg = config_factory(auth={"token": None})
    async with running(cfg) as app:
        path = cfg.data_dir / "token"
        assert path.stat().st_mode & 0o777 == 0o600
        async with Client.connect(app.url, path.read_text().strip()) as c:
            assert (await c.call("gateway.health"))["status"] == "ok"


async def test_inflight_limit_answers_32004(
    config_factory: Callable[..., Config], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past limits.max_inflight concurrent requests on one connection, extras get -32004 (inline
    ones still run)."""
    async with running(config_factory(limits={"max_inflight": 1})) as app:
        gate = asyncio.Event()

        async def slow(*_: Any) -> dict[str, Any]:
            await gate.wait()
            return {}

        assert app.memory is not None
        monkeypatch.setattr(app.memory.service, "status", slow)
        async with Client.connect(app.url, TOKEN) as c:
            first = asyncio.create_task(c.request("memory.status"))
            await asyncio.sleep(0.1)
            second = await c.request("sessions.list")
            assert second["error"]["code"] == -32004 and "retryAfterMs" in second["error"]["data"]
            assert (await c.call("gateway.health"))["status"] == "ok"
            gate.set()
            assert "result" in await first


async def test_second_daemon_on_the_same_data_dir_is_refused(
        config_factory: Callable[..., Config]) -> None:
    """A second gateway on a data dir in use refuses to start; after the first closes it may."""
    from gateway.app import DataDirBusy

    cfg = config_factory()
    async with running(cfg):
        with pytest.raises(DataDirBusy, match="already using"):
            async with running(cfg):
                pass
    async with running(cfg) as again:
        assert again.url
