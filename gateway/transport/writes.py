"""Replies to pipelined requests leave in one socket write per burst, not one per reply.

``websockets`` writes every frame with its own ``transport.write``, which for an idle socket is
a ``send()`` system call and, on loopback, a wake-up of the peer. A client that sends many
requests at once (they arrive in one read) had each of their replies sent that way: on a
2-core machine the system call per reply was the largest single cost of a pipelined cheap
call. :class:`HeldWrites` lets the read loop *hold* the frames of the replies it answers
inline (:attr:`HeldWrites.hold_writes`, :meth:`HeldWrites.end_hold`) and write them
together: at once when no other request waits to be read, else in the event loop's next
iteration (a callback scheduled then), sooner when :data:`HOLD_BYTES` are held. What the
protocol writes outside a hold (events, replies from request tasks, pongs, close frames, the
end of the stream) goes out at once, behind whatever was held, so the order on the wire is
the protocol's.

The read loop hands such a reply to :meth:`HeldWrites.send_reply`, which puts it on the
protocol and the socket without websockets' ``send()`` (in a profile of pipelined
``gateway.health``, ``send()``'s own Python took as long as decoding, running and encoding the
call) whenever ``send()`` could not have waited: open
connection, no fragmented send, socket not paused; otherwise the reply takes ``send()``. Without
extensions (the gateway negotiates none) it also builds the frame's bytes itself
(:func:`text_frame`) and queues them on the protocol, where ``protocol.send_text()`` would have
built a ``Frame`` and serialised it: the same bytes, for a quarter of the cost.

Nothing waits longer than the read loop's current burst: the loop keeps reading only frames
already received, and its first wait lets the callback run. Flow control holds: a reply is
written directly only while the transport is below ``write_limit``, held bytes are at most
:data:`HOLD_BYTES`, and once the transport pauses for a slow reader the next reply takes
``send()``, whose ``drain()`` stops the read loop there.

It overrides ``ServerConnection.send_data`` and reads ``recv_messages.frames``, ``paused`` and
``send_in_progress``, and the protocol's ``writes``, ``extensions``, ``debug`` and
``expect_continuation_frame``, none of them websockets' public API: pyproject.toml pins
websockets to the releases where they have the shape used here (16.0 up to 17.x; on 14 and 15
the queue of received frames is not found and every reply takes ``send()``), and
``tests/gateway/test_held_writes.py`` and ``tests/gateway/test_reply_frames.py`` fail on a
release that changes them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sized
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.protocol import State

__all__ = ["HOLD_BYTES", "HeldWrites", "text_frame"]

# Held frames are written as soon as they reach this size: enough for a burst of small
# replies, small next to write_limit and the socket's buffer.
HOLD_BYTES = 64 * 1024


def text_frame(payload: bytes) -> bytes:
    """An unmasked, unfragmented text frame of ``payload`` without extensions (RFC 6455 5.2):
    what a server's websockets ``Frame(TEXT, payload).serialize()`` writes."""
    n = len(payload)
    if n < 126:
        return bytes((0x81, n)) + payload
    if n < 65536:
        return b"\x81\x7e" + n.to_bytes(2, "big") + payload
    return b"\x81\x7f" + n.to_bytes(8, "big") + payload


class HeldWrites(ServerConnection):
    """A server connection whose read loop can hold reply frames for one write per burst."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Set by the read loop around the send of a reply it answered inline (a plain
        # attribute, not a context manager: it is set for nearly every frame).
        self.hold_writes = False
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._flush_due = False
        self._received: Sized | None = None
        self._direct = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # The queue of frames received and not yet read (websockets' Assembler): where it is
        # not found, every hold ends with a write, as if no request followed.
        self._received = getattr(getattr(self, "recv_messages", None), "frames", None)
        # What send_reply() reads of websockets' Connection; without it, replies use send().
        self._direct = self._received is not None and all(
            hasattr(self, name) for name in ("paused", "send_in_progress")) and all(
            hasattr(self.protocol, name)
            for name in ("writes", "extensions", "debug", "expect_continuation_frame"))

    @property
    def can_hold_bursts(self) -> bool:
        """Whether this connection found websockets' queue of received frames (else every
        reply leaves in its own write, as without a hold)."""
        return self._direct

    def send_reply(self, frame: bytes) -> bool:
        """Send a reply's text frame at once when nothing could make websockets' ``send()``
        wait: the connection is open, no fragmented message is being sent and the socket is
        not paused for a slow reader. Held when another reply keeps it company
        (:meth:`in_burst`). False when it was not sent: the caller uses ``send()``, which
        waits, or raises on a closed connection. Skips ``send()``'s context manager, which
        costs per frame about as much as the RPC core's work on a cheap call."""
        protocol = self.protocol
        if not self._direct or protocol.state is not State.OPEN or self.paused \
                or self.send_in_progress is not None:
            return False
        self.hold_writes = self.in_burst()
        try:
            if protocol.extensions or protocol.debug or protocol.expect_continuation_frame:
                protocol.send_text(frame)  # websockets builds it (or raises, as send() would)
            else:
                # The bytes protocol.send_text() would queue, built here: its Frame object and
                # serialize() cost about as much as the rest of the reply's way to the socket.
                protocol.writes.append(text_frame(frame))
            self.send_data()
        finally:
            self.end_hold()
        return True

    def in_burst(self) -> bool:
        """Whether the reply about to be sent has company: frames are held, or another
        request was received and waits to be read. A lone reply is sent without a hold."""
        return bool(self._held) or (self._received is not None and len(self._received) > 0)

    def send_data(self) -> None:
        # websockets calls this after every change to the protocol's output.
        for data in self.protocol.data_to_send():
            if data and self.hold_writes:
                self._held.append(data)
                self._held_bytes += len(data)
                continue
            self.flush_held()
            if data:
                self.transport.write(data)
            else:  # the end of the stream: websockets' own handling
                self._write_eof()
        if self._held_bytes >= HOLD_BYTES:
            self.flush_held()

    def end_hold(self) -> None:
        """End a hold: write what is held now when no request waits to be read (the reply to
        a lone request is not delayed), else in the event loop's next iteration, after the
        read loop has answered the requests already received."""
        self.hold_writes = False
        if not self._held:
            return
        if self._received is None or not len(self._received):
            self.flush_held()
        elif not self._flush_due:
            self._flush_due = True
            self.loop.call_soon(self._flush_callback)

    def flush_held(self) -> None:
        """Write the held frames now, in one write."""
        if not self._held:
            return
        held = self._held
        self._held = []
        self._held_bytes = 0
        if self.transport.is_closing():  # aborted meanwhile: nothing can be written
            return
        self.transport.write(held[0] if len(held) == 1 else b"".join(held))

    def _flush_callback(self) -> None:
        self._flush_due = False
        self.flush_held()

    def _write_eof(self) -> None:
        # As ServerConnection.send_data does: half-close when possible (no TLS), else close.
        if self.transport.can_write_eof():
            try:
                self.transport.write_eof()
            except Exception:  # write_eof() documents no exceptions; OSError is plausible
                pass
        else:
            self.transport.close()
