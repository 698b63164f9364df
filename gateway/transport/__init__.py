"""The socket side: the ``websockets`` server (handshake checks, read loops, shutdown), one
:class:`Connection` per client, and its outbox. Imports :mod:`gateway.rpc`, never the
method handlers or chat: the app passes it an :class:`~gateway.rpc.RpcCore`."""

from __future__ import annotations

from gateway.transport.connection import Connection
from gateway.transport.outbox import Outbox
from gateway.transport.server import GatewayServer
from gateway.transport.settings import ServerSettings

__all__ = ["Connection", "GatewayServer", "Outbox", "ServerSettings"]
