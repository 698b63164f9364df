"""JSON-RPC 2.0 without I/O: the method registry (params, bounds, OpenRPC) and the core that
turns one frame into one reply. Imports nothing of the transport, chat or methods."""

from __future__ import annotations

from gateway.rpc.batch import ReplyBudget, over_budget
from gateway.rpc.core import Call, CallContext, Notification, Reply, RpcCore
from gateway.rpc.quota import Quotas
from gateway.rpc.registry import (
    Bound,
    Handler,
    Method,
    OpenRpcDocument,
    Registry,
    bounded,
    parse_params,
)

__all__ = [
    "Bound",
    "Call",
    "CallContext",
    "Handler",
    "Method",
    "Notification",
    "OpenRpcDocument",
    "Quotas",
    "Reply",
    "Registry",
    "ReplyBudget",
    "RpcCore",
    "bounded",
    "over_budget",
    "parse_params",
]
