"""The reply frames HeldWrites builds itself (gateway.transport.writes.text_frame) are the
bytes websockets would have written, at every length encoding, and reach a client intact."""

from __future__ import annotations

import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.frames import Frame, Opcode

from gateway.app import App
from gateway.transport.writes import HeldWrites, text_frame
from tests.conftest import TOKEN

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize("size", [0, 1, 125, 126, 127, 65535, 65536, 70000])
def test_text_frame_is_what_websockets_serializes_for_a_server(size: int) -> None:
    """Each of the three payload length encodings (7 bits, 16 bits, 64 bits) and their edges
    gives the same bytes as websockets' own unmasked serialisation without extensions."""
    payload = b"x" * size
    assert text_frame(payload) == Frame(Opcode.TEXT, payload).serialize(mask=False, extensions=[])


async def test_the_protocol_internals_the_frames_rely_on_are_there(app: App) -> None:
    """send_reply queues its frame on the protocol's ``writes`` only when it has no extensions,
    no debug logging and no fragmented message open; each attribute exists with that shape, so
    the connection takes the direct way, and a long reply (an extended length) arrives whole."""
    async with connect(app.url, additional_headers=AUTH, compression=None) as ws:
        await ws.send(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "rpc.discover"}),
                      text=True)
        reply = orjson.loads(await ws.recv())
        assert reply["id"] == 1 and "methods" in reply["result"]
        (conn,) = app.server.connections
        server_ws = conn.ws
        assert isinstance(server_ws, HeldWrites) and server_ws.can_hold_bursts
        protocol = server_ws.protocol
        assert isinstance(protocol.writes, list) and protocol.writes == []
        assert list(protocol.extensions) == [] and protocol.debug is False
        assert protocol.expect_continuation_frame is False
